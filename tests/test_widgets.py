"""The explorers build and redraw without a browser, and carry a static picture; one
change redraws once, and every point drawn stays on the axes (two quirks a real browser
showed in lesson 02's roofline explorer)."""

import base64

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers import hardware, prediction  # noqa: E402
from helpers.plots import explorer  # noqa: E402
from helpers.plots.memory_wall import SizeExplorer, interp_loglog  # noqa: E402
from helpers.plots.roofline import RooflineExplorer  # noqa: E402

# A synthetic sweep shaped like a real one (a flat launch floor, then bytes / bandwidth),
# used only to drive the widget here; notebooks pass a recorded sweep.
PEAK = 3000.0
SWEEP = [{"bytes": 2**k, "cold_ms": max(4e-3, 2**k / (PEAK * 1e9) * 1e3),
          "warm_ms": max(3e-3, 2**k / (2 * PEAK * 1e9) * 1e3)} for k in range(13, 32)]


def _is_png(b64: str) -> bool:
    return base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_explorer_static_bundle():
    e = RooflineExplorer(launch_us=5.0)
    bundle = e._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle, "the live widget is missing"
    assert _is_png(bundle["image/png"]), "the static fallback picture is missing"
    assert "compute-bound" in bundle["text/plain"]          # 4096^3 bf16 matmul on an H100


def test_roofline_explorer_follows_its_controls():
    e = RooflineExplorer(launch_us=5.0)
    e.controls["op"].value = "vector add"
    assert e.values["op"] == "vector add" and "memory-bound" in e.readout
    assert e.controls["log2_size"].value == prediction.CATALOGUE["vector add"].log2_default
    e.controls["log2_size"].value = prediction.CATALOGUE["vector add"].log2_range[0]
    assert "latency-bound" in e.readout
    e.controls["gpu"].value = "T4"                           # no bf16 tensor cores
    assert "bf16" not in e.controls["dtype"].options
    assert e.values["gpu"] == "T4" and e.values["dtype"] in hardware.GPUS["T4"].peak_tflops


def test_roofline_explorer_prediction_matches_helpers():
    e = RooflineExplorer(launch_us=2.0, op="softmax", log2_size=10, dtype="fp16")
    pred = e.prediction("H100-SXM", "fp16", "softmax", 10)
    assert f"{pred.time_ms * 1e3:.3g} µs" in e.readout and pred.bound in e.readout


