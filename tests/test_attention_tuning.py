"""The attention tuner (helpers/kernels/attention/tuning.py): its keys, its candidates, and
what it keeps. In CPU mode the kernels run in the interpreter and nothing is timed: a
stand-in stopwatch says which candidate is fastest, a stand-in GPU says how much shared
memory it has, and the tuner's choice must be the one launched, kept for the process and
read back from disk by the next. Compiled, on a GPU, the tuner times the real kernels."""

from __future__ import annotations

import types

import pytest
import torch
import triton

import helpers
from helpers.kernels import attention as A
from helpers.kernels.attention import tuning
from helpers.kernels.matmul import plan

DEVICE = helpers.device()
H100_SHARED = 232448


def qkv(seq_q=48, seq_k=48, d=32, heads=2, kv_heads=1, dtype=torch.float32, device=DEVICE):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(1, heads, seq_q, d, generator=g, dtype=dtype).to(device)
    k, v = (torch.randn(1, kv_heads, seq_k, d, generator=g, dtype=dtype).to(device)
            for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("n, bucket", [(1, 128), (128, 128), (129, 256), (1000, 1024),
                                       (1024, 1024), (5000, 8192), (16384, 16384),
                                       (100_000, 16384)])
def test_lengths_share_a_bucket_up_to_the_next_power_of_two(n, bucket):
    assert tuning.length_bucket(n) == bucket


def test_a_key_is_the_pass_head_width_length_buckets_causal_and_dtype():
    q, k, _ = qkv(seq_q=1000, seq_k=1000, d=80)
    assert tuning.key("forward", q, k, True) == ("forward", 128, 1024, 1024, True, "float32")
    q96, k96, _ = qkv(seq_q=1024, seq_k=1000, d=96)
    assert tuning.key("forward", q96, k96, True) == tuning.key("forward", q, k, True)
    assert tuning.key("forward", q, k, False) != tuning.key("forward", q, k, True)
    assert tuning.key("dq", q, k, True) != tuning.key("forward", q, k, True)
    assert tuning.key("forward", q.half(), k.half(), True)[-1] == "float16"
    longer, _, _ = qkv(seq_q=1025, seq_k=1000, d=80)
    assert tuning.key("forward", longer, k, True) != tuning.key("forward", q, k, True)
    # A split head (forward_split) is keyed at its own width: 80 and 96 apart.
    assert tuning.key("forward", q, k, True, held=80)[1] == 80
    assert tuning.key("forward", q, k, True, held=80) != tuning.key("forward", q96, k96, True,
                                                                    held=96)


@pytest.mark.parametrize("pass_name", ["forward", "dkdv", "dq"])
@pytest.mark.parametrize("width, element_size", [(64, 2), (128, 2), (256, 2), (128, 4)])
def test_candidates_start_with_the_table_and_fit_the_gpu(pass_name, width, element_size):
    table = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
    found = tuning.candidates(pass_name, table, width, element_size, H100_SHARED)
    assert found[0] == table
    assert len({tuning.name_of(t) for t in found}) == len(found), "no setting twice"
    for tiles in found[1:]:
        resident = tiles[tuning.RESIDENT[pass_name]]
        walked = tiles["block_n"] if tuning.RESIDENT[pass_name] == "block_m" \
            else tiles["block_m"]
        assert resident % walked == 0, tiles
        assert tuning.shared_bytes(pass_name, tiles, width, element_size) <= H100_SHARED
    # Twice the bytes an element (or a head twice as wide) leaves fewer settings, never more.
    wider = tuning.candidates(pass_name, table, width, 2 * element_size, H100_SHARED)
    assert len(wider) <= len(found)
    assert tuning.candidates(pass_name, table, width, element_size, 0) == [table]


def test_in_cpu_mode_nothing_is_tuned_and_the_table_is_kept():
    if helpers.runtime.is_gpu():
        pytest.skip("CPU mode only")
    q, k, _ = qkv(seq_q=4096, seq_k=4096, d=64, heads=64)
    assert not tuning.worth_tuning(q, k), "the interpreter has nothing to time"

    def run(tiles):
        raise AssertionError("nothing may launch to be timed")

    table = A.forward_config(64, q.dtype)
    assert tuning.choose("forward", q, k, False, table, run, A.attention_fwd_kernel) is table


@pytest.fixture
def stand_in_gpu(monkeypatch, tmp_path):
    """Tuning switched on in the interpreter: a GPU with an H100's shared memory, decisions
    under a fresh TRITON_CACHE_DIR, and a stopwatch that reads each candidate's time from
    ``times`` (unknown settings: 1 ms) and counts what it timed."""
    monkeypatch.setattr(tuning, "worth_tuning", lambda q, k: True)
    monkeypatch.setattr(tuning, "_KEPT", {})
    monkeypatch.setattr(tuning, "_CHOSEN", {})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "DECISIONS", plan.Decisions(salt="test", file="attn.json"))
    props = types.SimpleNamespace(name="stand-in H100", major=9, minor=0,
                                  shared_memory_per_block_optin=H100_SHARED)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    clock = types.SimpleNamespace(times={}, sustained={}, timed=[], finals=[])

    def time_plans(runs, *args, rounds=plan.PLAN_ROUNDS, rep=40):
        # Rounds longer than the first timing's: the finalists' (``sustained`` times).
        final = rep > 40
        for name, run in runs.items():
            run(*args)
            (clock.finals if final else clock.timed).append(name)
        return {name: (clock.sustained if final else clock.times).get(
            name, clock.times.get(name, 1.0)) for name in runs}

    monkeypatch.setattr(tuning, "time_plans", time_plans)
    return clock


