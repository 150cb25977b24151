"""The first kernel against its reference, on sizes that catch missing masks."""

import pytest
import torch

import helpers
from helpers import intensity
from helpers.kernels.first_kernel import scale_shift, scale_shift_reference

TOLERANCES = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("n", [1, 3, 127, 128, 129, 1000, 4099])
def test_matches_reference(n, dtype):
    x = torch.randn(n, device=helpers.device()).to(dtype)
    got = scale_shift(x, 2.5, -1.0, block_size=128)
    want = scale_shift_reference(x.float(), 2.5, -1.0).to(dtype)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype],
                               msg=lambda m: f"scale_shift wrong for n={n}, {dtype}: {m}")


def test_does_not_write_past_the_end():
    # The mask must stop the last block: place the output inside a larger buffer.
    x = torch.randn(100, device=helpers.device())
    buf = torch.full((228,), 7.0, device=helpers.device())
    from helpers.kernels.first_kernel import scale_shift_kernel

    scale_shift_kernel[(1,)](x, buf, 2.0, 0.0, 100, BLOCK_SIZE=128)
    assert torch.all(buf[100:] == 7.0)


def test_bad_inputs_get_clear_errors():
    with pytest.raises(TypeError, match="torch.Tensor"):
        scale_shift([1.0, 2.0], 1, 0)
    with pytest.raises(TypeError, match="int64.*float16, bfloat16, float32"):
        scale_shift(torch.arange(4, device=helpers.device()), 1, 0)
    with pytest.raises(ValueError, match="not contiguous"):
        scale_shift(torch.randn(8, 8, device=helpers.device()).t(), 1, 0)
    with pytest.raises(ValueError, match="power of two"):
        scale_shift(torch.randn(8, device=helpers.device()), 1, 0, block_size=100)


def test_wrong_device_is_explained():
    other = "cuda" if helpers.is_cpu() else "cpu"
    if other == "cuda":
        x = torch.empty(0)
        x = x.to("meta")  # no GPU here: any non-cpu device shows the message
    else:
        x = torch.randn(4)
    with pytest.raises(ValueError, match="kernels run on"):
        scale_shift(x, 1, 0)


def test_napkin_math():
    assert intensity.scale_shift(1000, torch.float16).nbytes == 4000
    assert intensity.scale_shift(1000, torch.float16).flops == 2000
