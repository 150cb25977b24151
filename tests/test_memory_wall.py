"""Lesson 01's kernels against their PyTorch references, their napkin math, their
input checks, and the committed reference record the notebook draws from.

CPU mode runs the kernels in Triton's interpreter on small shapes; the ``gpu`` tests
run them compiled, on shapes far larger than a block.
"""

import pytest
import torch

import helpers
from helpers import intensity
from helpers.kernels import memory_wall as mw
from support import assert_close, committed_record

DEV = helpers.device()

# (dtype, atol, rtol): the kernels compute in fp32 and round once to the storage type,
# so they may differ from the reference by one unit in the last place of that type.
TOLERANCES = [
    (torch.float32, 1e-6, 1e-5),
    (torch.float16, 1e-3, 2e-3),
    (torch.bfloat16, 1e-2, 1.6e-2),
]
# 1: a single element; 1024: a power of two below a block; 1000: odd;
# BLOCK_SIZE + 1 and 3 * BLOCK_SIZE + 5: larger than one block, with a ragged last block.
SIZES = [1, 1000, 1024, mw.BLOCK_SIZE + 1, 3 * mw.BLOCK_SIZE + 5]


def _close(got, want, atol, rtol, what):
    assert_close(got, want, atol, rtol, what,
                 "Check the mask of the last block and the fp32 arithmetic.")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [t[0] for t in TOLERANCES])
def test_copy_is_exact(n, dtype):
    x = torch.randn(n, device=DEV).to(dtype)
    y = mw.copy(x)
    assert torch.equal(y, mw.copy_reference(x)), "a copy must reproduce every bit of x"


@pytest.mark.parametrize("block_size,num_warps", [(128, 1), (1024, 4), (8192, 8)])
def test_copy_other_launch_configs(block_size, num_warps):
    x = torch.randn(3 * 1024 + 7, device=DEV)
    assert torch.equal(mw.copy(x, block_size, num_warps), x)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
def test_gelu_matches_reference(n, dtype, atol, rtol):
    x = (3 * torch.randn(n, device=DEV)).to(dtype)
    _close(mw.gelu(x), mw.gelu_reference(x), atol, rtol, f"gelu n={n} {dtype}")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_gelu_saturates_without_nan():
    # exp(-2u) overflows to inf for very negative x: x / inf must give -0, not NaN.
    x = torch.tensor([-1e4, -80.0, -10.0, 0.0, 10.0, 80.0, 1e4], device=DEV)
    y = mw.gelu(x)
    assert not torch.isnan(y).any(), f"gelu produced NaN on extreme inputs: {y}"
    _close(y, mw.gelu_reference(x), 1e-6, 1e-5, "gelu on extreme inputs")


@pytest.mark.parametrize("shape", [(1, 1), (64, 128), (37, 1000), (5, 4096), (3, 4097),
                                   (2, 10000)])
@pytest.mark.parametrize("dtype", [t[0] for t in TOLERANCES])
def test_row_sum_matches_reference(shape, dtype):
    x = torch.randn(shape, device=DEV).to(dtype)
    want = x.double().sum(dim=1)
    got = mw.row_sum(x)
    assert got.dtype == torch.float32 and got.shape == (shape[0],)
    # fp32 accumulation of `cols` terms of size ~1: error grows like sqrt(cols) * eps
    tol = 1e-5 * shape[1] ** 0.5 + 1e-6
    err = (got.double() - want).abs().max().item()
    assert err <= tol, f"row_sum {shape} {dtype}: max error {err:.3g} > {tol:.3g}"


def test_row_sum_small_block_walks_the_row():
    x = torch.randn(4, 1000, device=DEV)
    _close(mw.row_sum(x, block_size=64), mw.row_sum_reference(x), 1e-4, 1e-5,
           "row_sum with 16 blocks per row")


def test_row_sum_strided_rows():
    big = torch.randn(8, 1000, device=DEV)
    x = big[:, :333]  # rows are contiguous, but 1000 apart
    _close(mw.row_sum(x), mw.row_sum_reference(x), 1e-4, 1e-5, "row_sum on a column slice")


