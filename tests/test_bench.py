"""Unit arithmetic of measurements, and side-by-side tables."""

import pytest

from helpers import bench, runtime
from helpers.bench import Comparison, Measurement


def test_gbps_and_tflops():
    assert bench.gbps(3.35e9, 1.0) == pytest.approx(3350.0)  # 3.35 GB in 1 ms
    assert bench.tflops(2 * 8192**3, 1.4) == pytest.approx(785.4, rel=1e-3)


def test_fraction_of_peak():
    assert bench.fraction_of_peak(3000, 3350) == pytest.approx(0.8955, rel=1e-3)
    with pytest.raises(ValueError):
        bench.fraction_of_peak(1, 0)


def test_zero_time_is_refused():
    with pytest.raises(ValueError, match="positive milliseconds"):
        bench.gbps(1e9, 0)


def comparison():
    rows = [Measurement("torch", 2.0, nbytes=6e9), Measurement("triton", 1.6, nbytes=6e9)]
    return Comparison("vector add", rows, baseline="torch", peak_gbps=3350, source="recorded")


def test_comparison_ratios_and_fractions():
    c = comparison()
    assert c.speedup("triton") == pytest.approx(1.25)
    table = {r["implementation"]: r for r in c.table()}
    assert table["triton"]["GB/s"] == pytest.approx(3750)
    assert table["torch"]["% of peak GB/s"] == pytest.approx(100 * 3000 / 3350)


def test_comparison_text_and_round_trip():
    c = comparison()
    text = c.to_text()
    assert "vector add" in text and "speed-up vs torch" in text and "(recorded)" in text
    again = Comparison.from_dict(c.as_dict(), source="recorded")
    assert again.table() == c.table()
    assert "<table>" in c._repr_html_()


def test_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="baseline"):
        Comparison("x", [Measurement("a", 1.0)], baseline="b")


def test_timing_in_cpu_mode_is_refused():
    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    with pytest.raises(runtime.NeedsGPUError):
        bench.time_ms(lambda: None)