def test_the_fastest_candidate_is_kept_for_the_process_and_read_from_disk_after(
        stand_in_gpu, monkeypatch):
    q, k, _ = qkv()
    table = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
    stand_in_gpu.times = {"64x32 w4 s3": 0.5, "128x64 w8 s3": 0.7}
    launched = []

    def run(tiles):
        launched.append(tiles)

    assert tuning.chosen("forward", q, k, True) is None
    got = tuning.choose("forward", q, k, True, table, run, A.attention_fwd_kernel)
    assert tuning.name_of(got) == "64x32 w4 s3"
    assert tuning.chosen("forward", q, k, True) == "64x32 w4 s3", "what a record prints"
    assert tuning.chosen("forward", q, k, False) is None and tuning.chosen("dq", q, k, True) \
        is None
    assert tuning.name_of(table) in stand_in_gpu.timed, "the table is always a candidate"
    assert len(launched) == 2 * len(stand_in_gpu.timed) + len(stand_in_gpu.finals), \
        "each compiled once, then timed; the fastest few timed again"
    assert stand_in_gpu.finals[0] == "64x32 w4 s3" \
        and len(stand_in_gpu.finals) == tuning.FINALISTS
    timed = len(stand_in_gpu.timed)
    assert tuning.choose("forward", q, k, True, table, run, A.attention_fwd_kernel) == got
    assert len(stand_in_gpu.timed) == timed, "the same key is not timed twice"
    # A new process: nothing in memory, the choice on disk; it is read, not timed again.
    monkeypatch.setattr(tuning, "_KEPT", {})
    assert tuning.choose("forward", q, k, True, table, run, A.attention_fwd_kernel) == got
    assert len(stand_in_gpu.timed) == timed
    # Other shapes in the same buckets share the choice; another key (not causal) is timed.
    q2, k2, _ = qkv(seq_q=50, seq_k=60)
    assert tuning.choose("forward", q2, k2, True, table, run, A.attention_fwd_kernel) == got
    assert len(stand_in_gpu.timed) == timed
    assert tuning.chosen("forward", q2, k2, True) == "64x32 w4 s3"
    tuning.choose("forward", q, k, False, table, run, A.attention_fwd_kernel)
    assert len(stand_in_gpu.timed) == 2 * timed


def test_the_finalists_longer_timing_decides_and_only_theirs(stand_in_gpu):
    """The first timing's fastest few are timed again for longer (a GPU under a sustained
    load): the fastest there is kept, even where it came third at first; a setting outside
    the finalists is never timed again, however fast it would run at length."""
    q, k, _ = qkv()
    table = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
    stand_in_gpu.times = {"64x32 w4 s3": 0.5, "128x64 w8 s3": 0.6, "64x64 w4 s3": 0.7,
                          "128x128 w8 s3": 0.8}
    stand_in_gpu.sustained = {"64x32 w4 s3": 0.9, "128x64 w8 s3": 0.8, "64x64 w4 s3": 0.6,
                              "128x128 w8 s3": 0.1}
    got = tuning.choose("forward", q, k, False, table, lambda tiles: None,
                        A.attention_fwd_kernel)
    assert tuning.FINALISTS == 3
    assert sorted(stand_in_gpu.finals) == sorted(["64x32 w4 s3", "128x64 w8 s3", "64x64 w4 s3"])
    assert tuning.name_of(got) == "64x64 w4 s3"