@pytest.mark.parametrize("shape", [(1, 1), (4, 1000), (3, mw.BLOCK_SIZE + 1), (2, 3, 50)])
@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
def test_bias_gelu_fused_and_unfused(shape, dtype, atol, rtol):
    x = (2 * torch.randn(shape, device=DEV)).to(dtype)
    bias = torch.randn(shape[-1], device=DEV).to(dtype)
    _close(mw.bias_add(x, bias), mw.bias_add_reference(x, bias), atol, rtol, "bias_add")
    want = mw.bias_gelu_reference(x, bias)
    _close(mw.bias_gelu_fused(x, bias), want, atol, rtol, f"bias_gelu_fused {shape} {dtype}")
    # The unfused version rounds x + bias to the storage type before the GELU, as
    # PyTorch's two-kernel version does; in fp32 the two agree to rounding.
    two_step = mw.gelu_reference(mw.bias_add_reference(x, bias))
    _close(mw.bias_gelu_unfused(x, bias), two_step, atol, rtol, "bias_gelu_unfused")


def test_outputs_into_given_buffers():
    x = torch.randn(100, device=DEV)
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    assert mw.copy(x, out=out) is out and torch.equal(out, x)
    out.fill_(float("nan"))
    mw.gelu(x, out=out)
    assert not torch.isnan(out).any()


def test_empty_tensors():
    assert mw.copy(torch.empty(0, device=DEV)).numel() == 0
    assert mw.gelu(torch.empty(0, device=DEV)).numel() == 0
    assert mw.row_sum(torch.empty(0, 5, device=DEV)).shape == (0,)
    assert torch.equal(mw.row_sum(torch.empty(3, 0, device=DEV)), torch.zeros(3, device=DEV))


# -- bad inputs get clear errors --------------------------------------------------------


def test_rejects_integer_tensors():
    with pytest.raises(TypeError, match="dtype int32"):
        mw.copy(torch.arange(10, dtype=torch.int32, device=DEV))


def test_rejects_wrong_device():
    with pytest.raises(ValueError, match="kernels run on"):
        mw.gelu(torch.empty(4, device="meta"))


def test_rejects_non_contiguous():
    x = torch.randn(8, 8, device=DEV).t()
    with pytest.raises(ValueError, match="not contiguous"):
        mw.copy(x)
    with pytest.raises(ValueError, match="stride"):
        mw.row_sum(x)


@pytest.mark.parametrize("block_size", [0, 100, -64])
def test_rejects_bad_block_size(block_size):
    with pytest.raises(ValueError, match="power of two"):
        mw.copy(torch.randn(10, device=DEV), block_size=block_size)


def test_rejects_bad_num_warps():
    with pytest.raises(ValueError, match="num_warps"):
        mw.gelu(torch.randn(10, device=DEV), num_warps=3)


def test_rejects_mismatched_bias_and_out():
    x = torch.randn(4, 10, device=DEV)
    with pytest.raises(ValueError, match="one entry per column"):
        mw.bias_gelu_fused(x, torch.randn(9, device=DEV))
    with pytest.raises(TypeError, match="bias has dtype"):
        mw.bias_add(x, torch.randn(10, device=DEV).half())
    with pytest.raises(ValueError, match="same shape"):
        mw.copy(x, out=torch.empty(40, device=DEV))
    with pytest.raises(ValueError, match="2 dimension"):
        mw.row_sum(torch.randn(10, device=DEV))


# -- napkin math --------------------------------------------------------------------------


def test_bytes_moved_by_hand():
    assert intensity.copy(1000, torch.float16).nbytes == 4000          # read 2 kB, write 2 kB
    assert intensity.gelu(100, torch.float32).nbytes == 800
    assert intensity.row_sum(3, 5, torch.float32).nbytes == 3 * 5 * 4 + 3 * 4
    assert intensity.bias_gelu(2, 5, torch.float32).nbytes == 2 * 10 * 4 + 5 * 4
    assert intensity.bias_gelu(2, 5, torch.float32, "unfused").nbytes == 4 * 10 * 4 + 5 * 4
    assert intensity.copy(7).flops == 0
    assert intensity.gelu(7).flops == 7 * intensity.GELU_FLOPS_PER_ELEMENT
    assert intensity.bias_gelu(2, 5).flops == intensity.bias_gelu(2, 5, version="unfused").flops


