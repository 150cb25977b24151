"""A forward call like one seen before goes straight to its kept launches
(helpers.kernels.attention.kept; the kept calls of decode.py and forward.py).

On a GPU the kept launches are the compiled kernels' own launchers. Here, in the
interpreter, nothing is compiled, so the tests stand in launchers that run the same
kernels through Triton's usual launch, and check that a later call of the same signature
goes through them (and through nothing else), with new tensors, 3-D and 4-D, that another
signature does not, and that a launcher that does not reproduce the first call's output is
never kept."""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.kernels import attention as A
from helpers.kernels.attention import decode, kept
from helpers.kernels.attention import backward as attention_backward
from helpers.kernels.attention import forward as attention_forward
from helpers.kernels.launch import lean

from support import assert_close

DEVICE = helpers.device()


def make(batch, heads, kv_heads, seq_q, seq_k, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, d, generator=g).to(DEVICE)
    k, v = (torch.randn(batch, kv_heads, seq_k, d, generator=g).to(DEVICE) for _ in range(2))
    return q, k, v


@pytest.fixture
def launched(monkeypatch):
    """Plans whose launchers run the kernels the usual way and count each launch: stand-ins
    for the interpreter, which compiles nothing to launch directly. On a GPU the plans'
    launchers are the compiled kernels' own (the tests below that take no stand-in)."""
    if helpers.is_gpu():
        pytest.skip("stand-in launchers, for the interpreter; compiled, the real ones run")
    monkeypatch.setattr(kept, "KEPT_CALLS", {})
    monkeypatch.setattr(kept, "_compiled_here", lambda: True)     # the stand-ins are
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
        if not counts.get("broken"):
            kernel[grid](*args, **options)

    return run


@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
def test_a_call_like_an_earlier_one_runs_its_kept_launches_and_stays_right(launched, causal):
    first = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(*first, causal)
    assert len(kept.KEPT_CALLS) == 1, "the first call's launches are kept"
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
    assert len(kept.KEPT_CALLS) == 1


def test_three_dimensional_inputs_are_kept_as_three_dimensional(launched):
    q, k, v = (x[:, 0] for x in make(3, 1, 1, 2, 50, 16, seed=0))    # (batch, seq, d)
    A.flash_attention_forward(q, k, v, "bottom_right")
    q, k, v = (x[:, 0] for x in make(3, 1, 1, 2, 50, 16, seed=1))
    o, lse = A.flash_attention_forward(q, k, v, "bottom_right")
    # one check of the kept launches at the first call, then the second call through them
    assert launched["planned"] == 1 and launched["split"] == 2, "the second call was kept"
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    o_ref, lse_ref = A.attention_reference(q, k, v, "bottom_right")
    assert_close(o.double(), o_ref.double(), 2e-3, 2e-3, "3-D kept call")
    assert_close(lse.double(), lse_ref.double(), 1e-3, 1e-3, "3-D kept call's lse")


def test_decoding_launches_that_write_nothing_are_not_kept(launched):
    q, k, v = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(q, k, v, "bottom_right")      # makes the plan's launchers
    launched["broken"] = True
    q, k, v = make(2, 8, 2, 1, 71, 32, seed=0)              # a new signature, same plan kind
    A.flash_attention_forward(q, k, v, "bottom_right")
    assert kept.KEPT_CALLS[kept.call_key(q, k, v, "bottom_right", None)] is kept.USUAL


