"""A decoding call like one seen before goes straight to its kept launches
(helpers.kernels.attention.decode: call_key, keep_call, kept_call).

On a GPU the kept launches are the compiled kernels' own launchers. Here, in the
interpreter, the plans have none, so the tests give each plan stand-in launchers that run
the same kernels through Triton's usual launch, and check that a later call of the same
signature goes through them (and through nothing else), with new tensors, 3-D and 4-D,
and that another signature does not."""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.kernels import attention as A
from helpers.kernels.attention import decode

from support import assert_close

DEVICE = helpers.device()


def make(batch, heads, kv_heads, seq_q, seq_k, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, d, generator=g).to(DEVICE)
    k, v = (torch.randn(batch, kv_heads, seq_k, d, generator=g).to(DEVICE) for _ in range(2))
    return q, k, v


@pytest.fixture
def launched(monkeypatch):
    """Plans whose launchers run the kernels the usual way and count each launch."""
    monkeypatch.setattr(decode, "KEPT_CALLS", {})
    monkeypatch.setattr(decode, "_plans", {})
    counts = {"split": 0, "combine": 0, "planned": 0}
    real_launch = decode.launch

    def launch(q, k, v, o, lse, diagonal, sm_scale, **settings):
        counts["planned"] += 1           # the usual path: checks, views, the plan's lookup
        splits = real_launch(q, k, v, o, lse, diagonal, sm_scale, **settings)
        for plan in decode._plans.values():
            if plan["runners"] is None:
                plan["runners"] = (_counted(decode.attention_decode_split_kernel,
                                            plan["split_grid"], settings, "split", counts),
                                   _counted(decode.attention_decode_combine_kernel,
                                            plan["combine_grid"], {"num_warps": 4},
                                            "combine", counts))
        return splits

    monkeypatch.setattr(decode, "launch", launch)
    return counts


def _counted(kernel, grid, settings, name, counts):
    options = {k: settings[k] for k in ("num_warps", "num_stages") if k in settings}

    def run(*args):
        counts[name] += 1
        kernel[grid](*args, **options)

    return run


@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
def test_a_call_like_an_earlier_one_runs_its_kept_launches_and_stays_right(launched, causal):
    first = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(*first, causal)
    assert len(decode.KEPT_CALLS) == 1, "the first call's launches are kept"
    for seed in (1, 2):
        q, k, v = make(2, 8, 2, 1, 70, 32, seed=seed)
        before = dict(launched)
        o, lse = A.flash_attention_forward(q, k, v, causal)
        assert launched == {"split": before["split"] + 1, "combine": before["combine"] + 1,
                            "planned": 1}, "the kept launches, and not the usual path"
        o_ref, lse_ref = A.attention_reference(q, k, v, causal)
        assert o.shape == q.shape and o.is_contiguous() and lse.shape == q.shape[:-1]
        assert_close(o.double(), o_ref.double(), 2e-3, 2e-3, f"kept call, step {seed}")
        assert_close(lse.double(), lse_ref.double(), 1e-3, 1e-3, f"kept call's lse, step {seed}")
    assert len(decode.KEPT_CALLS) == 1


def test_three_dimensional_inputs_are_kept_as_three_dimensional(launched):
    q, k, v = (x[:, 0] for x in make(3, 1, 1, 2, 50, 16, seed=0))    # (batch, seq, d)
    A.flash_attention_forward(q, k, v, "bottom_right")
    q, k, v = (x[:, 0] for x in make(3, 1, 1, 2, 50, 16, seed=1))
    o, lse = A.flash_attention_forward(q, k, v, "bottom_right")
    assert launched["planned"] == 1 and launched["split"] == 1, "the second call was kept"
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    o_ref, lse_ref = A.attention_reference(q, k, v, "bottom_right")
    assert_close(o.double(), o_ref.double(), 2e-3, 2e-3, "3-D kept call")
    assert_close(lse.double(), lse_ref.double(), 1e-3, 1e-3, "3-D kept call's lse")


def test_another_signature_is_not_served_by_a_kept_call(launched):
    q, k, v = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(q, k, v, False)
    assert decode.call_key(q, k, v, True, None) not in decode.KEPT_CALLS
    assert decode.call_key(q, k, v, 1, None) != decode.call_key(q, k, v, True, None), \
        "1 is no causal mask the checks take, though it equals True"
    assert decode.call_key(q, k, v, False, 0.5) not in decode.KEPT_CALLS
    longer = make(2, 8, 2, 1, 71, 32, seed=0)
    assert decode.call_key(*longer, False, None) not in decode.KEPT_CALLS
    with pytest.raises(ValueError, match="causal="):
        A.flash_attention_forward(q, k, v, 1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        A.flash_attention_forward(q.tolist(), k, v, False)


def test_nothing_is_kept_without_compiled_launchers(monkeypatch):
    monkeypatch.setattr(decode, "KEPT_CALLS", {})
    monkeypatch.setattr(decode, "_plans", {})
    q, k, v = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(q, k, v, "bottom_right")
    assert (len(decode.KEPT_CALLS) == 1) == helpers.is_gpu()
