"""The roofline chart, and lesson 02's two static figures: intensity against size, and the
roofline record's measured points by family, each with a title, labelled axes and a legend."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import hardware, roofline  # noqa: E402
from helpers.plots import roofline as roofline_plots  # noqa: E402

from support import committed_record  # noqa: E402


def test_intensity_versus_size_draws_the_ops_and_both_ridges():
    gpu = hardware.GPUS["H100-SXM"]
    fig, ax = plt.subplots()
    roofline_plots.draw_intensity_versus_size(ax, gpu, sizes=[64, 128, 256])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("matmul" in s for s in labels) and any("vector add" in s for s in labels)
    assert sum("ridge point" in s for s in labels) == 2
    assert "FLOP/byte" in ax.get_ylabel() and ax.get_title()
    plt.close(fig)


def test_measured_points_one_family_per_legend_entry():
    rec = committed_record("roofline", "H100-SXM")
    points = rec.results["points"]
    ax = roofline_plots.plot_measured_points(hardware.lookup(rec.gpu), points, source=rec.label)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    families = dict.fromkeys(roofline_plots.family(p) for p in points)
    assert all(any(f"measured: {f}" == s for s in labels) for f in families)
    assert len(ax.texts) >= len(points)
    plt.close(ax.figure)


def test_plot_has_labels_units_and_source():
    pt = roofline.Point("copy", 0.125, 0.4)
    ax = roofline_plots.plot(hardware.GPUS["H100-SXM"], dtypes=("fp32", "bf16"), points=[pt],
                             source="recorded on X")
    assert "FLOP/byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("bf16 roof" in t for t in labels) and any(t.startswith("copy") for t in labels)
    assert any("recorded on X" in t.get_text() for t in ax.texts)
    plt.close(ax.figure)
