"""The tuners' candidates compiled side by side (helpers.kernels.matmul.precompile).

In CPU mode: the bookkeeping, on stand-ins for a tuner and for Triton's deferred compiles
(nothing is compiled in the interpreter); the tests marked ``gpu`` compile the real
candidates of v6 and of the persistent kernel and check the tuner then finds them built.
"""

from __future__ import annotations

import types

import pytest
import torch
import triton

from helpers.kernels.matmul import persistent as mp
from helpers.kernels.matmul import precompile
from helpers.kernels.matmul import tuned as mt
from helpers.kernels.matmul.space import shape_key

needs_async = pytest.mark.skipif(precompile._async_compile is None,
                                 reason="this Triton has no AsyncCompileMode")


@needs_async
def test_a_compile_that_fails_leaves_no_compile_deferred():
    from triton.runtime import _async_compile

    finished = []

    def deferred(key, fail):
        def compile_fn():
            if fail:
                raise RuntimeError("ptxas said no")
            return key
        return lambda: _async_compile.active_mode.get().submit(key, compile_fn, finished.append)

    # "b" fails first, so the mode's exit stops before it finalizes "c": side_by_side must.
    calls = [deferred("b", True), deferred("c", False), deferred("a", False), lambda: 1 / 0]
    assert precompile.side_by_side(calls) == 4
    assert _async_compile.active_mode.get() is None, "later compiles would stay deferred"
    assert sorted(finished) == ["a", "c"], "a compile that finished is left as a future"
    assert precompile.side_by_side([deferred("d", False)]) == 1
    assert "d" in finished and _async_compile.active_mode.get() is None


@needs_async
def test_a_compile_mode_already_on_is_left_alone():
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    with ThreadPoolExecutor(1) as pool, _async_compile.AsyncCompileMode(pool) as theirs:
        assert precompile.side_by_side([lambda: None]) == 0
        assert _async_compile.active_mode.get() is theirs


def _box():
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(torch.empty(64, 64, dtype=torch.float16), [64, 64], [64, 1], [1, 1])


def _stand_in_tuner(cache=()):
    def hook(nargs):
        nargs["desc"].block_shape = [nargs["BLOCK"], 64]

    def config(block, warps):
        return types.SimpleNamespace(pre_hook=hook, all_kwargs=lambda: {"BLOCK": block,
                                                                        "num_warps": warps})

    warmed = []
    tuner = types.SimpleNamespace(
        arg_names=["desc", "M", "M_BUCKET"], keys=["M_BUCKET"], cache=dict.fromkeys(cache),
        configs=[config(64, 4), config(128, 8), config(256, 8)], nargs=None, warmed=warmed,
        fn=types.SimpleNamespace(warmup=lambda *args, **kw: warmed.append((args, kw))))
    # The tuner's own prune, which reads the call's arguments from tuner.nargs.
    tuner.prune_configs = lambda kwargs: [c for c in tuner.configs
                                          if c.all_kwargs()["BLOCK"] <= 2 * tuner.nargs["M"]]
    return tuner


@needs_async
def test_the_settings_compiled_are_the_pruned_ones_each_with_its_hook(monkeypatch):
    monkeypatch.setattr(precompile, "side_by_side",
                        lambda calls: [c() for c in calls] and len(calls))
    tuner, desc = _stand_in_tuner(), _box()
    assert precompile.tuner_candidates(tuner, (desc, 100, 128), {"GROUP": 8}) == 2
    assert [(args[0].block_shape, kw["BLOCK"], kw["num_warps"], kw["GROUP"], kw["grid"])
            for args, kw in tuner.warmed] == [([64, 64], 64, 4, 8, (1,)),
                                              ([128, 64], 128, 8, 8, (1,))]
    assert desc.block_shape == [1, 1], "the hook changed the caller's descriptor"
    assert tuner.nargs is None


def test_a_key_the_tuner_knows_compiles_nothing(monkeypatch):
    monkeypatch.setattr(precompile, "side_by_side", lambda calls: pytest.fail("compiled"))
    tuner = _stand_in_tuner(cache=[(128,)])
    assert precompile.tuner_candidates(tuner, (_box(), 100, 128), {}) == 0
    monkeypatch.setattr(precompile, "ENABLED", False)
    assert precompile.tuner_candidates(_stand_in_tuner(), (_box(), 100, 128), {}) == 0


def _jit_of(tuner):
    """The JIT function under ``tuner`` (and its heuristics)."""
    fn = tuner.fn
    while not hasattr(fn, "device_caches"):
        fn = fn.fn
    return fn


def _compiled(tuner) -> int:
    """Kernels the JIT function under ``tuner`` holds compiled."""
    return sum(len(cache[0]) for cache in _jit_of(tuner).device_caches.values())


def test_a_tuner_that_cannot_be_read_is_left_to_compile_alone(monkeypatch):
    monkeypatch.setattr(precompile, "side_by_side", lambda calls: pytest.fail("compiled"))
    tuner = _stand_in_tuner()
    tuner.prune_configs = lambda kwargs: 1 / 0
    assert precompile.tuner_candidates(tuner, (_box(), 100, 128), {}) == 0
    assert tuner.nargs is None


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["v6", "persistent"])
def test_compiled_side_by_side_then_tuned_on_what_was_built(kernel, monkeypatch):
    # A decision kept on disk by an earlier run would skip the tuner: decide afresh.
    monkeypatch.setattr(mt.plans, "USE_DECISIONS", False)
    # Buckets no other test tunes (v6's first call tunes the persistent kernel too).
    M, N, K = (1234, 1536, 704) if kernel == "v6" else (3000, 640, 1200)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    if kernel == "v6":
        tuner, kwargs = mt.matmul_kernel_v6_tuned, {}
        ws, locks = mt._scratch_for(a, M, N, K, mt.CONFIG_SPACE)
        args = (a, b, c, ws, locks, M, N, K, N, *a.stride(), *b.stride(), *c.stride(),
                *shape_key(M, N, K))
    else:
        tuner = mp.matmul_kernel_persistent_tuned
        sms = mp.sm_count(a.device)
        kwargs = dict(GROUP_M=mp.GROUP_M, NUM_SMS=sms, A_T=False, B_T=False)
        args = (*mp.descriptors(a, b, c, mp.PERSISTENT_SPACE[0]), M, N, K, b.stride(0),
                mp._bucket(M), mp._bucket(N), mp._bucket(K), str(a.dtype))
    # As in a fresh process: another test in this one may have compiled the same settings
    # (a binary serves every shape bucket), and a candidate found compiled adds nothing.
    # Forgetting them costs a read of Triton's disk cache each.
    _jit_of(tuner).device_caches.clear()
    built = _compiled(tuner)
    submitted = precompile.tuner_candidates(tuner, args, kwargs)
    assert submitted >= 2, "a fresh key should compile several candidates"
    assert _compiled(tuner) - built == submitted, "each candidate is one more compiled kernel"
    before = _compiled(tuner)
    if kernel == "v6":                  # the tuner alone (matmul_tuned builds more plans)
        tuner[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),
                            meta["SPLIT_K"])](*args)
        got = c.float()
    else:
        got = mp.launch(a, b)[0].float()
    assert _compiled(tuner) == before, "the tuner compiled again what was compiled for it"
    want = a.float() @ b.float()
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2
    assert precompile.tuner_candidates(tuner, args, kwargs) == 0, "the key is known now"
