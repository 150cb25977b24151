"""Lesson 09's figures and tables draw from a record (``tests/fp8_fixture.py``, made-up
numbers) and from a table computed in CPU mode: titles, units, a source line on every
axes, the GPU's roofs from helpers.hardware, and the lesson's targets judged."""

import matplotlib
import pytest

import fp8_fixture
from helpers import hardware
from helpers.plots import fp8 as plots

matplotlib.use("Agg")


def _sources(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_text().startswith("source:")]


@pytest.fixture
def rec():
    return fp8_fixture.record()


def test_accuracy_rows_and_plot_keep_one_order(rec):
    rows = plots.accuracy_rows(rec.results["accuracy"])
    assert list(rows[0]) == ["outliers x", *plots.ACCURACY_ORDER]
    ax = plots.plot_accuracy_record(rec)
    assert [line.get_label() for line in ax.get_lines()] == list(plots.ACCURACY_ORDER)
    assert "made up" in _sources(ax)[0] and "K=512" in _sources(ax)[0]


def test_accumulation(rec):
    rows = plots.accumulation_rows(rec)
    assert list(rows[0])[:5] == ["signs", "K", "never promoted", "promoted every 128",
                                 "block scales"]
    top = [r for r in rows if r["K"] == 65536]
    assert {r["signs"]: r["never / promoted"] for r in top} == {"mixed": 5.0, "positive": 100.0}
    fig = plots.plot_accumulation(rec)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert ax.get_title().startswith("The sum over K") and ax.get_ylabel()
        assert len(ax.get_lines()) == 3 and _sources(ax)


def test_speed_rows_and_a_failed_version(rec):
    rows = plots.speed_rows(rec)
    assert [r["shape"] for r in rows] == ["4096x4096x4096", "8192x8192x8192"]
    assert rows[0]["fp8 / bf16"] == pytest.approx(1260 / 700)
    assert rows[1]["course bf16"] == "-"
    assert plots.speedup(rec, (8192, 8192, 8192)) == pytest.approx(1.8)
    with pytest.raises(KeyError, match="no speed entry"):
        plots.speed_entry(rec, (1, 2, 3))


def test_speed_plot_draws_both_roofs(rec):
    ax = plots.plot_speed(rec)
    gpu = hardware.lookup(rec.gpu)
    roofs = {line.get_ydata()[0] for line in ax.get_lines()}
    assert roofs == {gpu.peak("fp8"), gpu.peak("bf16")}
    assert ax.get_ylabel() == "TFLOP/s" and _sources(ax)
    assert len(ax.patches) == len(plots.SPEED_COLUMNS) * 2


def test_roofline_places_fp8_at_twice_the_bf16_intensity_less_c(rec):
    points = {p.label: p for p in plots.roofline_points(rec, (4096, 4096, 4096))}
    n = 4096
    fp8_bytes = 2 * n * n + 2 * n * n                          # A and B one byte, C bf16
    assert points["ours, tensor scales"].intensity == pytest.approx(2 * n**3 / fp8_bytes)
    assert points["torch.matmul, bf16"].intensity == pytest.approx(2 * n**3 / (6 * n * n))
    ax = plots.plot_roofline(rec, (4096, 4096, 4096))
    assert "4096x4096x4096" in ax.get_title()


def test_quantize_rows(rec):
    rows = {r["kernel"]: r for r in plots.quantize_rows(rec)}
    assert rows["quantize, 1x128"]["of copy GB/s"] == pytest.approx(2500 / 2800)
    rec.results["quantize"]["row"] = {"error": "made up"}
    assert {r["kernel"]: r for r in plots.quantize_rows(rec)}["quantize, row"]["GB/s"] == "-"
    assert "quantize_delayed, tensor" not in rows, "an older record has no delayed row"
    assert {r["timed"] for r in rows.values()} == {"call"}, "a record without call_ms"
    rec.results["quantize"]["delayed"] = {"ms": 0.1, "bytes": 1, "gbps": 2700.0,
                                          "call_ms": 0.2}
    rows = {r["kernel"]: r for r in plots.quantize_rows(rec)}
    assert rows["quantize_delayed, tensor"]["of copy GB/s"] == pytest.approx(2700 / 2800)
    assert {r["timed"] for r in rows.values()} == {"graph"}, "call_ms: the graph was timed"


def test_targets(rec):
    rows = {t["target"]: t for t in plots.targets(rec)}
    assert len(rows) == 4
    scaled_mm = next(t for name, t in rows.items() if "_scaled_mm" in name)
    assert scaled_mm["measured"] == pytest.approx(1.05) and scaled_mm["met"]
    bf16 = next(t for name, t in rows.items() if "bf16" in name)
    assert "1 without it" in bf16["target"]                   # its run failed at one shape
    assert bf16["measured"] == pytest.approx(1260 / 690) and bf16["met"]
    block = next(t for name, t in rows.items() if "block" in name)
    assert block["measured"] == pytest.approx(1150 / 1260) and block["met"]
    assert "met" in plots.format_targets(plots.targets(rec))


def test_targets_take_cublas_on_padded_operands_where_it_refused(rec):
    from helpers.experiments.fp8 import PADDED

    versions = rec.results["speed"][0]["versions"]
    for v in versions:
        if v["name"] == "torch._scaled_mm, tensor scales":
            v.clear()
            v.update({"name": "torch._scaled_mm, tensor scales", "error": "not divisible by 16"})
    ms = next(v["ms"] for v in versions if v["name"] == "ours, tensor scales")
    versions.append({"name": PADDED, "ms": ms * 1.25, "tflops": 1000.0})
    target = plots.targets(rec)[0]
    assert "worst of 2 shapes" in target["target"] and "without" not in target["target"]
    assert target["measured"] == pytest.approx(1.05)          # shape 1's 1260 / 1200
    assert plots.speed_rows(rec)[0][plots.PADDED_COLUMN] == 1000.0
    rec.results["speed"][0]["versions"] = [v for v in versions if v["name"] != PADDED]
    assert "1 without it" in plots.targets(rec)[0]["target"]
    text = plots.format_targets([{**plots.targets(rec)[0], "measured": None, "met": False}])
    assert "missing" in text and "NOT met" in text


def test_the_formats_and_a_computed_table_draw_in_cpu_mode():
    from helpers.experiments import fp8 as experiment

    table = experiment.accuracy_table(smoke=True)
    assert [r["outlier_scale"] for r in table] == list(experiment.OUTLIER_SCALES)
    ax = plots.plot_accuracy(table, "computed here")
    assert _sources(ax) == ["source: computed here"]
    assert plots.plot_formats().get_yscale() == "log"
