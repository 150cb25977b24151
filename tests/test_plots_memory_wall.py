"""Lesson 01's two static figures draw what they are given: every GPU of the table, and one
pair of bars per op, each with a title, labelled axes and a legend."""

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import hardware  # noqa: E402
from helpers.plots import memory_wall as wall  # noqa: E402


def test_peaks_versus_bandwidth_labels_every_gpu_of_the_table():
    fig, ax = plt.subplots()
    wall.draw_peaks_versus_bandwidth(ax, hardware.GPUS.values())
    labels = {t.get_text() for t in ax.texts}
    assert set(hardware.GPUS) <= labels, "every GPU of the table is named on the scatter"
    assert ax.get_title() and "GB/s" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert ax.get_legend() is not None
    plt.close(fig)


def test_peak_shares_draws_one_pair_of_bars_per_op():
    rows = [("copy (Triton)", 90.0, 0.0), ("matmul (cuBLAS)", 8.1, 74.6)]
    fig, ax = plt.subplots()
    wall.draw_peak_shares(ax, rows, "NVIDIA H100 SXM5 80GB", source="a record")
    heights = sorted(round(p.get_height(), 1) for p in ax.patches)
    assert heights == pytest.approx(sorted([90.0, 0.0, 8.1, 74.6]))
    assert [t.get_text() for t in ax.get_xticklabels()] == [r[0] for r in rows]
    assert "H100" in ax.get_title() and "%" in ax.get_ylabel()
    plt.close(fig)
