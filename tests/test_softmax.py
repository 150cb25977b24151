"""Row softmax (lesson 05): every version against the fp32 reference, the napkin math
against what eager PyTorch really dispatches, the launchers' input checks.

CPU mode runs the kernels in Triton's interpreter on small shapes; the ``gpu`` tests run
them compiled on shapes far larger than a block.
"""

import pytest
import torch

import helpers
from helpers import intensity
from helpers.kernels import softmax as sk
from helpers.launches import trace
from support import assert_close

DEV = helpers.device()
DTYPES = list(sk.TOLERANCES)

# (M, N): one element; a few odd lengths; a power of two; just past a power of two (the
# block is twice the row, half of it masked).
SHAPES = [(1, 1), (3, 17), (5, 1000), (4, 1024), (2, 1025)]


def _inputs(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(dtype).to(DEV)


HINT = ("A whole row off means the max or the sum included masked lanes (load them as "
        "-inf); only the last elements off means the mask or the block size is wrong.")


def _close(got, want, dtype, what):
    assert_close(got, want, *sk.TOLERANCES[dtype], what, HINT)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_in_registers_matches_reference(shape, dtype):
    x = _inputs(shape, dtype)
    _close(sk.softmax_v1(x), sk.softmax_reference(x), dtype, f"softmax_v1 {shape}")


@pytest.mark.parametrize("shape", SHAPES + [(3, 700)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_online_matches_reference_across_blocks(shape, dtype):
    # A block of 128 makes every row but the shortest span several blocks, the last ragged.
    x = _inputs(shape, dtype, seed=1)
    _close(sk.softmax_online(x, block_size=128), sk.softmax_reference(x), dtype,
                 f"softmax_online {shape}, block 128")


@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_is_the_same_function(dtype):
    # The unfused version computes in the storage dtype: looser, but the same softmax.
    x = _inputs((4, 300), dtype, seed=2)
    got, want = sk.naive_softmax(x).float(), sk.softmax_reference(x).float()
    assert (got - want).abs().max().item() < 4 * sk.TOLERANCES[dtype][1]


def test_rows_sum_to_one_and_large_inputs_do_not_overflow():
    # Without subtracting the max, exp(1000) overflows to inf and the row becomes nan.
    x = (1000 + _inputs((3, 500), torch.float32)).contiguous()
    for y in (sk.softmax_v1(x), sk.softmax_online(x, block_size=64)):
        assert torch.isfinite(y).all(), "softmax overflowed: subtract the row max before exp"
        assert torch.allclose(y.sum(dim=1), torch.ones(3, device=DEV), atol=1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on -inf - -inf
@pytest.mark.parametrize("fn", [sk.softmax_v1, lambda x: sk.softmax_online(x, block_size=16)],
                         ids=["v1", "online"])
def test_minus_infinity_is_masked_out_like_torch(fn):
    # Attention masks put -inf in the scores: those entries get probability 0, and a row
    # that is all -inf is nan, as in torch.softmax.
    x = _inputs((4, 40), torch.float32)
    x[0, :25] = float("-inf")          # the first block(s) of row 0 entirely masked
    x[1, ::3] = float("-inf")
    x[3, :] = float("-inf")
    got, want = fn(x), torch.softmax(x, dim=-1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.allclose(got[ok], want[ok], atol=1e-7, rtol=1e-5)


def test_kernel_writes_only_its_row_and_respects_strides():
    # Rows of 1000 inside a 3 x 1024 buffer: the kernel must read and write the first
    # 1000 of each row (row stride 1024) and leave the 24 padding columns alone.
    x = _inputs((3, 1024), torch.float32)
    y = torch.full((3, 1024), -7.0, device=DEV)
    sk.softmax_kernel_v1[(3,)](x, y, 1000, x.stride(0), y.stride(0), BLOCK_SIZE=1024)
    assert torch.allclose(y[:, :1000], torch.softmax(x[:, :1000], dim=-1), atol=1e-7, rtol=1e-5)
    assert bool((y[:, 1000:] == -7.0).all()), "the kernel wrote past the end of a row"


def test_softmax_dispatches_on_row_length(monkeypatch):
    calls = []
    monkeypatch.setattr(sk, "softmax_v1", lambda x: calls.append("v1") or sk.softmax_reference(x))
    monkeypatch.setattr(sk, "softmax_online",
                        lambda x: calls.append("online") or sk.softmax_reference(x))
    sk.softmax(torch.zeros(2, sk.MAX_FUSED_BLOCK, device=DEV))
    sk.softmax(torch.zeros(1, sk.MAX_FUSED_BLOCK + 1, device=DEV))
    assert calls == ["v1", "online"]


def test_higher_dimensional_input_is_softmaxed_over_the_last_dimension():
    x = _inputs((2, 3, 50), torch.float16, seed=3)
    _close(sk.softmax(x), sk.softmax_reference(x), torch.float16, "softmax 2x3x50")


@pytest.mark.parametrize("bad,error", [
    (lambda: torch.zeros(3, 4, dtype=torch.int32), TypeError),
    (lambda: torch.zeros(4, 3).t(), ValueError),
    (lambda: torch.zeros(3, 0), ValueError),
])
def test_launcher_rejects_bad_inputs(bad, error):
    with pytest.raises(error):
        sk.softmax_v1(bad().to(DEV))


def test_launcher_rejects_bad_launch_parameters():
    x = torch.zeros(2, 8, device=DEV)
    with pytest.raises(ValueError, match="power of two"):
        sk.softmax_online(x, block_size=100)
    with pytest.raises(ValueError, match="power of two"):
        sk.softmax_v1(x, num_warps=3)


def test_napkin_math_matches_the_triton_tutorial_and_the_trace():
    m, n = 6, 10
    # read 5MN + 2M, write 3MN + 2M elements: 8MN + 4M, at 1 byte each in fp8
    assert intensity.softmax(m, n, "fp8", "naive").nbytes == 8 * m * n + 4 * m
    x = torch.randn(m, n, dtype=torch.float16)
    traced = trace(sk.naive_softmax, x)
    assert len(traced) == 5, f"naive softmax should be 5 kernels, traced {traced}"
    assert traced.bytes == intensity.softmax(m, n, torch.float16, "naive").nbytes
    # The fused count is the course's compulsory traffic for a softmax.
    assert intensity.softmax(m, n, torch.float16).nbytes == 2 * m * n * 2
    assert intensity.softmax(m, n, "fp16", "online").flops == intensity.softmax(m, n, "fp16").flops
    # Fusion's predicted gain for a large matrix approaches (8MN + 4M) / 2MN = 4.
    ratio = (intensity.softmax(4096, 4096, torch.float16, "naive").nbytes
             / intensity.softmax(4096, 4096, torch.float16, "fused").nbytes)
    assert 4.0 < ratio < 4.01
    with pytest.raises(ValueError, match="unknown version"):
        intensity.softmax(m, n, torch.float16, "fast")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 4097, 16384, 32768])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_kernels_on_large_shapes(n, dtype):
    x = _inputs((4096, n), dtype, seed=n)
    want = sk.softmax_reference(x)
    _close(sk.softmax_v1(x), want, dtype, f"softmax_v1 4096x{n} compiled")
    _close(sk.softmax_online(x), want, dtype, f"softmax_online 4096x{n} compiled")


@pytest.mark.gpu
def test_online_kernel_on_rows_longer_than_any_block():
    x = _inputs((8, 2**20 + 3), torch.bfloat16, seed=9)
    _close(sk.softmax(x), sk.softmax_reference(x), torch.bfloat16, "softmax 8x(2^20+3)")
