"""The pictures of the machine build, and the numbers they draw come from the GPU table's
row (and the bandwidths passed in), not from figures typed into the drawing."""

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import hardware  # noqa: E402
from helpers.plots import machine  # noqa: E402


def texts(fig) -> str:
    """Every string drawn in ``fig``: titles, labels, annotations, tick labels."""
    found = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        found += [t.get_text() for t in ax.texts]
        found += [t.get_text() for t in ax.get_yticklabels()]
    return "\n".join(found)


@pytest.mark.parametrize("key", ["H100-SXM", "T4", "B200"])
def test_anatomy_draws_the_tables_sm_count_and_sram(key):
    spec = hardware.GPUS[key]
    fig = machine.gpu_anatomy(spec, 10_000_019, 1024, num_warps=4)
    drawn = texts(fig)
    assert f"{spec.sm_count} SMs" in drawn
    assert f"{spec.smem_per_sm_kib} KiB of shared memory" in drawn
    assert f"{spec.l2_mib:g} MiB" in drawn
    assert f"{spec.hbm_bandwidth_gbs:,.0f} GB/s" in drawn
    assert "source:" in drawn and fig._suptitle.get_text()
    plt.close(fig)


def test_anatomy_draws_the_launchs_grid_and_warps():
    spec = hardware.GPUS["H100-SXM"]
    fig = machine.gpu_anatomy(spec, 10_007, 1024, num_warps=8)
    drawn = texts(fig)
    assert machine.programs(10_007, 1024) == 10
    assert "10 programs" in drawn and "... and" not in drawn  # all ten are drawn
    assert "8 warps x 32 threads" in drawn
    assert "4 elements of the block" in drawn             # 1024 / (8 x 32)
    assert f"10 of {spec.sm_count} SMs busy" in drawn
    plt.close(fig)
    fig = machine.gpu_anatomy(spec, 10_000_019, 1024, shown=16)
    assert f"... and {9766 - 16:,} more" in texts(fig)
    plt.close(fig)


def test_hierarchy_sizes_come_from_the_spec_and_bandwidths_from_the_caller():
    spec = hardware.GPUS["A100-80GB"]
    fig = machine.memory_hierarchy(spec, registers_kib=256,
                                   bandwidths={"L2": (4321.0, "measured"),
                                               "shared memory": (12345.0, "derived")},
                                   source="a record's label")
    drawn = texts(fig)
    assert f"{spec.smem_per_sm_kib} KiB per SM x {spec.sm_count}" in drawn
    assert f"{spec.l2_mib:g} MiB" in drawn
    assert "4,321 GB/s (measured)" in drawn and "12,345 GB/s (derived)" in drawn
    assert f"{spec.hbm_bandwidth_gbs:,.0f} GB/s (datasheet)" in drawn  # HBM falls back
    assert "source: a record's label" in drawn
    plt.close(fig)


def test_hierarchy_levels_are_ordered_fastest_first():
    spec = hardware.GPUS["H100-SXM"]
    names = [lv["name"] for lv in machine.hierarchy_levels(spec)]
    assert names == ["registers", "shared memory", "L2", "HBM"]
    assert machine.hierarchy_levels(spec)[0]["total_kib"] is None  # not given: not drawn
