"""The explorers build and redraw without a browser, and carry a static picture."""

import base64

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers import hardware, intensity, widgets  # noqa: E402

# A synthetic sweep shaped like a real one (a flat launch floor, then bytes / bandwidth),
# used only to drive the widget here; notebooks pass a recorded sweep.
PEAK = 3000.0
SWEEP = [{"bytes": 2**k, "cold_ms": max(4e-3, 2**k / (PEAK * 1e9) * 1e3),
          "warm_ms": max(3e-3, 2**k / (2 * PEAK * 1e9) * 1e3)} for k in range(13, 32)]


def _is_png(b64: str) -> bool:
    return base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_explorer_static_bundle():
    e = widgets.RooflineExplorer(launch_us=5.0)
    bundle = e._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle, "the live widget is missing"
    assert _is_png(bundle["image/png"]), "the static fallback picture is missing"
    assert "compute-bound" in bundle["text/plain"]          # 4096^3 bf16 matmul on an H100


def test_roofline_explorer_follows_its_controls():
    e = widgets.RooflineExplorer(launch_us=5.0)
    e.controls["op"].value = "vector add"
    assert e.values["op"] == "vector add" and "memory-bound" in e.readout
    assert e.controls["log2_size"].value == intensity.CATALOGUE["vector add"].log2_default
    e.controls["log2_size"].value = intensity.CATALOGUE["vector add"].log2_range[0]
    assert "latency-bound" in e.readout
    e.controls["gpu"].value = "T4"                           # no bf16 tensor cores
    assert "bf16" not in e.controls["dtype"].options
    assert e.values["gpu"] == "T4" and e.values["dtype"] in hardware.GPUS["T4"].peak_tflops


def test_roofline_explorer_prediction_matches_helpers():
    e = widgets.RooflineExplorer(launch_us=2.0, op="softmax", log2_size=10, dtype="fp16")
    pred = e.prediction("H100-SXM", "fp16", "softmax", 10)
    assert f"{pred.time_ms * 1e3:.3g} µs" in e.readout and pred.bound in e.readout


def test_roofline_explorer_with_recorded_points():
    from helpers.roofline import Point

    pts = [Point("a point", 100.0, 200.0)]
    e = widgets.RooflineExplorer(launch_us=5.0, points=pts, points_gpu="H100-SXM",
                                 source="a test")
    assert "squares: a test" in _source_text(e)
    e.controls["gpu"].value = "A100-80GB"                    # points belong to another GPU
    assert "squares" not in _source_text(e)


def _source_text(explorer) -> str:
    import matplotlib.pyplot as plt

    fig = explorer.figure()
    texts = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    return " ".join(texts)


def test_size_explorer_regimes():
    s = widgets.SizeExplorer(SWEEP, peak_gbps=PEAK, gpu_name="test GPU", source="synthetic")
    s.controls["log2_bytes"].value = 14
    assert "latency-bound" in s.readout
    s.controls["log2_bytes"].value = 31
    assert "bandwidth-bound" in s.readout and "100.0% of peak" in s.readout
    assert _is_png(s._repr_mimebundle_()["image/png"])


def test_interpolation_in_log_space():
    assert widgets._interp_loglog(4.0, [1.0, 16.0], [1.0, 16.0]) == pytest.approx(4.0)
    assert widgets._interp_loglog(0.5, [1.0, 2.0], [3.0, 5.0]) == 3.0   # clamped


def test_bad_inputs():
    with pytest.raises(KeyError, match="GPUS"):
        widgets.RooflineExplorer(launch_us=1.0, gpu="Z80")
    with pytest.raises(KeyError, match="CATALOGUE"):
        widgets.RooflineExplorer(launch_us=1.0, op="fft")
    with pytest.raises(ValueError, match="size sweep is empty"):
        widgets.SizeExplorer([], 1.0, "x", "y")
