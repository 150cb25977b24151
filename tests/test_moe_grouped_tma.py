"""The TMA-fed grouped GEMM (helpers.kernels.moe.grouped_tma) against a per-expert loop:
uneven experts (one with no rows), K and N off the tile, the weights as stored and as a
transposed view, and the refusals that send a caller to the pointer kernel."""

import pytest
import torch

import helpers
from helpers.kernels.moe.grouped_tma import grouped_matmul_tma, usable

DEVICE = helpers.device()


def _loop(a, counts, w):
    out, start = [], 0
    for e, n in enumerate(counts.tolist()):
        out.append(a[start:start + n].double() @ w[e].double())
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("transposed", [False, True], ids=["stored", "transposed view"])
@pytest.mark.parametrize("K,N", [(64, 64), (40, 48)], ids=["whole tiles", "K and N off the tile"])
def test_matches_a_loop_over_experts(transposed, K, N):
    g = torch.Generator().manual_seed(3)
    counts = torch.tensor([5, 0, 37, 16, 1], dtype=torch.int32)
    E, R = counts.numel(), int(counts.sum())
    a = torch.randn(R, K, generator=g)
    if transposed:      # (E, K, N) read through the (E, N, K) tensor underneath, as dx does
        w = torch.randn(E, N, K, generator=g).transpose(1, 2)
    else:
        w = torch.randn(E, K, N, generator=g)
    got = grouped_matmul_tma(a.to(DEVICE), counts.to(DEVICE), w.to(DEVICE), num_sms=3)
    torch.testing.assert_close(got.cpu().double(), _loop(a, counts, w), rtol=2e-3, atol=2e-3)


def test_refusals_name_the_reason():
    a = torch.randn(8, 64)
    assert usable(a, torch.randn(2, 64, 32)) is None
    assert "A's rows" in usable(a[:, ::2], torch.randn(2, 32, 32))
    assert "A's rows" in usable(torch.randn(8, 63)[:, :62], torch.randn(2, 62, 32))
    assert "weights' rows" in usable(a, torch.randn(2, 64, 3))
    assert "one (E, K, N) tensor" in usable(a, torch.randn(2, 64, 64)[:, :, :32])
    with pytest.raises(ValueError, match="use grouped_matmul"):
        grouped_matmul_tma(a, torch.tensor([8, 0], dtype=torch.int32), torch.randn(2, 64, 3))