def test_a_split_heads_candidates_are_counted_at_the_width_it_holds(stand_in_gpu):
    """d = 192 held as 128 + 64 columns, not 256: 128 x 64 tiles with 4 stages fit an H100's
    shared memory at 192 columns (196,608 bytes in bf16) and not at 256 (262,144)."""
    from helpers.kernels.attention import forward

    q, k, _ = qkv(d=192, dtype=torch.bfloat16)
    table = dict(block_m=128, block_n=64, num_warps=8, num_stages=2)
    assert forward.held(192) == 192
    tuning.choose("forward", q, k, False, table, lambda tiles: None,
                  forward.kernel_for(192), forward.held(192))
    assert "128x64 w8 s4" in stand_in_gpu.timed
    stand_in_gpu.timed.clear()
    tuning.choose("forward", q, k, True, table, lambda tiles: None, A.attention_fwd_kernel)
    assert stand_in_gpu.timed and "128x64 w8 s4" not in stand_in_gpu.timed


def test_the_tables_own_failure_is_the_calls(stand_in_gpu):
    q, k, _ = qkv()
    table = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)

    def run(tiles):
        if tiles == table:
            raise ValueError("the table's setting fails")

    with pytest.raises(ValueError, match="the table's setting fails"):
        tuning.choose("forward", q, k, False, table, run, A.attention_fwd_kernel)


def test_a_candidate_out_of_shared_memory_or_refused_by_the_compiler_is_dropped(stand_in_gpu):
    q, k, _ = qkv()
    table = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
    stand_in_gpu.times = {"128x128 w8 s3": 0.1, "64x64 w4 s3": 0.4}

    def run(tiles):
        if tiles["block_m"] == 128 and tiles["block_n"] == 128:
            raise triton.runtime.errors.OutOfResources(300_000, H100_SHARED, "shared memory")
        if tiles["block_m"] == 128:         # a setting the compiler refuses
            raise RuntimeError("PassManager::run failed")

    got = tuning.choose("forward", q, k, False, table, run, A.attention_fwd_kernel)
    assert tuning.name_of(got) == "64x64 w4 s3"
    assert not any(name.startswith("128x") for name in stand_in_gpu.timed)


def test_the_kernels_run_with_the_tuned_settings_and_stay_right(stand_in_gpu, monkeypatch):
    """Through the public functions: forward, dK/dV and dQ each tuned on their own, the
    choice launched, and the outputs and gradients still the reference's."""
    q, k, v = qkv(seq_q=40, seq_k=72, d=32)
    do = torch.randn_like(q)
    # One setting in each pass's space only: the forward's, dK/dV's and dQ's.
    stand_in_gpu.times = {"128x64 w4 s3": 0.1, "32x64 w4 s1": 0.1, "128x32 w8 s2": 0.1}
    seen = []
    for module, name in ((A.attention_forward, "launch"), (A.attention_backward, "launch_dkdv"),
                         (A.attention_backward, "launch_dq")):
        real = getattr(module, name)

        def spy(*args, real=real, name=name, **tiles):
            seen.append((name, tiles["block_m"], tiles["block_n"]))
            return real(*args, **tiles)

        monkeypatch.setattr(module, name, spy)
    o, lse = A.flash_attention_forward(q, k, v, causal="bottom_right")
    assert seen[-1] == ("launch", 128, 64)
    grads = A.flash_attention_backward(do, q, k, v, o, lse, causal="bottom_right")
    assert seen[-2:] == [("launch_dkdv", 32, 64), ("launch_dq", 128, 32)]
    want_o, want_lse = A.attention_reference(q, k, v, causal="bottom_right")
    torch.testing.assert_close(o.double(), want_o, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-3, rtol=2e-3)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref, _ = A.attention_reference(q64, k64, v64, causal="bottom_right")
    want = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for got, exp, what in zip(grads, want, "qkv"):
        torch.testing.assert_close(got.double(), exp, atol=2e-3, rtol=2e-3, msg=f"d{what}")


