"""Lesson 07's matmul kernel (helpers.kernels.matmul.tuned) against the fp32 product.

Settings of every kind (small tiles, large tiles, split-K) on one-row, odd and
larger-than-tile shapes, row- and column-major operands, the padded path for rows that are
not 16-byte aligned, the edge sizes, the pruning rules and the bucketed key; in CPU mode
the kernel runs in Triton's interpreter, and the tests marked ``gpu`` run it compiled and
autotuned, lean launches included.
"""

from __future__ import annotations

import types

import pytest
import torch

import helpers
from helpers.kernels import matmul as mm
from helpers.kernels.matmul import persistent as mp
from helpers.kernels.matmul import plan as plans
from helpers.kernels.matmul import streamk as sk
from helpers.kernels.matmul import tuned as mt
from helpers.kernels.matmul.config import TileConfig

DEVICE = helpers.device()
CONFIGS = {
    "cpu default": mt.CPU_CONFIG,
    "16-row tile, split 4": TileConfig(16, 32, 32, split_k=4, num_warps=4, num_stages=1),
    "64x64, split 2": TileConfig(64, 64, 32, split_k=2, num_warps=4, num_stages=1),
    "128x128": TileConfig(128, 128, 32, num_warps=4, num_stages=1),
}
SHAPES = [(1, 40, 70), (7, 33, 129), (65, 70, 99), (64, 64, 64)]
# Relative to the largest output. On a GPU, tl.dot multiplies fp32 as TF32 (10-bit
# mantissa), as torch does with allow_tf32: about 1e-3; the interpreter multiplies in fp32.
TOLERANCE = {torch.float32: 1e-4 if helpers.is_cpu() else 5e-3, torch.float16: 2e-2}


def product(M, N, K, dtype, seed=0, a_major="row", b_major="row"):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    b = torch.randn(K, N, generator=g).to(DEVICE, dtype)
    if a_major == "col":
        a = a.t().contiguous().t()
    if b_major == "col":
        b = b.t().contiguous().t()
    return a, b


