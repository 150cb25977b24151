"""The TMA-fed grouped GEMM (helpers.kernels.moe.grouped_tma) against a per-expert loop:
uneven experts (one with no rows), K and N off the tile, the weights as stored and as a
transposed view, and the refusals that send a caller to the pointer kernel."""

import pytest
import torch

import helpers
from helpers import runtime
from helpers.kernels.moe.grouped_tma import grouped_matmul_tma, usable

DEVICE = helpers.device()
# The interpreter computes fp32 exactly; a GPU's tensor cores take fp32 as TF32 (10 bits of
# mantissa), and these products have entries of order sqrt(K).
TOL = {"rtol": 2e-3, "atol": 2e-3} if runtime.is_cpu() else {"rtol": 2e-2, "atol": 5e-2}


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
    torch.testing.assert_close(got.cpu().double(), _loop(a, counts, w), **TOL)


def test_refusals_name_the_reason():
    a = torch.randn(8, 64)
    assert usable(a, torch.randn(2, 64, 32)) is None
    assert "A's rows" in usable(a[:, ::2], torch.randn(2, 32, 32))
    assert "A's rows" in usable(torch.randn(8, 63)[:, :62], torch.randn(2, 62, 32))
    assert "weights' rows" in usable(a, torch.randn(2, 64, 3))
    assert "one (E, K, N) tensor" in usable(a, torch.randn(2, 64, 64)[:, :, :32])
    with pytest.raises(ValueError, match="use grouped_matmul"):
        grouped_matmul_tma(a, torch.tensor([8, 0], dtype=torch.int32), torch.randn(2, 64, 3))


def _weight_grad_loop(a, b, counts):
    out, start = [], 0
    for n in counts.tolist():
        out.append(a[start:start + n].double().T @ b[start:start + n].double())
        start += n
    return torch.stack(out)


def test_weight_grad_matches_a_loop_and_keeps_the_next_experts_rows_out():
    from helpers.kernels.moe.grouped_tma import grouped_weight_grad_tma

    g = torch.Generator().manual_seed(4)
    counts = torch.tensor([5, 0, 37, 32, 1], dtype=torch.int32)   # partial, none, whole
    R = int(counts.sum())
    a, b = torch.randn(R, 48, generator=g), torch.randn(R, 40, generator=g)
    b[5:] = torch.where(torch.arange(R - 5)[:, None] % 7 == 0, float("nan"), b[5:])
    b[5 + 37:5 + 37 + 32] = torch.randn(32, 40, generator=g)       # expert 3 clean, NaN elsewhere
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(counts, 0)
    got = grouped_weight_grad_tma(a.to(DEVICE), b.to(DEVICE), offsets.to(DEVICE), 5).cpu()
    want = _weight_grad_loop(a, b, counts)
    assert (got[1] == 0).all(), "an expert with no rows has a zero gradient"
    # Expert 0's last box reaches expert 2's rows, which hold NaNs: none may get in.
    for e in (0, 3, 4):
        torch.testing.assert_close(got[e].double(), want[e], **TOL)
    with pytest.raises(ValueError, match="use grouped_weight_grad"):
        grouped_weight_grad_tma(a[:, ::2], b, offsets, 5)


@pytest.mark.parametrize("variant", ["gather", "gather, transposed view", "swiglu"])
def test_gathering_kernel_matches_a_loop(variant):
    from helpers.kernels.moe.grouped_tma import grouped_gather_tma

    g = torch.Generator().manual_seed(5)
    counts = torch.tensor([5, 0, 37, 16, 1], dtype=torch.int32)
    E, R, T, K, N = counts.numel(), int(counts.sum()), 23, 40, 48
    x = torch.randn(T, K, generator=g)
    rows = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    xs = x[rows.long()]
    pre = None
    if variant == "swiglu":
        w = torch.randn(E, K, 2 * N, generator=g)
        pre = torch.empty(R, 2 * N)
        gate, up = _loop(xs, counts, w[..., :N]), _loop(xs, counts, w[..., N:])
        want = torch.nn.functional.silu(gate) * up
    else:
        w = torch.randn(E, N, K, generator=g).transpose(1, 2) if "transposed" in variant \
            else torch.randn(E, K, N, generator=g)
        want = _loop(xs, counts, w)
    pre_dev = pre.to(DEVICE) if pre is not None else None
    got = grouped_gather_tma(x.to(DEVICE), rows.to(DEVICE), counts.to(DEVICE), w.to(DEVICE),
                             swiglu=variant == "swiglu", pre=pre_dev)
    torch.testing.assert_close(got.cpu().double(), want, **TOL)
    if pre is not None:
        torch.testing.assert_close(pre_dev.cpu().double(), torch.cat([gate, up], dim=1),
                                   **TOL)