def test_fusion_saves_one_round_trip():
    shape = (1024, 512)
    saved = (intensity.bias_gelu(*shape, torch.float16, "unfused").nbytes
             - intensity.bias_gelu(*shape, torch.float16, "fused").nbytes)
    assert saved == 2 * 1024 * 512 * 2, "fusing saves exactly the write and re-read of x + bias"


def test_napkin_math_takes_torch_dtypes_and_keys_alike():
    assert intensity.copy(999, torch.bfloat16).nbytes == intensity.copy(999, "bf16").nbytes
    work = intensity.row_sum(31, 77, "fp32")
    assert intensity.row_sum(31, 77, torch.float32) == work


def test_unknown_version():
    with pytest.raises(ValueError, match="unknown version"):
        intensity.bias_gelu(4, 4, torch.float32, "transposed")


# -- the committed record the notebook shows in CPU mode ------------------------------------


def test_reference_record_is_complete():
    rec = committed_record("memory_wall")
    res = rec.results
    for key in ("ops", "arithmetic_sweep", "copy_configs", "size_sweep", "utilization",
                "fusion", "device"):
        assert key in res, f"the memory_wall record lacks {key!r}: re-record it"
    assert [op["op"] for op in res["ops"]] == ["copy", "gelu", "row_sum", "matmul"]
    assert len(res["size_sweep"]) >= 10
    assert rec.provenance["gpu"] and rec.provenance["date"]


def test_recorded_copy_reaches_85_percent_of_peak():
    """The lesson's target: a Triton copy at >= 85% of the datasheet bandwidth."""
    rec = committed_record("memory_wall")
    peak = rec.results["table"]["hbm_bandwidth_gbs"]
    copy = rec.results["ops"][0]["comparison"]
    row = next(r for r in copy["rows"] if r["name"].startswith("Triton"))
    gbps = row["bytes"] / (row["ms"] * 1e-3) / 1e9
    assert gbps >= 0.85 * peak, (f"recorded Triton copy: {gbps:.0f} GB/s = "
                                 f"{100 * gbps / peak:.1f}% of {peak:.0f} GB/s")


# -- compiled, on large shapes (GPU machine) ------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
def test_all_kernels_compiled_large(dtype, atol, rtol):
    n = 2**24 + 3
    x = torch.randn(n, device=DEV).to(dtype)
    assert torch.equal(mw.copy(x), x)
    _close(mw.gelu(x), mw.gelu_reference(x), atol, rtol, "gelu, large")
    _close(mw.fma_chain(x, 100), mw.fma_chain_reference(x, 100), max(atol, 1e-5),
           max(rtol, 1e-5), "fma_chain, large")
    m = torch.randn(4099, 4097, device=DEV).to(dtype)
    err = (mw.row_sum(m).double() - m.double().sum(1)).abs().max().item()
    assert err < 1e-5 * 4097**0.5 + 1e-6, f"row_sum large: {err:.3g}"
    b = torch.randn(4097, device=DEV).to(dtype)
    _close(mw.bias_gelu_fused(m, b), mw.bias_gelu_reference(m, b), atol, rtol, "fused, large")
    _close(mw.bias_gelu_unfused(m, b), mw.gelu_reference(mw.bias_add_reference(m, b)),
           atol, rtol, "unfused, large")


@pytest.mark.parametrize("iters", [0, 1, 7, 64])
@pytest.mark.parametrize("n", [1, 1000, mw.BLOCK_SIZE + 1])
def test_fma_chain_matches_reference(iters, n):
    x = torch.randn(n, device=DEV)
    # the kernel fuses each multiply-add (one rounding), the reference rounds twice
    _close(mw.fma_chain(x, iters), mw.fma_chain_reference(x, iters), 1e-5, 1e-5,
           f"fma_chain iters={iters}")


def test_fma_chain_napkin_math_and_errors():
    assert intensity.fma_chain(10, 3).flops == 60
    assert intensity.fma_chain(10, 3, torch.float16).nbytes == 40
    with pytest.raises(ValueError, match="iters"):
        mw.fma_chain(torch.randn(4, device=DEV), -1)