def assert_product(c, a, b, what):
    want = a.float() @ b.float()
    assert c.shape == want.shape and c.dtype == a.dtype and c.is_contiguous(), what
    err = ((c.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= TOLERANCE.get(a.dtype, 2e-2), \
        f"{what}: worst error {err:.2e} of the largest output"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_kind_of_setting_gives_the_product(name, shape, dtype):
    a, b = product(*shape, dtype)
    assert_product(mt.matmul_tuned(a, b, config=CONFIGS[name]), a, b, f"{name} {shape}")


@pytest.mark.parametrize("majors", [("col", "row"), ("row", "col"), ("col", "col")])
def test_column_major_operands(majors):
    a, b = product(33, 70, 129, torch.float16, a_major=majors[0], b_major=majors[1])
    assert_product(mt.matmul_tuned(a, b), a, b, f"A {majors[0]}-major, B {majors[1]}-major")


def test_rows_that_are_not_16_byte_aligned_are_padded_and_the_result_is_the_product():
    a, b = product(17, 77, 99, torch.float16)        # K = 99 and N = 77: odd row lengths
    pad_a, pad_b, n_padded = plans.needs_padding(a, b)
    assert pad_a and pad_b and n_padded == 80
    c = mt.matmul_tuned(a, b)
    assert c.shape == (17, 77) and c.is_contiguous(), "C is returned as M x N, contiguous"
    assert_product(c, a, b, "padded path")
    aligned_a, aligned_b = product(16, 80, 96, torch.float16)
    assert plans.needs_padding(aligned_a, aligned_b) == (False, False, 80)
    # 192-byte rows start on 16 bytes but not on 128-byte lines.
    assert plans.needs_padding(aligned_a, aligned_b, plans.LINE)[:2] == (True, True)


@pytest.mark.parametrize("shape", [(17, 77, 99), (40, 64, 72), (1, 24, 40)])
def test_the_whole_lines_layout_gives_the_product(shape):
    """The candidate plan that copies A and B into rows of whole 128-byte lines: its C is
    M x N and contiguous whatever the padding, and a second pair through its run()."""
    a, b = product(*shape, torch.float16)
    c, run, _ = mt._v6_plan(a, b, mt.CPU_CONFIG, plans.LINE, False)
    assert c.shape == shape[:2] and c.is_contiguous()
    assert_product(c, a, b, f"whole-lines layout {shape}")
    a2, b2 = product(*shape, torch.float16)
    assert_product(run(a2 + 1, b2), a2 + 1, b2, f"whole-lines plan run again {shape}")


def test_packer_copies_both_operands_into_rows_on_the_boundary_asked_for():
    a = torch.randn(37, 999, dtype=torch.float16).to(DEVICE)   # 1,998-byte rows: not even 16
    b = torch.randn(999, 77, dtype=torch.float16).to(DEVICE)
    for row_bytes in (plans.VECTOR, plans.LINE):
        a_run, b_run = plans.packer(a, 999, b, 80, row_bytes)(a, b)
        assert torch.equal(a_run, a) and torch.equal(b_run[:, :77], b), row_bytes
        assert b_run.shape == (999, 80), "B is run with the column count asked for"
        for t in (a_run, b_run):
            assert (t.stride(0) * t.element_size()) % row_bytes == 0, row_bytes
            if helpers.is_gpu():    # CUDA's allocator starts blocks on 512 bytes; a CPU one
                assert plans.on_rows_of(t, row_bytes), row_bytes   # may start on 64 only
    copy = plans.packer(a, 999, None, 0, plans.LINE)
    first, same_b = copy(a, b)
    assert same_b is b, "an operand not given to the packer is taken as it is"
    again, _ = copy(a + 1, b)
    assert again.data_ptr() == first.data_ptr(), "a later call reuses the packer's buffer"
    assert torch.equal(again, a + 1), "and copies the later operand (the compiled launch)"
    with pytest.raises(ValueError, match="at least their own"):
        plans.packer(a, 500, None, 0, plans.VECTOR)
    assert not plans.on_rows_of(a, plans.VECTOR)


def test_candidate_plans_are_timed_in_turn_and_each_keeps_its_median(monkeypatch):
    # A GPU that slows down over the timing slows every candidate alike: each round times
    # every plan once, in turn, and a plan's time is the median of its rounds.
    calls, slow = [], iter(range(100))
    a, b = torch.zeros(2, 2), torch.zeros(2, 2)

    def time_once(fn, rep=40):
        calls.append(fn())
        return {"v6": 1.0, "persistent": 0.5}[calls[-1]] + next(slow)   # a falling clock

    monkeypatch.setattr(plans, "time_once", time_once)
    runs = {"v6": lambda x, y: "v6", "persistent": lambda x, y: "persistent"}
    times = plans.time_plans(runs, a, b, rounds=3)
    assert calls == ["v6", "persistent"] * 3
    assert times == {"v6": 1.0 + 2, "persistent": 0.5 + 3}
    calls.clear()
    slow = iter(range(100))
    assert plans.time_plans({"persistent": runs["persistent"]}, a, b, rounds=1) == \
        {"persistent": 0.5}


def test_decisions_round_trip_through_tritons_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    decisions = plans.Decisions(salt="test")
    key = "ab" * 32
    assert decisions.get(key) is None
    decision = {"kernel": "v6", "config": dict(mt.CPU_CONFIG), "row_bytes": plans.LINE}
    decisions.put(key, decision)
    assert decisions.get(key) == decision
    assert list(tmp_path.rglob(plans.Decisions.FILE)), "written under TRITON_CACHE_DIR"


@pytest.mark.parametrize("layout", [plans.VECTOR, plans.LINE])
def test_where_cs_rows_are_off_16_bytes_stream_k_plans_stand_in_for_the_persistent_kernel(
        layout):
    # N = 300 fp16: C's rows are 600 bytes. The persistent kernel stores C through a
    # descriptor and cannot run; stream-K stores it from the registers (a 256-column tile
    # in four pieces, each holding columns of C), on B copied onto rows it can read.
    a, b = product(72, 300, 104, torch.float16)
    assert mt._build(a, b, "persistent", None, layout) is None
    found = mt._streamk_plans(a, b, layout, sk.NARROW)
    assert sorted(found) == [("streamk", layout), ("streamk wide", layout)]
    a2, b2 = product(72, 300, 104, torch.float16, seed=1)
    for name, (c, run, chosen) in found.items():
        assert_product(c, a, b, f"{name[0]}, C's rows off 16 bytes")
        assert_product(run(a2, b2), a2, b2, f"{name[0]} launched again")
    assert found["streamk wide", layout][2].block_n == 256
    narrow = sk.NARROW
    assert (narrow.block_m, narrow.block_n, narrow.block_k, narrow.num_warps) == (128, 128, 64, 8)


def test_stream_k_plans_try_the_wide_and_the_narrow_tile_whatever_the_setting():
    # Neither tile wins everywhere (the H200 figures in _streamk_plans' docstring): a setting
    # that is already one of them is not built twice; a third tile brings both others.
    a, b = product(72, 296, 104, torch.float16)
    found = mt._streamk_plans(a, b, plans.VECTOR, sk.WIDE)
    assert sorted(found) == [("streamk", plans.VECTOR), ("streamk narrow", plans.VECTOR)]
    assert found["streamk narrow", plans.VECTOR][2].block_n == 128
    other = TileConfig(64, 128, 64, num_warps=4, num_stages=5, options=mp.NEITHER)
    found = mt._streamk_plans(a, b, plans.VECTOR, other)
    assert sorted(name for name, _ in found) == ["streamk", "streamk narrow", "streamk wide"]
    for name, (c, _, _) in found.items():
        assert_product(c, a, b, name[0])


def test_stream_k_plans_come_with_any_tile_that_leaves_a_wave_tail():
    # The tuned path asks for stream-K plans with tails_only: a setting whose tiles fill whole
    # waves (64 x 64 tiles, one for each SM) brings none of its own, yet the wide and narrow
    # tiles (a quarter and a half of the SMs' worth: part-empty waves) still come.
    a, b = product(64, 64 * mp.sm_count(torch.device(DEVICE)), 64, torch.float16)
    whole_waves = TileConfig(64, 64, 64, num_warps=4, num_stages=2, options=mp.NEITHER)
    assert not mt._wave_tail(a, b, whole_waves) and mt._wave_tail(a, b, sk.WIDE)
    found = mt._streamk_plans(a, b, plans.VECTOR, whole_waves, tails_only=True)
    assert sorted(name for name, _ in found) == ["streamk narrow", "streamk wide"]
    for name, (c, _, _) in found.items():
        assert_product(c, a, b, name[0])


def test_a_decision_saved_as_a_dict_builds_its_plan():
    """A decision on disk holds its setting as the dict of KEYS (a file written before the
    settings became TileConfigs reads the same): the plan built from it runs that setting."""
    a, b = product(33, 40, 72, torch.float16)
    saved = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 2,
             "num_warps": 4, "num_stages": 1}
    c, run, chosen = mt._build(a, b, "v6", saved, plans.VECTOR, verify=False)
    assert chosen == TileConfig(16, 32, 32, split_k=2, num_warps=4, num_stages=1)
    assert dict(chosen) == saved, "and writes it back as the same dict"
    assert_product(c, a, b, "v6 from a saved decision")
    persistent = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "FLATTEN": True,
                  "SPLIT_EPILOGUE": False, "num_warps": 4, "num_stages": 1}
    c, run, chosen = mt._build(a, b, "persistent", persistent, plans.VECTOR, verify=False)
    assert chosen.option("FLATTEN") and chosen.as_dict(mp.KEYS) == persistent
    assert_product(c, a, b, "the persistent kernel from a saved decision")