def test_the_chooser_times_each_kernel_once_per_key_and_runs_the_fastest(monkeypatch):
    """The timing is faked (the interpreter has no clock worth reading): the TMA setting
    says it is fastest, so it runs, and a second call of the same key times nothing."""
    from helpers.kernels.moe import grouped_tma

    timed = []

    def fake_bench(fn, **_):
        fn()                                    # every candidate must run
        timed.append(fn)
        return 1.0 if getattr(fn, "args", None) == (grouped_tma.TMA_SPACE[1],) else 2.0

    monkeypatch.setattr(grouped_tma.triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(grouped_tma, "_PLANS", {})
    monkeypatch.setattr(grouped_tma, "TMA_SPACE", [
        grouped_tma.CPU_CONFIG, grouped_tma.TileConfig(16, 16, 16, num_warps=4, num_stages=1)])
    g = torch.Generator().manual_seed(6)
    counts = torch.tensor([7, 0, 9], dtype=torch.int32)
    a, w = torch.randn(16, 32, generator=g), torch.randn(3, 32, 16, generator=g)
    want = _loop(a, counts, w)
    pointer_calls = []

    def pointer_kernel():       # the right answer: the TMA outputs are checked against it
        pointer_calls.append(1)
        return want.float().to(DEVICE)

    for _ in range(2):
        got = grouped_tma.tuned_grouped_matmul(a.to(DEVICE), counts.to(DEVICE), w.to(DEVICE),
                                              pointer_kernel)
        torch.testing.assert_close(got.cpu().double(), want, **TOL)
    assert len(timed) == 3, "the pointer kernel and the two TMA settings, each timed once"
    assert len(pointer_calls) == 2, "the pointer kernel ran in its trial only (reference, timing)"
    assert list(grouped_tma.chosen_plans().values()) == ["tma 16x16x16 w4 s1"]


def test_gate_and_up_are_recognised_as_halves_of_one_tensor():
    from helpers.kernels.moe.grouped_tma import fused_gate_up
    from helpers.kernels.moe.training import split_gate_up

    gate_up = torch.randn(3, 8, 2 * 16)
    whole = fused_gate_up(*split_gate_up(gate_up))
    assert whole is not None and whole.data_ptr() == gate_up.data_ptr() and torch.equal(whole, gate_up)
    assert fused_gate_up(torch.randn(3, 8, 16), torch.randn(3, 8, 16)) is None
    gate, up = split_gate_up(gate_up)
    assert fused_gate_up(up, gate) is None, "the halves in the other order are not gate_up"


@pytest.mark.parametrize("product", ["weight grad", "gather", "swiglu"])
def test_the_chooser_runs_each_tma_product_right(monkeypatch, product):
    """Every product the chooser can send through the TMA gives the loop's answer when
    its TMA setting is the one timed fastest (faked clock; the pointer kernel stands in
    with the loop's answer, which the TMA output is checked against)."""
    from helpers.kernels.moe import grouped_tma

    monkeypatch.setattr(grouped_tma.triton.testing, "do_bench",
                        lambda fn, **_: (fn(), 1.0 if getattr(fn, "args", ()) else 2.0)[1])
    monkeypatch.setattr(grouped_tma, "_PLANS", {})
    for name in ("WEIGHT_GRAD_TMA_SPACE", "GATHER_TMA_SPACE", "SWIGLU_TMA_SPACE"):
        monkeypatch.setattr(grouped_tma, name, [grouped_tma.CPU_CONFIG])
    g = torch.Generator().manual_seed(7)
    counts = torch.tensor([7, 0, 9], dtype=torch.int32)
    R, K, N = 16, 32, 16

    if product == "weight grad":
        a, b = torch.randn(R, K, generator=g), torch.randn(R, N, generator=g)
        offsets = torch.tensor([0, 7, 7, 16])
        want = _weight_grad_loop(a, b, counts)
        got = grouped_tma.tuned_weight_grad(a.to(DEVICE), b.to(DEVICE), offsets.to(DEVICE), 3,
                                            lambda: want.float().to(DEVICE))
        torch.testing.assert_close(got.cpu().double(), want, **TOL)
        assert "tma" in next(iter(grouped_tma.chosen_plans().values()))
        return
    x = torch.randn(11, K, generator=g)
    rows = torch.randint(0, 11, (R,), generator=g, dtype=torch.int32)
    w = torch.randn(3, K, 2 * N if product == "swiglu" else N, generator=g)
    xs = x[rows.long()]
    want = (torch.nn.functional.silu(_loop(xs, counts, w[..., :N])) * _loop(xs, counts, w[..., N:])
            if product == "swiglu" else _loop(xs, counts, w))
    got = grouped_tma.tuned_gather(x.to(DEVICE), rows.to(DEVICE), counts.to(DEVICE),
                                   w.to(DEVICE), lambda: want.float().to(DEVICE),
                                   swiglu=product == "swiglu")
    torch.testing.assert_close(got.cpu().double(), want, **TOL)
    assert "tma" in next(iter(grouped_tma.chosen_plans().values()))


def test_a_tma_setting_that_fails_is_skipped_and_said(monkeypatch):
    from helpers.kernels.moe import grouped_tma

    monkeypatch.setattr(grouped_tma.triton.testing, "do_bench", lambda fn, **_: (fn(), 1.0)[1])
    monkeypatch.setattr(grouped_tma, "_PLANS", {})
    monkeypatch.setattr(grouped_tma, "SKIPPED", {})
    monkeypatch.setattr(grouped_tma, "TMA_SPACE", [grouped_tma.CPU_CONFIG])

    def broken(*args, **kwargs):
        raise RuntimeError("this setting does not build")

    monkeypatch.setattr(grouped_tma, "grouped_matmul_tma", broken)
    a, w = torch.randn(16, 32), torch.randn(3, 32, 16)
    out = grouped_tma.tuned_grouped_matmul(a, torch.tensor([7, 0, 9], dtype=torch.int32), w,
                                           lambda: torch.ones(16, 16))
    assert torch.equal(out, torch.ones(16, 16)), "the pointer kernel ran"
    plans = grouped_tma.chosen_plans()
    assert "cp.async" in plans.values()
    assert any("skipped" in k and "does not build" in v for k, v in plans.items())


def test_a_tma_setting_whose_output_differs_is_left_out(monkeypatch):
    """A TMA kernel that reads the wrong rows must never be chosen, however fast."""
    from helpers.kernels.moe import grouped_tma

    monkeypatch.setattr(grouped_tma.triton.testing, "do_bench",
                        lambda fn, **_: (fn(), 1.0 if getattr(fn, "args", ()) else 2.0)[1])
    monkeypatch.setattr(grouped_tma, "_PLANS", {})
    monkeypatch.setattr(grouped_tma, "SKIPPED", {})
    monkeypatch.setattr(grouped_tma, "TMA_SPACE", [grouped_tma.CPU_CONFIG])
    g = torch.Generator().manual_seed(8)
    counts = torch.tensor([7, 0, 9], dtype=torch.int32)
    a, w = torch.randn(16, 32, generator=g), torch.randn(3, 32, 16, generator=g)
    wrong = _loop(a, counts, w).float() * 1.1          # what the pointer kernel "computes"
    out = grouped_tma.tuned_grouped_matmul(a.to(DEVICE), counts.to(DEVICE), w.to(DEVICE),
                                           lambda: wrong.to(DEVICE))
    assert torch.equal(out.cpu(), wrong), "the pointer kernel ran, not the faster TMA one"
    assert any("differs from the cp.async kernel" in v for v in grouped_tma.SKIPPED.values())