def test_another_signature_is_not_served_by_a_kept_call(launched):
    q, k, v = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(q, k, v, False)
    assert kept.call_key(q, k, v, True, None) not in kept.KEPT_CALLS
    assert kept.call_key(q, k, v, 1, None) != kept.call_key(q, k, v, True, None), \
        "1 is no causal mask the checks take, though it equals True"
    assert kept.call_key(q, k, v, False, 0.5) not in kept.KEPT_CALLS
    longer = make(2, 8, 2, 1, 71, 32, seed=0)
    assert kept.call_key(*longer, False, None) not in kept.KEPT_CALLS
    with pytest.raises(ValueError, match="causal="):
        A.flash_attention_forward(q, k, v, 1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        A.flash_attention_forward(q.tolist(), k, v, False)


def test_nothing_is_kept_without_compiled_launchers(monkeypatch):
    monkeypatch.setattr(kept, "KEPT_CALLS", {})
    monkeypatch.setattr(decode, "_plans", {})
    q, k, v = make(2, 8, 2, 1, 70, 32, seed=0)
    A.flash_attention_forward(q, k, v, "bottom_right")
    assert (len(kept.KEPT_CALLS) == 1) == helpers.is_gpu()


class _Compiled:
    """The forward kernel as Triton's launch returns it on a GPU, standing in: ``run`` is its
    launcher (here: the interpreter's launch of the same kernel, counted)."""

    function = packed_metadata = 0

    def __init__(self, grid, counts, broken=False):
        self.grid, self.counts, self.broken = grid, counts, broken

    def run(self, *args):
        self.counts["kept"] += 1
        if not self.broken:     # past grid, stream, function, metadata and the hooks
            kernel = attention_forward.kernel_for(args[9].shape[-1])    # q's head
            kernel[self.grid[:2]](*args[9:])

    def __getitem__(self, grid):
        return lambda *args: self.run(*grid, 0, 0, 0, None, None, None, *args)


@pytest.fixture
def forward_launches(monkeypatch):
    monkeypatch.setattr(kept, "KEPT_CALLS", {})
    monkeypatch.setattr(kept, "_compiled_here", lambda: True)
    counts = {"usual": 0, "kept": 0, "broken": False}
    real = attention_forward.launch

    def launch(q, k, v, o, lse, diagonal, sm_scale, **settings):
        counts["usual"] += 1
        real(q, k, v, o, lse, diagonal, sm_scale, **settings)
        return _Compiled(attention_forward._grid(q, settings["block_m"]), counts,
                         counts["broken"])

    monkeypatch.setattr(attention_forward, "launch", launch)
    # No driver here to ask for the current stream: the launcher is told it.
    monkeypatch.setattr(attention_forward, "lean", lambda compiled, grid, device: lean(
        compiled, grid, device, current_stream=lambda d: 0))
    return counts


@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
def test_a_forward_like_an_earlier_one_runs_its_kept_launch(forward_launches, causal):
    A.flash_attention_forward(*make(2, 4, 2, 40, 56, 16, seed=0), causal)
    assert forward_launches == {"usual": 1, "kept": 1, "broken": False}, \
        "the first call, then its kept launch checked once against it"
    for seed in (1, 2):
        q, k, v = make(2, 4, 2, 40, 56, 16, seed=seed)
        o, lse = A.flash_attention_forward(q, k, v, causal)
        assert forward_launches["usual"] == 1 and forward_launches["kept"] == 1 + seed
        o_ref, lse_ref = A.attention_reference(q, k, v, causal)
        assert o.shape == q.shape and o.is_contiguous() and lse.shape == q.shape[:-1]
        assert_close(o.double(), o_ref.double(), 2e-3, 2e-3, f"kept forward, step {seed}")
        finite = lse_ref.isfinite()
        assert torch.equal(lse.isfinite(), finite)
        assert_close(lse[finite].double(), lse_ref[finite].double(), 1e-3, 1e-3, "lse")
    q3, k3, v3 = (x[:, 0] for x in make(2, 1, 1, 40, 56, 16, seed=3))     # 3-D
    A.flash_attention_forward(q3, k3, v3, causal)
    o, lse = A.flash_attention_forward(q3 + 1, k3, v3, causal)
    assert forward_launches["usual"] == 2 and o.shape == q3.shape
    assert_close(o.double(), A.attention_reference(q3 + 1, k3, v3, causal)[0].double(),
                 2e-3, 2e-3, "kept 3-D forward")


def test_a_kept_forward_on_a_head_split_in_two_pieces(forward_launches):
    """d = 48 = 32 + 16 runs the split kernel (:mod:`.forward_split`): its kept launch
    passes that kernel's widths in its signature's order."""
    assert attention_forward.kernel_for(48) is not attention_forward.attention_fwd_kernel
    for seed in (0, 1):
        q, k, v = make(1, 4, 2, 40, 56, 48, seed=seed)
        o, lse = A.flash_attention_forward(q, k, v, True)
        assert_close(o.double(), A.attention_reference(q, k, v, True)[0].double(), 2e-3, 2e-3,
                     f"split head, step {seed}")
    assert forward_launches == {"usual": 1, "kept": 2, "broken": False}


def test_a_launch_that_does_not_give_the_first_output_again_is_not_kept(forward_launches):
    """A launcher that writes nothing fails its check (its buffers start as NaN); the
    signature is marked for the usual path and not tried again."""
    forward_launches["broken"] = True
    q, k, v = make(1, 2, 2, 40, 56, 16, seed=0)
    A.flash_attention_forward(q, k, v, False)
    assert list(kept.KEPT_CALLS.values()) == [kept.USUAL] and forward_launches["kept"] == 1
    o, _ = A.flash_attention_forward(q, k, v, False)
    assert forward_launches == {"usual": 2, "kept": 1, "broken": True}, \
        "the usual path again, and no second try"
    assert_close(o.double(), A.attention_reference(q, k, v, False)[0].double(), 2e-3, 2e-3,
                 "the usual path's output")


def test_arguments_that_cannot_be_keyed_take_the_usual_path(forward_launches):
    q, k, v = make(1, 2, 2, 40, 56, 16, seed=0)
    scale = torch.tensor(0.25)                   # a tensor may change: keyed by nothing
    assert kept.call_key(q, k, v, False, scale) is None
    o, _ = A.flash_attention_forward(q, k, v, False, scale)
    assert kept.KEPT_CALLS == {}
    assert_close(o.double(), A.attention_reference(q, k, v, False, 0.25)[0].double(),
                 2e-3, 2e-3, "a tensor scale")
    with pytest.raises(ValueError, match="causal="):
        A.flash_attention_forward(q, k, v, [1])      # unhashable: the usual check says so


def test_kept_calls_switched_off(forward_launches, monkeypatch):
    monkeypatch.setattr(kept, "ENABLED", False)
    q, k, v = make(1, 2, 2, 40, 56, 16, seed=0)
    for _ in range(2):
        A.flash_attention_forward(q, k, v, False)
    assert kept.KEPT_CALLS == {} and forward_launches["usual"] == 2


def test_a_call_with_its_own_setting_is_never_kept(forward_launches):
    q, k, v = make(1, 2, 2, 40, 56, 16, seed=0)
    A.flash_attention_forward(q, k, v, False, block_m=32, block_n=16, num_warps=4,
                              num_stages=1)
    assert kept.KEPT_CALLS == {} and forward_launches["kept"] == 0


class _CompiledAny(_Compiled):
    """Any of the backward kernels, standing in for its compiled self."""

    def __init__(self, kernel, grid, counts):
        super().__init__(grid, counts)
        self.kernel = kernel

    def run(self, *args):
        self.counts["kept"] += 1
        self.kernel[self.grid[:2]](*args[9:])


@pytest.fixture
def backward_launches(monkeypatch):
    monkeypatch.setattr(kept, "KEPT_CALLS", {})
    monkeypatch.setattr(kept, "_compiled_here", lambda: True)
    counts = {"usual": 0, "kept": 0}
    for name, kernel, grid_of in (
            ("launch_preprocess", attention_backward.attention_bwd_preprocess_kernel,
             lambda a, kw: ((a[1].shape[2] + 63) // 64, a[1].shape[0] * a[1].shape[1], 1)),
            ("launch_dkdv", attention_backward.attention_bwd_dkdv_kernel,
             lambda a, kw: (-(-a[2].shape[2] // kw["block_n"]),
                            a[2].shape[0] * a[2].shape[1], 1)),
            ("launch_dq", attention_backward.attention_bwd_dq_kernel,
             lambda a, kw: (-(-a[1].shape[2] // kw["block_m"]),
                            a[1].shape[0] * a[1].shape[1], 1))):
        real = getattr(attention_backward, name)

        def launch(*args, _real=real, _kernel=kernel, _grid=grid_of, **kwargs):
            counts["usual"] += 1
            _real(*args, **kwargs)
            return _CompiledAny(_kernel, _grid(args, kwargs), counts)

        monkeypatch.setattr(attention_backward, name, launch)
    monkeypatch.setattr(attention_backward, "lean", lambda compiled, grid, device: lean(
        compiled, grid, device, current_stream=lambda d: 0))
    return counts


@pytest.mark.parametrize("causal", [False, "bottom_right"], ids=str)
@pytest.mark.parametrize("dims", [4, 3])
def test_a_backward_like_an_earlier_one_runs_its_kept_launches(backward_launches, causal,
                                                               dims):
    def inputs(seed):
        q, k, v = make(2, 4 if dims == 4 else 1, 2 if dims == 4 else 1, 40, 56, 16, seed)
        if dims == 3:
            q, k, v = (x[:, 0] for x in (q, k, v))
        o, lse = A.attention_reference(q, k, v, causal)
        return torch.randn_like(q), q, k, v, o.float(), lse.float()

    A.flash_attention_backward(*inputs(0), causal)
    assert backward_launches == {"usual": 3, "kept": 3}, \
        "the first call's three launches, then its kept ones checked once against them"
    do, q, k, v, o, lse = inputs(1)
    got = A.flash_attention_backward(do, q, k, v, o, lse, causal)
    assert backward_launches == {"usual": 3, "kept": 6}, "the kept launches alone"
    tiles = dict(block_m=16, block_n=16, num_warps=4, num_stages=1)
    want = A.flash_attention_backward(do, q, k, v, o, lse, causal, dkdv=tiles,
                                      dq_tiles=tiles)            # the usual path, configured
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.is_contiguous(), name
        assert_close(a.double(), b.double(), 1e-4, 1e-4, f"kept backward's {name}")


def test_a_backward_whose_inputs_were_copied_is_not_kept(backward_launches):
    q, k, v = make(1, 2, 2, 40, 56, 16, seed=0)
    o, lse = A.attention_reference(q, k, v, False)
    do = torch.randn(1, 2, 16, 40).to(DEVICE).transpose(2, 3)     # not contiguous: copied
    A.flash_attention_backward(do, q, k, v, o.float(), lse.float(), False)
    assert kept.KEPT_CALLS == {} and backward_launches["kept"] == 0
