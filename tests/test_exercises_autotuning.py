"""The exercise checks of lesson 07 (autotuning): shared memory and registers of a setting,
the tunings a bucketed key needs, the programs of a split-K launch, and the predictions
read from a record. Right answers pass; each classic slip is named; unanswered exercises
say so.

The expected values are written out here from the formulas, so a change to the kernel
module's arithmetic that breaks them fails this test."""

import torch

from helpers import records
from helpers.experiments import autotuning as experiment
from helpers.exercises import autotuning as ex
from helpers.kernels.matmul.config import TileConfig
from support import assert_unanswered
from test_autotuning import _fixture

BIG = TileConfig(128, 256, 64, num_warps=8, num_stages=3)
SPLIT = TileConfig(64, 64, 128, split_k=8, num_warps=4, num_stages=4)


def test_shared_memory():
    # 3 stages x (128 x 64 of A + 64 x 256 of B) x 2 bytes = 147,456 bytes.
    assert ex.check_shared_memory(147_456, BIG)
    assert ex.check_shared_memory(294_912, BIG, torch.float32)
    assert "one stage" in ex.check_shared_memory(49_152, BIG).message
    assert "4 bytes an element" in ex.check_shared_memory(294_912, BIG).message
    assert "2 bytes an element" in ex.check_shared_memory(147_456, BIG, torch.float32).message
    assert "elements, not bytes" in ex.check_shared_memory(73_728, BIG).message
    assert "B tile alone" in ex.check_shared_memory(3 * 64 * 256 * 2, BIG).message
    assert "output tile" in ex.check_shared_memory(3 * 128 * 256 * 2, BIG).message
    assert not ex.check_shared_memory(150_000, BIG)
    assert_unanswered(ex.check_shared_memory(None, BIG))


def test_registers():
    # 128 x 256 fp32 values over 8 warps of 32 threads: 128 a thread.
    assert ex.check_registers(128, BIG)
    assert "warps, not threads" in ex.check_registers(4096, BIG).message
    assert "whole tile" in ex.check_registers(128 * 256, BIG).message
    assert "num_warps" in ex.check_registers(1024, BIG).message
    assert_unanswered(ex.check_registers(..., BIG))


def test_buckets():
    # M from 1 to 300 with N = K = 4096: buckets 16 (1-16), 32, 64, 128, 256, 512.
    shapes = [(m, 4096, 4096) for m in range(1, 301)]
    assert ex.buckets(shapes) == 6 and ex.check_buckets(6, shapes)
    assert "counted every shape" in ex.check_buckets(300, shapes).message
    assert "floor" in ex.check_buckets(10, shapes).message          # 1, 2, 4, 8 and 16 apart
    pow2 = [(1024, 1024, 1024), (1000, 1000, 1000), (1010, 1010, 1010), (2048, 2048, 2048)]
    assert ex.check_buckets(2, pow2)
    assert "bit_length" in ex.check_buckets(3, pow2).message
    assert_unanswered(ex.check_buckets(None, shapes))


def test_split_k_programs():
    # 256 x 256 in 64 x 64 tiles: 16 tiles, 8 slices of K each.
    assert ex.check_split_k_programs(128, 256, 256, SPLIT)
    assert "output tiles" in ex.check_split_k_programs(16, 256, 256, SPLIT).message
    assert "rounded the tiles down" in ex.check_split_k_programs(72, 250, 250, SPLIT).message
    assert ex.check_split_k_programs(128, 250, 250, SPLIT)
    assert_unanswered(ex.check_split_k_programs(None, 256, 256, SPLIT))


def test_predictions_from_a_record():
    rec = _fixture()
    assert ex.check_same_winner("no", rec, "square", "skinny")
    assert not ex.check_same_winner("yes", rec, "square", "skinny")
    assert "128x256x64 w8 s4" in ex.check_same_winner("yes", rec, "square", "skinny").message
    assert ex.check_same_winner("yes", rec, "square", "square")
    assert ex.check_launch_bound("host", rec) and not ex.check_launch_bound("gpu", rec)
    assert ex.check_launch_bound("host-bound", rec)
    assert ex.check_split_k_chosen("yes", rec, "long K 256")
    assert ex.check_split_k_chosen("no", rec, "square 8192")
    assert_unanswered(ex.check_launch_bound(None, rec))
    assert not ex.check_same_winner("maybe", rec, "square", "skinny")


def test_every_sweep_shape_falls_in_a_group_and_every_group_has_shapes():
    assert ex.shape_group("square 4096") == "squares" and ex.shape_group("skinny MLP") == \
        "few rows"
    assert ex.shape_group("off grid 1000^3") == "off grid" and ex.shape_group("odd") == "odd"
    assert [ex.shape_group(lb) for lb, *_ in experiment.SHAPES].count("few rows") == 4
    assert {ex.shape_group(lb) for lb, *_ in experiment.SHAPES} == set(ex.GROUPS)


