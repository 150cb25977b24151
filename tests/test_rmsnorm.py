"""Residual add + RMSNorm (lesson 05 and its assignment): the fused kernel against the
fp32 reference on awkward shapes, the eager version's nine kernels counted, input checks."""

import pytest
import torch

import helpers
from helpers import intensity
from helpers.kernels import rmsnorm as rk
from helpers.launches import trace
from support import assert_close

DEV = helpers.device()
DTYPES = list(rk.TOLERANCES)
SHAPES = [(1, 1), (3, 7), (5, 1000), (4, 1024), (2, 4097)]


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(shape, generator=g) for _ in range(2))
    w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
    return tuple(t.to(dtype).to(DEV) for t in (2 * x, r, w))


def _close(got, want, dtype, what):
    assert_close(got, want, *rk.TOLERANCES[dtype], what,
                 "Whole rows off: the mean must divide by N, not BLOCK_SIZE, and masked lanes "
                 "must load 0.")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_matches_reference(shape, dtype):
    x, r, w = _inputs(shape, dtype)
    h, y = rk.residual_rmsnorm(x, r, w)
    h_ref, y_ref = rk.residual_rmsnorm_reference(x, r, w)
    _close(h, h_ref, dtype, f"h {shape}")
    _close(y, y_ref, dtype, f"y {shape}")


def test_h_is_exact_where_rounding_is_exact():
    # fp32 and fp16 round the same way in the interpreter and on the GPU: h must be bitwise
    # the rounded sum.
    for dtype in (torch.float32, torch.float16):
        x, r, w = _inputs((3, 300), dtype, seed=1)
        assert torch.equal(rk.residual_rmsnorm(x, r, w)[0],
                           rk.residual_rmsnorm_reference(x, r, w)[0])


@pytest.mark.parametrize("num_warps", [1, 4, 16])
def test_launch_configurations(num_warps):
    x, r, w = _inputs((3, 2000), torch.float32, seed=2)
    h, y = rk.residual_rmsnorm(x, r, w, num_warps=num_warps)
    _close(y, rk.residual_rmsnorm_reference(x, r, w)[1], torch.float32, f"{num_warps} warps")


def test_eps_and_scale():
    # A zero row normalises to 0 (not nan), thanks to eps; scaling a row does not change y.
    x = torch.zeros(2, 64, device=DEV)
    x[1] = torch.arange(64, device=DEV, dtype=torch.float32)
    w = torch.ones(64, device=DEV)
    _, y = rk.residual_rmsnorm(x, torch.zeros_like(x), w)
    assert torch.equal(y[0], torch.zeros(64, device=DEV))
    _, y10 = rk.residual_rmsnorm(10 * x, torch.zeros_like(x), w)
    assert torch.allclose(y10[1], y[1], rtol=1e-5)


def test_inputs_are_not_modified():
    x, r, w = _inputs((3, 100), torch.float16, seed=3)
    copies = [t.clone() for t in (x, r, w)]
    rk.residual_rmsnorm(x, r, w)
    assert all(torch.equal(a, b) for a, b in zip((x, r, w), copies))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_and_torch_versions_compute_the_same_function(dtype):
    x, r, w = _inputs((4, 256), dtype, seed=4)
    h_ref, y_ref = rk.residual_rmsnorm_reference(x, r, w)
    for fn in (rk.residual_rmsnorm_eager, rk.residual_rmsnorm_torch):
        h, y = fn(x, r, w)
        assert torch.equal(h, h_ref)
        # The eager chain rounds in between (h.to(dtype) before the weight): a few ulps more.
        atol, rtol = rk.TOLERANCES[dtype]
        assert ((y.float() - y_ref.float()).abs() <= 2 * (atol + rtol * y_ref.float().abs())).all()


def test_launcher_rejects_bad_inputs():
    x = torch.zeros(4, 8, device=DEV)
    with pytest.raises(ValueError, match="same shape"):
        rk.residual_rmsnorm(x, torch.zeros(4, 9, device=DEV), torch.ones(8, device=DEV))
    with pytest.raises(ValueError, match="one entry per column"):
        rk.residual_rmsnorm(x, x, torch.ones(9, device=DEV))
    with pytest.raises(TypeError, match="dtype"):
        rk.residual_rmsnorm(x, x.half(), torch.ones(8, device=DEV))
    with pytest.raises(ValueError, match="registers"):
        big = torch.zeros(1, rk.MAX_COLS + 1, device=DEV)
        rk.residual_rmsnorm(big, big, torch.ones(rk.MAX_COLS + 1, device=DEV))


@pytest.mark.parametrize("dtype,kernels", [(torch.bfloat16, 9), (torch.float16, 9),
                                           (torch.float32, 7)])
def test_eager_napkin_math_matches_the_trace(dtype, kernels):
    m, n = 6, 8
    x, r, w = _inputs((m, n), dtype, seed=5)
    traced = trace(rk.residual_rmsnorm_eager, x.cpu(), r.cpu(), w.cpu())
    assert len(traced) == kernels == len(intensity.residual_rmsnorm_eager_kernels(m, n, dtype)), traced
    assert [k.read for k in traced] == [k[1] for k in intensity.residual_rmsnorm_eager_kernels(m, n, dtype)]
    assert [k.written for k in traced] == [k[2] for k in intensity.residual_rmsnorm_eager_kernels(m, n, dtype)]
    assert traced.bytes == intensity.residual_rmsnorm(m, n, dtype, "eager").nbytes


def test_fused_bytes_and_predicted_speedups():
    m, n, bf16 = 4096, 8192, torch.bfloat16
    assert intensity.residual_rmsnorm(m, n, bf16, "fused").nbytes == 4 * m * n * 2 + n * 2
    assert intensity.residual_rmsnorm(m, n, bf16, "torch").nbytes == 5 * m * n * 2 + n * 2
    # bf16 eager: 42 bytes per element against 8 fused.
    ratio = intensity.residual_rmsnorm(m, n, bf16, "eager").nbytes / intensity.residual_rmsnorm(m, n, bf16, "fused").nbytes
    assert 5.2 < ratio < 5.26
    with pytest.raises(ValueError):
        intensity.residual_rmsnorm(m, n, bf16, "unfused").nbytes


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 8192), (4097, 1000), (7, 65536), (3, 12289)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_kernel_on_large_shapes(shape, dtype):
    x, r, w = _inputs(shape, dtype, seed=6)
    h, y = rk.residual_rmsnorm(x, r, w)
    h_ref, y_ref = rk.residual_rmsnorm_reference(x, r, w)
    _close(h, h_ref, dtype, f"h {shape} compiled")
    _close(y, y_ref, dtype, f"y {shape} compiled")


@pytest.mark.gpu
def test_torch_rms_norm_is_one_fused_kernel_on_the_gpu():
    x, r, w = _inputs((64, 512), torch.bfloat16, seed=7)
    ops = [k.op for k in trace(rk.residual_rmsnorm_torch, x, r, w)]
    assert ops[0] == "aten.add" and len(ops) == 2, ops