def test_settings_given_by_the_caller_are_not_tuned(stand_in_gpu):
    q, k, v = qkv()
    A.flash_attention_forward(q, k, v, block_m=32, block_n=16, num_warps=4, num_stages=1)
    assert stand_in_gpu.timed == []


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_the_tuner_times_the_real_kernels_and_keeps_the_fastest(
        causal, monkeypatch, tmp_path):
    """On a GPU: a problem big enough to tune (bf16, 16 heads of 2,048 tokens, d = 64) is
    tuned once per pass, the choice is the fastest it timed, and the outputs are right."""
    monkeypatch.setattr(tuning, "_KEPT", {})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "DECISIONS", plan.Decisions(salt="gpu-test", file="attn.json"))
    rounds = []
    real = tuning.time_plans

    def counted(runs, *args, **kw):
        times = real(runs, *args, **kw)
        rounds.append(times)
        return times

    monkeypatch.setattr(tuning, "time_plans", counted)
    q, k, v = (torch.randn(1, 16, 2048, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    do = torch.randn_like(q)
    assert tuning.worth_tuning(q, k)
    o, lse = A.flash_attention_forward(q, k, v, causal=causal)
    grads = A.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
    assert len(rounds) == 6, "forward, dK/dV and dQ, each tuned once: all, then finalists"
    kernels = (A.attention_fwd_kernel, A.attention_bwd_dkdv_kernel, A.attention_bwd_dq_kernel)
    for times, final, pass_name, kernel in zip(rounds[::2], rounds[1::2],
                                               ("forward", "dkdv", "dq"), kernels):
        print(f"causal={causal} {pass_name}:", {n: round(t, 4) for n, t in times.items()},
              "finalists:", {n: round(t, 4) for n, t in final.items()})
        assert len(times) >= 3, (pass_name, times)
        assert sorted(final) == sorted(sorted(times, key=times.get)[:tuning.FINALISTS])
        # Every pass's space has settings that read through tensor descriptors: tuned with
        # them where the tensors it streams allow (a key of its own): dK/dV streams Q and
        # dO, the forward and dQ stream K and V.
        streamed = (q, do) if pass_name == "dkdv" else (k, v)
        tma = A.attention_forward.tma_ok(q, q, *streamed)
        chosen = tuning._KEPT[(*tuning.key(pass_name, q, k, causal), tma, q.device, kernel)]
        assert tuning.name_of(chosen) == min(final, key=final.get), (pass_name, final)
    A.flash_attention_forward(q, k, v, causal=causal)
    A.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
    assert len(rounds) == 6, "a tuned key is not timed again"
    atol, rtol = A.TOLERANCES[torch.bfloat16]
    want_o, _ = A.attention_reference(q, k, v, causal=causal)
    torch.testing.assert_close(o.double(), want_o, atol=atol, rtol=rtol)
    # The gradients as the table's settings give them (settings passed: nothing tuned).
    table = A.backward_config(64, torch.bfloat16)
    want = A.flash_attention_backward(do, q, k, v, o, lse, causal=causal, **table)
    for got, exp, what in zip(grads, want, "qkv"):
        torch.testing.assert_close(got.float(), exp.float(), atol=atol, rtol=rtol,
                                   msg=f"d{what}")


class _Recorder:
    """A stand-in kernel: what a launch (``kernel[grid](...)``) and a compile-only warmup
    (``kernel.warmup(..., grid=grid)``) were given."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("launch", grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.calls.append(("warmup", grid, args, kwargs))


@pytest.mark.parametrize("which", ["forward", "dkdv", "dq"])
def test_compile_only_compiles_what_the_launch_would_run(which, monkeypatch):
    """The tuner's head start (``compile_only``) must compile the very kernel the launch
    runs: the same grid, arguments, constants, warps and stages."""
    from helpers.kernels.attention import backward as bw
    from helpers.kernels.attention import forward as fw

    recorder = _Recorder()
    q, k, v = qkv(seq_q=40, seq_k=72, d=48)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1])
    tiles = dict(block_m=32, block_n=16, num_warps=4, num_stages=2)
    if which == "forward":
        monkeypatch.setattr(fw, "kernel_for", lambda head_dim: recorder)   # d = 48: split
        go = lambda **how: fw.launch(q, k, v, o, lse, 32, 0.1, **tiles, **how)  # noqa: E731
    elif which == "dkdv":
        monkeypatch.setattr(bw, "attention_bwd_dkdv_kernel", recorder)
        go = lambda **how: bw.launch_dkdv(q, q, k, v, lse, lse, k, v, None, 0.1,  # noqa: E731
                                          **tiles, **how)
    else:
        monkeypatch.setattr(bw, "attention_bwd_dq_kernel", recorder)
        go = lambda **how: bw.launch_dq(q, q, k, v, lse, lse, q, 32, 0.1,  # noqa: E731
                                        **tiles, **how)
    go()
    go(compile_only=True)
    (kind_a, grid_a, args_a, kw_a), (kind_b, grid_b, args_b, kw_b) = recorder.calls
    assert (kind_a, kind_b) == ("launch", "warmup")
    assert grid_a == grid_b and args_a == args_b and kw_a == kw_b
    assert kw_a["num_warps"] == 4 and kw_a["num_stages"] == 2