def test_split_k_counters_are_left_at_zero_and_the_sum_is_the_same_every_run():
    a, b = product(5, 40, 1000, torch.float32)
    config = TileConfig(16, 32, 32, split_k=8, num_warps=4, num_stages=1)
    first = mt.matmul_tuned(a, b, config=config)
    again = mt.matmul_tuned(a, b, config=config)
    assert torch.equal(first, again), "split-K sums the slices in a fixed order"
    assert int(mt._SCRATCH.locks[a.device].abs().sum()) == 0


def test_edge_sizes():
    a, b = product(0, 5, 7, torch.float32)
    assert mt.matmul_tuned(a, b).shape == (0, 5)
    a, b = product(3, 5, 0, torch.float32)
    assert torch.equal(mt.matmul_tuned(a, b), torch.zeros(3, 5, device=DEVICE))


def test_inputs_that_cannot_work_are_refused_with_a_reason():
    a, b = product(4, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="cannot multiply"):
        mt.matmul_tuned(a, b[:3])
    with pytest.raises(ValueError, match="cannot multiply"):
        mt.matmul_tuned(a, b.half())
    with pytest.raises(ValueError, match="config lacks"):
        mt.matmul_tuned(a, b, config={"BLOCK_M": 16})
    with pytest.raises(ValueError, match="no kernel options"):
        mt.matmul_tuned(a, b, config=mt.CPU_CONFIG.with_options(FLATTEN=True))
    with pytest.raises(ValueError, match="2 dimension"):
        mt.matmul_tuned(a[0], b)