def test_roofline_explorer_with_recorded_points():
    from helpers.roofline import Point

    pts = [Point("a point", 100.0, 200.0)]
    e = RooflineExplorer(launch_us=5.0, points=pts, points_gpu="H100-SXM",
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
    s = SizeExplorer(SWEEP, peak_gbps=PEAK, gpu_name="test GPU", source="synthetic")
    s.controls["log2_bytes"].value = 14
    assert "latency-bound" in s.readout
    s.controls["log2_bytes"].value = 31
    assert "bandwidth-bound" in s.readout and "100.0% of peak" in s.readout
    assert _is_png(s._repr_mimebundle_()["image/png"])


def test_interpolation_in_log_space():
    assert interp_loglog(4.0, [1.0, 16.0], [1.0, 16.0]) == pytest.approx(4.0)
    assert interp_loglog(0.5, [1.0, 2.0], [3.0, 5.0]) == 3.0   # clamped


def test_bad_inputs():
    with pytest.raises(KeyError, match="GPUS"):
        RooflineExplorer(launch_us=1.0, gpu="Z80")
    with pytest.raises(KeyError, match="CATALOGUE"):
        RooflineExplorer(launch_us=1.0, op="fft")
    with pytest.raises(ValueError, match="size sweep is empty"):
        SizeExplorer([], 1.0, "x", "y")


# --------------------------------------------------------------------------------------
# Quirks seen in a browser: three redraws per GPU change, a star off the axes.
# --------------------------------------------------------------------------------------


def test_one_redraw_per_change():
    e = RooflineExplorer(launch_us=5.0)
    before = e.redraws
    e.controls["gpu"].value = "T4"             # also narrows the dtypes: bf16 -> fp16
    assert e.redraws == before + 1, f"switching the GPU redrew {e.redraws - before} times"
    assert e.values["gpu"] == "T4" and e.values["dtype"] == "fp16"
    before = e.redraws
    e.controls["op"].value = "vector add"      # also moves the size slider's range
    assert e.redraws == before + 1, f"switching the op redrew {e.redraws - before} times"
    assert e.values["log2_size"] == prediction.CATALOGUE["vector add"].log2_default
    before = e.redraws
    e.controls["log2_size"].value = 20
    assert e.redraws == before + 1


def test_gpu_switches_draw_without_errors_or_leftover_figures():
    import warnings

    import matplotlib.pyplot as plt

    e = RooflineExplorer(launch_us=5.0)
    open_before = len(plt.get_fignums())
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # a layout or mathtext warning fails the test
        for gpu in ("T4", "H100-SXM", "A100-80GB", "T4", "B200"):
            e.controls["gpu"].value = gpu
            fig = e.figure()
            fig.canvas.draw()                  # render the tick labels, as a browser does
            plt.close(fig)
    assert len(plt.get_fignums()) == open_before, "a redraw left a figure open"


def test_a_failed_draw_closes_its_figure():
    import matplotlib.pyplot as plt

    e = RooflineExplorer(launch_us=5.0)
    open_before = len(plt.get_fignums())
    with pytest.raises(ValueError, match="no bf16 peak"):
        e.figure(gpu="T4", dtype="bf16")      # a state the controls never offer
    assert len(plt.get_fignums()) == open_before, "the half-drawn figure was left open"


def _inside(ax, x, y) -> bool:
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return x0 <= x <= x1 and y0 <= y <= y1


@pytest.mark.parametrize("op", list(prediction.CATALOGUE))
def test_the_prediction_stays_on_the_axes(op):
    import matplotlib.pyplot as plt

    e = RooflineExplorer(launch_us=5.0, op=op)
    lo, hi = prediction.CATALOGUE[op].log2_range
    for log2_size in (lo, hi):                 # matmul at 2^15: 10,923 FLOP/B
        pred = e.prediction("H100-SXM", "bf16", op, log2_size)
        fig = e.figure(log2_size=log2_size)
        stars = [ln for ln in fig.axes[0].lines if ln.get_marker() == "*"]
        if pred.work.flops:
            assert stars, f"{op} at 2^{log2_size}: no star drawn"
            (x,), (y,) = stars[0].get_xdata(), stars[0].get_ydata()
            assert _inside(fig.axes[0], x, y), (
                f"{op} at 2^{log2_size}: the star ({x:.3g} FLOP/B, {y:.3g} TFLOP/s) lies "
                f"outside the axes {fig.axes[0].get_xlim()} x {fig.axes[0].get_ylim()}")
        plt.close(fig)


def test_the_usual_axes_stay_as_they_were():
    import matplotlib.pyplot as plt

    fig = RooflineExplorer(launch_us=5.0).figure()       # 4096^3 matmul: 1,365 FLOP/B
    assert fig.axes[0].get_xlim() == pytest.approx((1 / 16, 8192))
    plt.close(fig)


def test_log_limits_widen_by_whole_powers():
    assert explorer.log_limits(1 / 16, 8192, [100.0]) == (1 / 16, 8192)
    assert explorer.log_limits(1 / 16, 8192, [10922.7]) == (1 / 16, 32768)
    assert explorer.log_limits(1.0, 8.0, [0.3, None, float("nan"), -1.0]) == (0.125, 8.0)


# --------------------------------------------------------------------------------------
# Lesson 04's tile explorer
# --------------------------------------------------------------------------------------


def test_tile_explorer_draws_its_plan_and_redraws_once():
    from helpers import tile_plan
    from helpers.plots.tiling import TileExplorer

    t = TileExplorer()
    bundle = t._repr_mimebundle_()
    assert _is_png(bundle["image/png"])
    want = tile_plan.plan("H100-SXM", "fp16", 128, 256, 64, 3, 8)
    assert t.readout == "\n".join(want.lines())
    before = t.redraws
    t.controls["num_stages"].value = 6                       # 288 KiB: more than 227
    assert t.redraws == before + 1 and "does NOT fit" in t.readout


def test_tile_plan_counts_sram_and_registers():
    from helpers import hardware, tile_plan

    p = tile_plan.plan("H100-SXM", "fp16", 128, 256, 64, num_stages=3, num_warps=8)
    assert p.sram_bytes == 3 * (128 * 64 + 64 * 256) * 2           # 3 stages of A and B tiles
    assert p.fits and p.sram_limit == 227 * 1024
    assert p.acc_registers == 128 * 256 // (32 * 8)                # fp32 words per thread
    assert tile_plan.smem_per_program(hardware.GPUS["T4"]) == 64 * 1024   # sm_75 keeps none back
    with pytest.raises(KeyError):
        tile_plan.plan("H100-SXM", "fp8", 128, 128, 64)             # not a tl.dot tile type here


def test_k_walk_draws_one_tile_per_step_with_labels():
    import matplotlib.pyplot as plt

    from helpers.plots.tiling import draw_k_walk

    fig, facts = draw_k_walk(512, 768, 512, 128, 256, 64, tile=(1, 1), step=2)
    assert facts == {"k_steps": 8, "bytes_per_step": (128 * 64 + 64 * 256) * 2,
                     "flops_per_step": 2 * 128 * 256 * 64, "accumulator_bytes": 128 * 256 * 4}
    assert "128x256x64" in fig._suptitle.get_text()
    _, ax_b, ax_a, ax_c = fig.axes
    for ax in (ax_a, ax_b, ax_c):
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    # the frame, then one tile per K step (A and B), and the accumulator tile in C
    assert len(ax_a.patches) == len(ax_b.patches) == 1 + 8 and len(ax_c.patches) == 2
    assert len(fig.axes[0].get_legend().get_texts()) == 5
    # the per-step FLOPs and bytes are the prediction that follows the picture: not on it
    shown = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "MFLOP" not in shown and "48 KiB" not in shown and "128x64 tile of A" in shown
    plt.close(fig)
    with pytest.raises(ValueError):
        draw_k_walk(512, 512, 512, 128, 256, 64, tile=(0, 2))   # only 2 columns of tiles


def _rung(step, n, dtype, vs, version=None):
    return {"step": step, "n": n, "dtype": dtype, "vs_cublas": vs,
            "config": {"version": version} if version else {}}


def test_target_lines_name_the_lessons_rung_and_matmul_separately():
    from helpers.performance.targets import TARGETS
    from helpers.plots.tiling import target_lines

    ladder = [_rung("v3_warps", 4096, "fp16", 0.87), _rung("best", 4096, "fp16", 1.0, "v5"),
              _rung("v3_warps", 8192, "fp16", 0.96), _rung("best", 8192, "fp16", 0.94, "v4")]
    lines = target_lines(ladder, {n: TARGETS[f"matmul_{n}"] for n in (4096, 8192)})
    assert lines == [
        "fp16 4096^3, target ≥ 0.9x: lesson 04's best rung 0.87x (not met); "
        "matmul() (v5, lesson 07's) 1.00x (met)",
        "fp16 8192^3, target ≥ 0.95x: lesson 04's best rung 0.96x (met); "
        "matmul() (v4, lesson 07's) 0.94x (not met)"]


def test_order_traffic_lines_count_waves_and_hbm_time():
    from helpers import hardware
    from helpers.plots.tiling import order_traffic_lines

    h100 = hardware.GPUS["H100-SXM"]
    groups = [dict(GROUP_M=g, n=8192, BLOCK_M=128, BLOCK_N=256, dtype="fp16", ms=ms,
                   tflops=2 * 8192**3 / ms / 1e9) for g, ms in ((1, 1.6), (8, 1.5))]
    lines = order_traffic_lines(groups, h100)
    assert lines[0].startswith("8192^3: 2048 tiles, 16 waves of 132 programs")
    assert "GROUP_M=1:" in lines[1] and "GROUP_M=8:" in lines[2]
    assert lines[-1] == "fastest order (GROUP_M=8) against row-major: 1.07x"
