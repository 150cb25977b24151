"""The noise experiment (the course's one cuBLAS reference per GPU and its run-to-run spread):
its checks run in CPU mode, its statistics and clock readers work without a GPU, its tables
read, and its committed GPU record (skipped until there is one) is whole."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest

from helpers.experiments import noise as experiment
from helpers.plots import noise as plots
from helpers.runtime import NeedsGPUError
from support import committed_record


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run times")
def test_smoke_run_checks_every_product_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.noise(smoke=True)


def test_stats_give_median_range_and_spread():
    rounds = [{"ms": 1.0, "tflops": t, "sm_clock_mhz": None, "power_w": None}
              for t in (700.0, 690.0, 720.0, 705.0)]
    s = experiment.stats(rounds)
    assert (s["tflops_median"], s["tflops_min"], s["tflops_max"]) == (702.5, 690.0, 720.0)
    assert s["spread"] == pytest.approx(30 / 702.5) and s["rounds"] == rounds


def test_nvidia_smi_lines_parse_and_a_missing_value_is_none():
    got = experiment.parse_smi("1755, 1980, 612.40, 700.00, 61")
    assert got == {"sm_clock_mhz": 1755.0, "max_sm_mhz": 1980.0, "power_w": 612.4,
                   "power_limit_w": 700.0, "temperature_c": 61.0}
    assert experiment.parse_smi("1755, [N/A], 612.40")["max_sm_mhz"] is None
    assert set(experiment.parse_smi("").values()) == {None}


def test_the_sampler_averages_what_it_read_and_skips_missing_values():
    reads = iter([{"sm_clock_mhz": 1900.0, "power_w": None}] + [
        {"sm_clock_mhz": 1700.0, "power_w": 600.0}] * 1000)
    with experiment.Sampler(period=0.001, read=lambda: next(reads)) as s:
        while len(s.samples) < 3:
            pass
    mean = s.mean
    assert 1700 <= mean["sm_clock_mhz"] < 1900 and mean["power_w"] == 600.0
    with experiment.Sampler(period=0.001, read=lambda: {"sm_clock_mhz": None,
                                                        "power_w": None}) as s:
        pass
    assert s.mean == {"sm_clock_mhz": None, "power_w": None}


def _entry(tflops, clock=1800.0, power=650.0):
    return experiment.stats([{"ms": 1.0, "tflops": t, "sm_clock_mhz": clock, "power_w": power}
                             for t in tflops])


SYNTHETIC = {
    "reference": {"bf16 8192^3": {**_entry([690.0, 700.0, 720.0]), "n": 8192},
                  "fp16 4096^3": {**_entry([600.0, 610.0, 620.0]), "n": 4096}},
    "identical_configs": {"config": {"rung": "v5", "label": "v5 TMA, persistent", "n": 4096,
                                     "dtype": "fp16", "setting": {}},
                          "a": _entry([700.0, 640.0, 690.0]), "b": _entry([650.0, 660.0, 655.0])},
    "clocks": {"max_sm_mhz": 1980.0, "power_limit_w": 700.0}, "rounds": 3,
    "sustained": {"key": "bf16 8192^3", "windows": [
        {"t_s": 0.25 * i, "ms": 1.6, "tflops": 760.0 - 10 * i, "sm_clock_mhz": 1980.0 - 30 * i,
         "power_w": 690.0} for i in range(6)]}}


def test_cublas_reference_is_the_median_with_its_range():
    ref = plots.cublas_reference(SYNTHETIC, "bf16 8192^3")
    assert (ref["tflops_median"], ref["tflops_min"], ref["tflops_max"]) == (700.0, 690.0, 720.0)
    assert ref["spread"] == pytest.approx(30 / 700) and ref["rounds"] == 3
    with pytest.raises(KeyError, match="fp16 4096"):
        plots.cublas_reference(SYNTHETIC, "fp8 4096^3")


def test_identical_gap_compares_medians_and_the_extreme_rounds():
    gap = plots.identical_gap(SYNTHETIC)
    assert gap["medians"] == pytest.approx(690 / 655 - 1)
    assert gap["rounds"] == pytest.approx(700 / 640 - 1)


def test_spread_table_lists_every_product_and_the_identical_launches():
    text = plots.spread_table(SYNTHETIC)
    assert "bf16 8192^3" in text and "identical a (v5 TMA, persistent)" in text
    assert "4.3%" in text, "the spread of bf16: 30 over a median of 700"
    assert "power limit 700 W" in text


def test_plot_rounds_draws_both_panels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax, ax2, ax3 = plots.plot_rounds(SYNTHETIC)
    assert ax.get_ylabel() == ax2.get_ylabel() == "TFLOP/s" and ax3.get_ylabel() == "power (W)"
    without = {k: v for k, v in SYNTHETIC.items() if k != "sustained"}
    assert len(plots.plot_rounds(without)) == 1
    plt.close("all")


def test_sustained_summary_compares_the_first_window_with_those_at_the_limit():
    s = plots.sustained_summary(SYNTHETIC)
    assert s["first"] == {"tflops": 760.0, "sm_clock_mhz": 1980.0, "power_w": 690.0}
    assert s["windows_at_limit"] == s["windows"] == 6 and s["reached_s"] == 0.0
    assert s["at_limit"]["tflops"] == 735.0
    assert plots.sustained_summary(SYNTHETIC, near=1.0) is None, "no window at the limit"


@pytest.fixture(scope="module")
def rec():
    return committed_record("noise")


def test_record_is_whole(rec):
    r = rec.results
    assert {"bf16 8192^3", "fp16 4096^3"} <= set(r["reference"])
    for entry in [*r["reference"].values(), r["identical_configs"]["a"],
                  r["identical_configs"]["b"]]:
        assert entry["tflops_min"] <= entry["tflops_median"] <= entry["tflops_max"]
        assert len(entry["rounds"]) == r["rounds"]
    assert plots.spread_table(rec)
