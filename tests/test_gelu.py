"""Bias + GELU and SwiGLU (lesson 05): the fused kernels against the fp32 references on
awkward shapes, the napkin math against what eager PyTorch dispatches, input checks."""

import pytest
import torch

import helpers
from helpers import intensity
from helpers.kernels import gelu as gk
from helpers.launches import trace
from support import assert_close

# Very negative inputs overflow exp(-2u) to inf on purpose (GELU is then -0); in CPU mode
# numpy, which runs the interpreted kernel, warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DEV = helpers.device()
DTYPES = list(gk.TOLERANCES)

# (M, N): a single element; odd widths (the bias index wraps mid-block); a power of two;
# wider than v2's tile (MAX_BLOCK_N) and not a multiple of it; more elements than a block.
SHAPES = [(1, 1), (3, 7), (5, 1000), (8, 1024), (2, gk.MAX_BLOCK_N + 3), (3, 2 * gk.BLOCK_SIZE + 5)]


def _randn(shape, dtype, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(dtype).to(DEV)


def _close(got, want, dtype, what):
    assert_close(got, want, *gk.TOLERANCES[dtype], what,
                 "Wrong columns only: the bias index; the tail only: the mask.")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [gk.bias_gelu, gk.bias_gelu_v2], ids=["v1", "v2"])
def test_bias_gelu_matches_reference(fn, shape, dtype):
    x, bias = _randn(shape, dtype, 0), _randn(shape[-1:], dtype, 1)
    _close(fn(x, bias), gk.bias_gelu_reference(x, bias), dtype, f"{fn.__name__} {shape}")


@pytest.mark.parametrize("block_size,num_warps", [(128, 1), (1024, 4), (8192, 8)])
def test_bias_gelu_other_launch_configs(block_size, num_warps):
    x, bias = _randn((6, 1500), torch.float32, 2), _randn((1500,), torch.float32, 3)
    want = gk.bias_gelu_reference(x, bias)
    for fn in (gk.bias_gelu, gk.bias_gelu_v2):
        _close(fn(x, bias, block_size, num_warps), want, torch.float32,
                     f"{fn.__name__} block {block_size}")


def test_bias_gelu_on_three_dimensional_activations():
    x, bias = _randn((2, 3, 40), torch.float16, 4), _randn((40,), torch.float16, 5)
    for fn in (gk.bias_gelu, gk.bias_gelu_v2):
        _close(fn(x, bias), gk.bias_gelu_reference(x, bias), torch.float16, "2x3x40")


def test_gelu_tails_are_exact_enough():
    # Very negative inputs: exp(-2u) overflows to inf and GELU must return -0, not nan;
    # very positive ones: GELU(t) = t.
    x = torch.tensor([[-60.0, -10.0, 0.0, 10.0, 60.0]], device=DEV)
    y = gk.bias_gelu(x, torch.zeros(5, device=DEV))
    assert torch.isfinite(y).all()
    assert torch.allclose(y, gk.bias_gelu_reference(x, torch.zeros(5, device=DEV)), atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 1000), (3, 2 * gk.BLOCK_SIZE + 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_reference(shape, dtype):
    gate, up = _randn(shape, dtype, 6), _randn(shape, dtype, 7, scale=1.0)
    _close(gk.swiglu(gate, up), gk.swiglu_reference(gate, up), dtype, f"swiglu {shape}")


def test_eager_versions_compute_the_same_functions():
    x, bias = _randn((4, 64), torch.float32, 8), _randn((64,), torch.float32, 9)
    assert torch.allclose(gk.bias_gelu_eager(x, bias), gk.bias_gelu_reference(x, bias), atol=1e-6)
    assert torch.allclose(gk.swiglu_eager(x, bias.expand(4, 64)),
                          gk.swiglu_reference(x, bias.expand(4, 64)), atol=1e-6)


def test_launchers_reject_bad_inputs():
    x = torch.zeros(4, 8, device=DEV)
    with pytest.raises(ValueError, match="one entry per column"):
        gk.bias_gelu(x, torch.zeros(7, device=DEV))
    with pytest.raises(TypeError, match="dtype"):
        gk.bias_gelu(x, torch.zeros(8, device=DEV, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        gk.bias_gelu_v2(torch.zeros(8, 4, device=DEV).t(), torch.zeros(8, device=DEV))
    with pytest.raises(ValueError, match="same shape"):
        gk.swiglu(x, torch.zeros(4, 9, device=DEV))
    with pytest.raises(ValueError, match="power of two"):
        gk.swiglu(x, x, block_size=1000)


def test_napkin_math_matches_the_trace():
    m, n = 6, 10
    x, bias = torch.randn(m, n, dtype=torch.bfloat16), torch.randn(n, dtype=torch.bfloat16)
    traced = trace(gk.bias_gelu_eager, x, bias)
    assert [k.op for k in traced] == ["aten.add", "aten.gelu"]
    assert traced.bytes == intensity.bias_gelu(m, n, torch.bfloat16, "unfused").nbytes
    traced = trace(gk.swiglu_eager, x, x)
    assert [k.op for k in traced] == ["aten.silu", "aten.mul"]
    assert traced.bytes == intensity.swiglu(m, n, torch.bfloat16, "unfused").nbytes
    # Fusion halves bias + GELU's traffic and cuts SwiGLU's from 5MN to 3MN.
    big = (4096, 16384, torch.bfloat16)
    ratio = (intensity.bias_gelu(*big, "unfused").nbytes
             / intensity.bias_gelu(*big, "fused").nbytes)
    assert 1.99 < ratio < 2
    assert (intensity.swiglu(*big, "unfused").nbytes * 3
            == intensity.swiglu(*big, "fused").nbytes * 5)
    assert intensity.bias_gelu(m, n).flops == 9 * m * n
    with pytest.raises(ValueError):
        intensity.bias_gelu(m, n, torch.bfloat16, "gelu")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 16384), (4097, 1000), (33, 4100)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_kernels_on_large_shapes(shape, dtype):
    x, bias = _randn(shape, dtype, 10), _randn(shape[-1:], dtype, 11)
    want = gk.bias_gelu_reference(x, bias)
    _close(gk.bias_gelu(x, bias), want, dtype, f"bias_gelu {shape} compiled")
    _close(gk.bias_gelu_v2(x, bias), want, dtype, f"bias_gelu_v2 {shape} compiled")
    up = _randn(shape, dtype, 12, scale=1.0)
    _close(gk.swiglu(x, up), gk.swiglu_reference(x, up), dtype, f"swiglu {shape} compiled")
