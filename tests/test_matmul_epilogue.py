"""helpers.kernels.matmul.epilogue: ``act(A @ B)`` in one kernel against the spec, with and
without the activation, on shapes that are no multiple of any tile, on transposed and
sliced inputs, and the launcher's checks.

CPU mode runs the kernel in Triton's interpreter on tiny shapes and small tiles; on a GPU
machine the same tests run compiled, plus the `gpu` test at the default configuration:
`bash tests/gpu/device.sh pytest tests/test_matmul_epilogue.py`.
"""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch

from helpers.kernels.matmul import epilogue as me
from helpers.kernels.matmul.config import TileConfig
from helpers.runtime import InterpreterLimitationError
from support import assert_close

DTYPES = [torch.float16, torch.bfloat16, torch.float32] if helpers.is_gpu() else \
    [torch.float16, torch.float32]
# Small tiles: even tiny shapes span several programs.
SMALL = TileConfig(16, 32, 16, group_m=2, num_stages=1, num_warps=4)
# (M, N, K): powers of two, primes, one row, K shorter than a block, several K blocks.
SHAPES = [(16, 32, 16), (33, 17, 45), (1, 50, 7), (47, 65, 100)]


def _inputs(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).to(helpers.device())
    b = torch.randn(K, N, generator=g).to(dtype).to(helpers.device())
    return a, b


def _check(got, a, b, activation, what):
    assert_close(got, me.reference(a, b, activation), *me.TOLERANCES[a.dtype], what,
                 "Right where C >= 0 and wrong below points at the activation's negative "
                 "branch; wrong in the last rows or columns, at the M/N masks.")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("activation", me.ACTIVATIONS)
def test_fused_kernel_matches_reference(activation, shape, dtype):
    a, b = _inputs(*shape, dtype)
    _check(me.matmul_act(a, b, activation, config=SMALL), a, b, activation,
           f"matmul_act {activation} {shape} {dtype}")


def test_the_activation_really_runs_and_none_is_the_plain_product():
    a, b = _inputs(33, 40, 24, torch.float16, seed=1)
    plain = me.matmul_act(a, b, "none", config=SMALL)
    fused = me.matmul_act(a, b, "leaky_relu", config=SMALL)
    assert (plain < 0).any(), "randn inputs give negative products"
    neg = plain < 0
    assert torch.equal(fused[~neg], plain[~neg]), "leaky_relu leaves C >= 0 alone"
    assert torch.allclose(fused[neg].float(), 0.01 * plain[neg].float(), rtol=1e-2, atol=1e-4)


def test_unfused_version_is_the_same_op():
    a, b = _inputs(20, 24, 16, torch.float32, seed=2)
    _check(me.unfused(a, b), a, b, "leaky_relu", "unfused (torch.matmul then F.leaky_relu)")
    two_kernels = me.unfused(a, b, lambda x, y: me.matmul_act(x, y, "none", config=SMALL))
    _check(two_kernels, a, b, "leaky_relu", "unfused with the Triton product")


def test_views_work_without_a_copy():
    g = torch.Generator().manual_seed(3)
    at = torch.randn(45, 37, generator=g).half().to(helpers.device())     # A = at.T
    wide = torch.randn(45, 2 * 29, generator=g).half().to(helpers.device())
    a, b = at.t(), wide[:, ::2]
    _check(me.matmul_act(a, b, config=SMALL), a, b, "leaky_relu", "transposed A, strided B")


def test_default_config_and_out_argument():
    a, b = _inputs(40, 48, 32, torch.float16, seed=4)
    out = torch.empty(40, 48, device=helpers.device(), dtype=torch.float16)
    got = me.matmul_act(a, b, out=out)            # CPU_CONFIG here, CONFIG on a GPU
    assert got is out
    _check(got, a, b, "leaky_relu", "default config")


def test_empty_shapes():
    a, b = _inputs(5, 6, 0, torch.float16)
    assert torch.equal(me.matmul_act(a, b, config=SMALL), torch.zeros(5, 6, dtype=a.dtype,
                                                                       device=a.device))
    a, b = _inputs(0, 6, 4, torch.float16)
    assert me.matmul_act(a, b, config=SMALL).shape == (0, 6)


@pytest.mark.parametrize("bad, error, words", [
    (dict(activation="gelu"), ValueError, "activation must be one of"),
    # A tuple's order (were warps before stages?) is what TileConfig exists to end.
    (dict(config=(16, 32, 16, 2, 1, 4)), TypeError, "write TileConfig"),
    (dict(config={"BLOCK_M": 16, "BLOCK_N": 32}), ValueError, "lacks BLOCK_K"),
    (dict(config=SMALL.with_options(FLATTEN=True)), ValueError, "no kernel options"),
    (dict(config=TileConfig(16, 32, 16, split_k=2, num_stages=1, num_warps=4)), ValueError,
     "no split of K"),
])
def test_launcher_refuses_bad_arguments(bad, error, words):
    a, b = _inputs(8, 8, 8, torch.float16)
    with pytest.raises(error, match=words):
        me.matmul_act(a, b, **bad)


def test_launcher_refuses_mismatched_inputs():
    a, b = _inputs(8, 8, 8, torch.float16)
    with pytest.raises(TypeError, match="convert one"):
        me.matmul_act(a, b.float())
    with pytest.raises(ValueError, match="inner sizes differ"):
        me.matmul_act(a, b[:4])
    with pytest.raises(ValueError, match="activation must be one of"):
        me.reference(a, b, "relu6")


@pytest.mark.skipif(helpers.is_gpu(), reason="the interpreter's limitation only")
def test_bf16_is_refused_in_the_interpreter():
    a, b = _inputs(8, 8, 8, torch.bfloat16)
    with pytest.raises(InterpreterLimitationError):
        me.matmul_act(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_default_config_compiled_on_a_large_odd_shape(dtype):
    a, b = _inputs(1000, 1500, 700, dtype, seed=5)
    for activation in me.ACTIVATIONS:
        _check(me.matmul_act(a, b, activation), a, b, activation, f"{activation} {dtype}")
