"""Lesson 05 (fusion): the committed GPU record the notebook draws from (complete,
correct, and meeting the targets), and the tables and figures drawn from it."""

import matplotlib
import pytest
import torch

from helpers import intensity, launches
from helpers.experiments import fusion as experiment
from helpers.kernels import softmax
from helpers.plots import fusion as fusion_plots

from support import committed_record  # tests/support.py

matplotlib.use("Agg")


# --------------------------------------------------------------------------------------
# The committed record
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rec():
    return committed_record("fusion")


def _comparisons(rec):
    r = rec.results
    return r["softmax"] + r["softmax_long_rows"] + [r["bias_gelu"], r["swiglu"], r["rmsnorm"]]


def test_record_is_complete_and_every_version_ran(rec):
    r = rec.results
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    assert {(e["dtype"], e["n"]) for e in r["softmax"]} == {
        (d, n) for d in experiment.SOFTMAX_DTYPES for n in experiment.SOFTMAX_NS}
    assert [e["n"] for e in r["softmax_long_rows"]] == list(experiment.LONG_ROW_NS)
    for entry in _comparisons(rec):
        for row in entry["rows"]:
            assert "error" not in row and row["ms"] > 0, (entry["title"], row)


def test_record_shows_our_kernels_correct_on_the_gpu(rec):
    for entry in _comparisons(rec):
        for row in entry["rows"]:
            if "Triton" in row["name"] or "registers" in row["name"] or "online" in row["name"]:
                assert row["within_tolerance"], (entry["title"], row)


def test_record_meets_the_lessons_targets(rec):
    for t in fusion_plots.targets(rec):
        assert t["met"] in (True, None), f"{t['target']}: {t['measured']:.3g} < {t['goal']}"


def test_record_matches_the_napkin_math_it_was_made_with(rec):
    r = rec.results
    e = next(e for e in r["softmax"] if e["n"] == 4096 and e["dtype"] == "fp16")
    naive = next(x for x in e["rows"] if x["name"].startswith("naive"))
    assert naive["bytes"] == intensity.softmax(e["m"], e["n"], torch.float16, "naive").nbytes
    traced = launches.Trace.from_list(r["traces"]["residual_rmsnorm_eager"]["calls"])
    eager = intensity.residual_rmsnorm(*experiment.RMSNORM_SHAPE, torch.bfloat16, "eager")
    assert traced.bytes == eager.nbytes
    ops = [c["op"] for c in r["traces"]["residual_rmsnorm_torch"]["calls"]]
    assert ops == ["aten.add", "aten._fused_rms_norm"], "F.rms_norm is one kernel on a GPU"


def test_record_long_rows_justify_the_switch_to_the_online_kernel(rec):
    by_n = {e["n"]: e for e in rec.results["softmax_long_rows"]}

    def ms(n, name):
        return next(x["ms"] for x in by_n[n]["rows"] if x["name"] == name)

    # The longest row kept in registers is still faster than reading it twice; the next
    # length spills; twice that, spilling has made the row-in-registers kernel the slower.
    fits, spills = softmax.MAX_FUSED_BLOCK, 2 * softmax.MAX_FUSED_BLOCK
    assert ms(fits, "row in registers (v1)") < ms(fits, "online, two passes")
    assert by_n[fits]["v1_compiled"].get("n_spills") == 0
    assert by_n[spills]["v1_compiled"].get("n_spills", 0) > 0
    assert ms(2 * spills, "row in registers (v1)") > ms(2 * spills, "online, two passes")


def test_tables_and_plots_say_where_their_numbers_come_from(rec):
    text = fusion_plots.comparison(rec, "rmsnorm").to_text()
    assert "fused Triton" in text and rec.label in text
    assert len(fusion_plots.softmax_rows(rec)) == len(rec.results["softmax"])
    for draw in (fusion_plots.plot_softmax, fusion_plots.plot_long_rows,
                 fusion_plots.plot_roofline):
        ax = draw(rec)
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert any(rec.label in t.get_text() for t in ax.texts), f"{draw.__name__} has no source"
        assert ax.get_legend() is not None
        matplotlib.pyplot.close(ax.figure)


def test_fusion_moves_every_op_right_and_up_on_the_roofline(rec):
    points = fusion_plots.roofline_points(rec)
    for before, after in zip(points[::2], points[1::2]):
        assert after.intensity > before.intensity and after.tflops > before.tflops, (before, after)