def test_where_the_persistent_kernel_is_kept():
    rec = _fixture()          # kept at 8192^3 alone, in both dtypes
    assert ex.persistent_groups(rec) == {"squares"}
    assert ex.check_persistent_groups(["squares"], rec)
    assert ex.check_persistent_groups(" Squares", rec)
    extra = ex.check_persistent_groups(["squares", "long K"], rec)
    assert not extra and "'long K' kept v6 on all 2" in extra.message
    assert "left out" not in extra.message
    # Feedback names the slip, never the group left out.
    missed = ex.check_persistent_groups(["few rows"], rec)
    assert not missed and "left out 1 group" in missed.message
    assert "squares" not in missed.message and "'few rows' kept v6" in missed.message
    assert "not a group" in ex.check_persistent_groups(["big squares"], rec).message
    assert "a list" in ex.check_persistent_groups(3, rec).message
    assert_unanswered(ex.check_persistent_groups(None, rec))
    sentences = ex.kernel_patterns(rec)
    assert sentences[0] == ("squares: the persistent kernel on 2 of 2 (square 8192 fp16, "
                            f"square 8192 bf16; {2048 / 132:.2g} tiles per SM).")
    assert sentences[2] == f"long K: the persistent kernel on 0 of 2, v6 on 2 ({16 / 132:.2g} " \
        "tiles per SM)."


def test_the_prediction_against_the_committed_records():
    for gpu in records.available("autotuning"):
        rec = records.load("autotuning", gpu)
        kept = ex.persistent_groups(rec)
        assert kept == {ex.shape_group(s["label"]) for s in rec.results["shapes"]
                        if s.get("tuned_kernel") == "persistent"}
        assert ex.check_persistent_groups(sorted(kept), rec)
        others = sorted(set(ex.GROUPS) - kept)
        if others:
            assert not ex.check_persistent_groups(sorted(kept) + others[:1], rec)
        assert len(ex.kernel_patterns(rec)) == len(ex.GROUPS)


def test_waves():
    # 1440 x 1424: 12 x 12 = 144 tiles of 128 x 128 on 132 SMs, one wave and 12 tiles.
    assert ex.check_waves(2, 1440, 1424, 132)
    assert_unanswered(ex.check_waves(None, 1440, 1424, 132))
    assert "rounded down" in ex.check_waves(1, 1440, 1424, 132).message
    assert "the last wave is paid whole" in ex.check_waves(1.09, 1440, 1424, 132).message
    assert "you counted tiles" in ex.check_waves(144, 1440, 1424, 132).message
    assert ex.check_waves(1, 1408, 1536, 132)             # 11 x 12 = 132 tiles: one full wave


def test_the_drawn_records_wave_rows_read_their_rows():
    from helpers.plots import autotuning as at_plots

    for gpu in records.available("matmul_shapes"):
        rec = records.load("matmul_shapes", gpu)
        rows = at_plots.wave_rows(rec)
        tails = [r for r in rec.results["rows"] if r["family"] == "tail"]
        assert len(rows) == len(tails) > 0
        for row, r in zip(rows, tails):
            assert row["waves paid"] == -(-row["tiles"] // rec.results["sms"])
            assert 0 < row["last wave full"] <= 1
            assert row["ours/cuBLAS"] == r["vs_cublas"]
            # A tail shape lands a few tiles past a whole wave (the experiment's promise).
            assert row["last wave full"] < 0.25, row
        summary = at_plots.drawn_summary_rows(rec)
        assert [s["rows"] for s in summary] == ["all", "aligned", "unaligned"]
        assert summary[0]["ours/cuBLAS"] == rec.results["summary"]["all"]["geomean"]
        families = at_plots.drawn_family_rows(rec)
        assert sum(f["shapes"] for f in families) == len(rec.results["rows"])
        for f in families:
            mine = [r for r in rec.results["rows"] if r["family"] == f["family"]
                    and r["aligned"] == (f["rows"] == "aligned")]
            assert f["worst"] == min(r["vs_cublas"] for r in mine)
            assert min(r["vs_cublas"] for r in mine) <= f["ours/cuBLAS"] \
                <= max(r["vs_cublas"] for r in mine)
        plans = at_plots.drawn_plan_rows(rec)
        furthest = sorted(rec.results["rows"], key=lambda r: r["vs_cublas"])[:len(plans)]
        for plan, r in zip(plans, furthest):
            assert plan["shape"] == f"{r['M']}x{r['N']}x{r['K']}"
            kept = r["choice"]["candidates_ms"]
            assert plan["ours us"] == r["ours_ms"] * 1e3
            # Every candidate ran on the operands as given or on copies: the two columns'
            # best is the best the tuner timed, and the plan it kept is that one.
            timed = [t for t in (plan["best as given"], plan["best on copies"]) if t != "-"]
            assert min(timed) == min(kept.values()) * 1e3
            fastest = min(kept, key=kept.get)
            assert fastest.endswith(r["choice"]["layout"]), (fastest, r["choice"])
