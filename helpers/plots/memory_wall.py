"""Lesson 01's figures: copy time versus size, from launch latency to HBM bandwidth.

:func:`draw_size_sweep` draws a recorded size sweep (``records.get("memory_wall")``);
:class:`SizeExplorer` puts a slider on it: pick a copy size, see where it falls.
"""

from __future__ import annotations

import math

from . import add_source
from .explorer import Explorer, readout_box


def interp_loglog(x: float, xs, ys) -> float:
    """Interpolate ``ys(x)`` linearly in log-log space (sizes and times span decades)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    raise ValueError("sizes must be increasing")


def draw_size_sweep(ax, sweep: list[dict], peak_gbps: float, marker_bytes: float | None = None,
                    source: str = "") -> dict:
    """Copy time versus bytes moved (log-log): measured cold and warm, and the model.

    Returns the launch floor and, if ``marker_bytes`` is given, the interpolated
    measurement there.
    """
    xs = [r["bytes"] for r in sweep]
    cold_us = [r["cold_ms"] * 1e3 for r in sweep]
    warm_us = [r["warm_ms"] * 1e3 for r in sweep]
    floor_us = min(cold_us)
    ax.loglog(xs, cold_us, "o-", ms=4, label="measured, L2 flushed before each run")
    ax.loglog(xs, warm_us, "s--", ms=3, label="measured, data already in L2 (back to back)")
    if "wall_us_per_call" in sweep[0]:
        ax.loglog(xs, [r["wall_us_per_call"] for r in sweep], ":", color="0.5",
                  label="host clock per call from a Python loop")
    model = [max(floor_us, b / (peak_gbps * 1e9) * 1e6) for b in xs]
    ax.loglog(xs, [b / (peak_gbps * 1e9) * 1e6 for b in xs], color="k", lw=1,
              label=f"bytes / datasheet bandwidth ({peak_gbps:,.0f} GB/s)")
    ax.axhline(floor_us, color="C3", lw=1, ls="-.",
               label=f"launch floor: {floor_us:.3g} µs (smallest measured time)")
    info = {"floor_us": floor_us, "model_us": model}
    if marker_bytes is not None:
        t = interp_loglog(marker_bytes, xs, cold_us)
        ax.plot([marker_bytes], [t], "*", color="C3", ms=16, zorder=5)
        info["marker_us"] = t
    ax.set_xlabel("bytes moved per copy (read + write, B)")
    ax.set_ylabel("time per copy (µs)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    if source:
        add_source(ax, source)
    return info


def format_bytes(b: float) -> str:
    """``1.5 MiB``, ``12 KiB``, ``300 B``: binary units, four significant figures."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.4g} {unit}"
    return f"{b:.0f} B"


class SizeExplorer(Explorer):
    """Lesson 01: pick a copy size, see where it falls: latency-bound or bandwidth-bound."""

    figsize = (8, 5)

    def __init__(self, sweep: list[dict], peak_gbps: float, gpu_name: str, source: str,
                 log2_bytes: int | None = None):
        import ipywidgets as w

        if not sweep:
            raise ValueError("the size sweep is empty: pass record.results['size_sweep']")
        self.sweep = sorted(sweep, key=lambda r: r["bytes"])
        self.peak_gbps = float(peak_gbps)
        self.gpu_name = gpu_name
        self.source = source
        # The slider stays inside the measured sizes, so the star is always on the curve.
        lo = math.ceil(math.log2(self.sweep[0]["bytes"]))
        hi = math.floor(math.log2(self.sweep[-1]["bytes"]))
        default = log2_bytes if log2_bytes is not None else (lo + hi) // 2
        slider = w.IntSlider(value=min(max(default, lo), hi), min=lo, max=hi, step=1,
                             description="log2(bytes)", continuous_update=False)
        super().__init__({"log2_bytes": slider}, [slider])

    def draw(self, ax, log2_bytes: int) -> str:
        nbytes = 2.0**log2_bytes
        info = draw_size_sweep(ax, self.sweep, self.peak_gbps, marker_bytes=nbytes,
                               source=self.source)
        t_us = info["marker_us"]
        gbps = nbytes / (t_us * 1e-6) / 1e9
        transfer_us = nbytes / (self.peak_gbps * 1e9) * 1e6
        regime = "latency-bound" if transfer_us < info["floor_us"] else "bandwidth-bound"
        ax.set_title(f"Copy time versus size on the {self.gpu_name}")
        text = (f"copy moving {format_bytes(nbytes)}: measured {t_us:.3g} µs\n"
                f"effective bandwidth {gbps:,.0f} GB/s = {100 * gbps / self.peak_gbps:.1f}% "
                f"of peak\nat peak bandwidth the bytes alone take {transfer_us:.3g} µs: "
                f"{regime}")
        readout_box(ax, text)
        return text


def draw_peaks_versus_bandwidth(ax, gpus) -> None:
    """Lesson 01's first figure: each GPU of the table (``hardware.GPUS.values()``) as its
    peak fp16 tensor TFLOP/s against its memory bandwidth, one colour per architecture,
    with dashed lines of constant FLOP per byte."""
    import numpy as np

    from . import finish

    gpus = list(gpus)
    for i, arch in enumerate(dict.fromkeys(g.architecture for g in gpus)):
        gs = sorted((g for g in gpus if g.architecture == arch), key=lambda g: g.hbm_bandwidth_gbs)
        ax.scatter([g.hbm_bandwidth_gbs for g in gs], [g.peak("fp16") for g in gs], s=40,
                   color=f"C{i}", label=arch, zorder=3)
        for j, g in enumerate(gs):  # alternate label heights so neighbours do not overlap
            ax.annotate(g.key, (g.hbm_bandwidth_gbs, g.peak("fp16")), fontsize=7,
                        xytext=(4, 3 if j % 2 == 0 else -10), textcoords="offset points")
    bw = np.geomspace(200, 10_000)
    for ridge in (50, 100, 200, 400):
        ax.plot(bw, ridge * bw / 1e3, color="0.75", lw=0.8, ls="--")
        ax.annotate(f"{ridge} FLOP/B", (bw[-1], ridge * bw[-1] / 1e3), fontsize=7, color="0.5")
    ax.set_xscale("log")
    ax.set_yscale("log")
    finish(ax, title="Peak fp16 tensor throughput versus memory bandwidth",
           xlabel="peak memory bandwidth (GB/s)", ylabel="peak fp16 tensor throughput (TFLOP/s)",
           source="datasheet figures, helpers.hardware.GPUS (each row names its source); "
                  "dashed lines: constant FLOP per byte")


def draw_peak_shares(ax, rows: list[tuple[str, float, float]], gpu_name: str,
                     source: str = "") -> None:
    """Pairs of bars, one pair per op: ``(label, % of peak bandwidth, % of the compute peak
    that applies)`` as the lesson computes them from the ``memory_wall`` record."""
    from . import finish

    pos = list(range(len(rows)))
    ax.bar([p - 0.2 for p in pos], [r[1] for r in rows], 0.4,
           label="bandwidth, % of datasheet peak")
    ax.bar([p + 0.2 for p in pos], [r[2] for r in rows], 0.4,
           label="FLOP rate, % of the peak that applies (fp32 or bf16)")
    ax.set_xticks(pos, [r[0] for r in rows], fontsize=8)
    ax.set_ylim(0, 120)  # headroom for the legend
    finish(ax, title=f"What each op uses of the {gpu_name}", xlabel="op (implementation)",
           ylabel="percent of datasheet peak (%)", source=source)