def test_what_fits_and_what_is_pruned():
    big = TileConfig(128, 256, 64, num_warps=8, num_stages=4)
    assert big.shared_memory_bytes(torch.float16) == 4 * (128 + 256) * 64 * 2
    assert big.fits("H100-SXM", torch.float16)[0]
    assert not big.fits("H100-SXM", torch.float32)[0], "fp32 tiles are twice the bytes"
    wide = TileConfig(256, 256, 32, num_warps=4, num_stages=2)
    assert "512 registers" in wide.fits()[1], "256 x 256 fp32 over 128 threads"
    assert not mt.useful(big, 16, 4096, 4096)[0], "128 rows for M = 16: padding"
    skinny = TileConfig(16, 64, 128, num_warps=4, num_stages=4)
    assert not mt.useful(skinny, 4096, 4096, 4096)[0], "16 rows: B reused too few times"
    split = TileConfig(64, 64, 128, split_k=8, num_warps=4, num_stages=4)
    assert mt.useful(split, 256, 256, 16384)[0], "16 tiles for 132 SMs: split K"
    assert not mt.useful(split, 4096, 4096, 4096)[0], "4,096 tiles: nothing to gain"
    # prune keeps what verdict keeps: it fits (an H100 in CPU mode) and is worth timing.
    a = torch.empty(16, 4096, dtype=torch.float32, device="meta")
    kept = mt.prune(mt.triton_configs(), {"M": 16, "N": 4096, "K": 4096, "a_ptr": a})
    want = [c for c in mt.CONFIG_SPACE if mt.verdict(c, 16, 4096, 4096, torch.float32)[0]]
    assert [TileConfig.from_triton(c) for c in kept] == want
    assert 0 < len(want) < len(mt.CONFIG_SPACE), "it keeps some settings and drops others"


def test_shapes_share_a_tuning_by_power_of_two_buckets():
    assert mt.shape_key(1, 1000, 4096) == (16, 1024, 4096)
    assert mt.shape_key(300, 1024, 1025) == (512, 1024, 2048)
    assert mt.bucket(16) == 16 and mt.bucket(17) == 32


def test_the_runner_up_is_the_second_best_timing_of_the_key_just_tuned():
    split_8, split_4 = (TileConfig(64, 64, 128, split_k=k, num_warps=4, num_stages=4)
                        for k in (8, 4))
    best, second, third = mt.triton_configs(
        [split_8, split_4, TileConfig(128, 128, 64, num_warps=8, num_stages=4)])
    timings = {third: [3.0, 2.9, 3.1], best: [1.0, 0.9, 1.1], second: [1.5, 1.4, 1.6]}
    tuner = types.SimpleNamespace(cache={"old key": third, "new key": best},
                                  configs_timings=timings)
    got = mt.runner_up(tuner, known={"old key"})
    assert got == split_4, got
    # Nothing learned by this call, timings that belong to another key, or a single
    # setting timed: no second opinion.
    assert mt.runner_up(tuner, known={"old key", "new key"}) is None
    other = types.SimpleNamespace(cache={"new key": third}, configs_timings=timings)
    assert mt.runner_up(other, known=set()) is None
    alone = types.SimpleNamespace(cache={"new key": best}, configs_timings={best: 1.0})
    assert mt.runner_up(alone, known=set()) is None


def test_lesson_04s_matmul_runs_the_tuned_kernel():
    a, b = product(7, 33, 129, torch.float16)
    assert_product(mm.matmul(a, b), a, b, "matmul()")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (333, 777, 1999), (1000, 1000, 1000),
                                   (256, 256, 16384), (2048, 2048, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
def test_compiled_autotuned_and_lean_launches(shape, dtype):
    a, b = product(*shape, dtype)
    first = mt.matmul_tuned(a, b)                    # tunes, then keeps a plan
    assert_product(first, a, b, f"first call {shape}")
    again = mt.matmul_tuned(a, b)                    # the plan's direct launch
    assert torch.equal(first, again), f"the direct launch differs from the first {shape}"
    c, d = product(*shape, dtype, seed=1)
    assert_product(mt.matmul_tuned(c, d), c, d, f"new inputs through the plan {shape}")


def test_sizes_past_32_bit_offsets_get_a_clear_error():
    from helpers.kernels import checks
    with pytest.raises(ValueError, match="32-bit offsets"):
        checks.check_32bit_offsets(torch.empty(65536, 32768, device="meta"), "a")
    checks.check_32bit_offsets(torch.empty(65536, 32767, device="meta"), "a")   # 2^31 - 65536
    a = torch.zeros(65536, 16, dtype=torch.float16).to(DEVICE)     # A and B are small,
    b = torch.zeros(16, 32768, dtype=torch.float16).to(DEVICE)     # C has 2^31 elements
    with pytest.raises(ValueError, match="the product C spans"):
        mt.matmul_tuned(a, b)
