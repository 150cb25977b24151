"""Pictures of the machine: where a launch's programs run (lesson 00) and the memories the
data passes through (lesson 01).

Both figures draw the numbers of one row of :data:`helpers.hardware.GPUS` (SMs, shared
memory per SM, L2, HBM) and, for the hierarchy, bandwidths the lesson passes in from its
records. They draw; they never measure. Every figure has a title and a source line.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from . import add_source, finish

WARP = 32  # threads per warp on every NVIDIA GPU


def programs(n: int, block: int) -> int:
    """Programs a 1-D launch starts: ``ceil(n / block)``, the launcher's grid."""
    return -(-n // block)


def _box(ax, x, y, w, h, text="", color="white", fontsize=7, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="0.3", lw=0.6, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _blank(ax, title: str):
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("auto")
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def gpu_anatomy(spec, n: int, block: int, *, num_warps: int = 4, source: str = "",
                shown: int = 48):
    """Three panels: the grid of ``ceil(n / block)`` programs, the ``spec``'s SMs they run on
    (the first wave colour-coded), and one program as ``num_warps`` warps of 32 threads.

    The SM count, shared memory per SM, L2 and HBM come from ``spec``; nothing is typed in.
    Returns the figure.
    """
    n_prog = programs(n, block)
    sms = spec.sm_count
    fig, (ax_grid, ax_chip, ax_prog) = plt.subplots(
        1, 3, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.35, 1]})
    cmap = plt.get_cmap("tab20")

    # 1. the grid: one square per program, coloured by the SM that takes it in the first wave
    _blank(ax_grid, f"1. the grid: {n_prog:,} programs")
    cols = 8
    k = min(n_prog, shown)
    size = 0.8 / cols
    for pid in range(k):
        r, c = divmod(pid, cols)
        _box(ax_grid, 0.1 + c * size, 0.82 - (r + 1) * size, size * 0.92, size * 0.92,
             str(pid), color=cmap(pid % sms % 20), fontsize=5)
    rows_used = -(-k // cols)
    y = 0.82 - rows_used * size - 0.06
    if n_prog > k:
        ax_grid.text(0.5, y, f"... and {n_prog - k:,} more", ha="center", fontsize=7)
        y -= 0.07
    ax_grid.text(0.5, 0.9, f"n = {n:,} elements, BLOCK_SIZE = {block:,}\n"
                           f"ceil(n / BLOCK_SIZE) = {n_prog:,} programs", ha="center", fontsize=7)
    ax_grid.text(0.5, max(y, 0.02), "first wave: program i starts on SM i\n(colours repeat every 20)", ha="center",
                 fontsize=6, color="0.35")

    # 2. the chip: the SMs, their shared memory, the L2 they share, HBM off the chip
    _blank(ax_chip, f"2. the {spec.name}: {sms} SMs")
    cols_sm = math.ceil(math.sqrt(sms * 1.6))
    rows_sm = -(-sms // cols_sm)
    w, h = 0.9 / cols_sm, 0.5 / rows_sm
    busy = min(n_prog, sms)
    for i in range(sms):
        r, c = divmod(i, cols_sm)
        _box(ax_chip, 0.05 + c * w, 0.93 - (r + 1) * h, w * 0.9, h * 0.85,
             color=cmap(i % 20) if i < busy else "0.92")
    ax_chip.text(0.5, 0.37, f"each SM: up to {spec.smem_per_sm_kib} KiB of shared memory, "
                            "carved from the SRAM its L1 cache uses too; warp schedulers, cores",
                 ha="center", fontsize=7)
    _box(ax_chip, 0.05, 0.22, 0.9, 0.1, f"L2 cache, {spec.l2_mib:g} MiB, shared by all {sms} SMs",
         color="#fde9c9")
    _box(ax_chip, 0.05, 0.04, 0.9, 0.12,
         f"HBM (off the chip): {spec.memory_gib:g} GiB at {spec.hbm_bandwidth_gbs:,.0f} GB/s",
         color="#d9e7f5")
    waves = n_prog / sms
    ax_chip.text(0.5, 0.955, f"{busy} of {sms} SMs busy in the first wave; "
                             f"{waves:,.2f} programs per SM in all", ha="center", fontsize=7)

    # 3. one program: num_warps warps of 32 threads, each thread a few elements
    per_thread = block / (num_warps * WARP)
    _blank(ax_prog, f"3. one program: {num_warps} warps x {WARP} threads")
    lane_w = 0.9 / WARP
    row_h = min(0.12, 0.6 / num_warps)
    for wi in range(num_warps):
        y0 = 0.8 - (wi + 1) * row_h * 1.3
        for lane in range(WARP):
            _box(ax_prog, 0.05 + lane * lane_w, y0, lane_w * 0.9, row_h, color=cmap(0))
        ax_prog.text(0.05, y0 + row_h * 1.05, f"warp {wi}", fontsize=6, va="bottom")
    ax_prog.text(0.5, 0.88, f"{num_warps * WARP} threads share the {block:,} elements",
                 ha="center", fontsize=7)
    per = f"{per_thread:g} elements" if per_thread >= 1 else "a fraction of an element"
    ax_prog.text(0.5, 0.05, f"each thread: {per} of the block;\na warp's 32 threads run "
                            "one instruction together", ha="center", fontsize=7)

    fig.suptitle(f"A launch of {n_prog:,} programs on the {spec.name}", fontsize=11)
    add_source(ax_chip, textwrap.fill(source or _spec_source(spec), 110))
    fig.subplots_adjust(left=0.02, right=0.98, top=0.84, bottom=0.16, wspace=0.08)
    return fig


def _spec_source(spec) -> str:
    return (f"helpers.hardware.GPUS[{spec.key!r}] (datasheet and whitepaper figures); "
            "the grid from the launch's n and BLOCK_SIZE")


def _size(kib: float) -> str:
    for unit, scale in (("GiB", 2**20), ("MiB", 2**10)):
        if kib >= scale:
            return f"{kib / scale:,.3g} {unit}"
    return f"{kib:,.0f} KiB"


def hierarchy_levels(spec, registers_kib: float | None = None,
                     bandwidths: dict | None = None) -> list[dict]:
    """The four levels, fastest first: name, where, size per SM and in all (KiB), and the
    bandwidth (GB/s) with how it was obtained, where ``bandwidths`` gives one
    (``{"shared memory": (gbps, "derived"), "L2": (gbps, "measured"), "HBM": (...)}``).
    HBM falls back to the datasheet figure of ``spec``."""
    bw = dict(bandwidths or {})
    bw.setdefault("HBM", (spec.hbm_bandwidth_gbs, "datasheet"))
    sms = spec.sm_count
    levels = [
        {"name": "registers", "where": "each thread's own",
         "per_sm_kib": registers_kib, "total_kib": registers_kib and registers_kib * sms},
        {"name": "shared memory", "where": "each SM's SRAM, less what L1 keeps",
         "per_sm_kib": spec.smem_per_sm_kib, "total_kib": spec.smem_per_sm_kib * sms},
        {"name": "L2", "where": "on the chip, shared by all SMs",
         "per_sm_kib": None, "total_kib": spec.l2_mib * 1024},
        {"name": "HBM", "where": "off the chip",
         "per_sm_kib": None, "total_kib": spec.memory_gib * 2**20},
    ]
    for lv in levels:
        lv["gbps"], lv["how"] = bw.get(lv["name"], (None, ""))
    return levels


def memory_hierarchy(spec, *, registers_kib: float | None = None,
                     bandwidths: dict | None = None, source: str = ""):
    """The memory hierarchy of ``spec``: a stack of levels (size per SM and in all) beside
    their bandwidths on a log scale. Sizes come from ``spec`` (and ``registers_kib`` per SM,
    from the device's report); bandwidths from ``bandwidths`` (the lesson's records).
    Returns the figure."""
    levels = hierarchy_levels(spec, registers_kib, bandwidths)
    fig, (ax_stack, ax_bw) = plt.subplots(1, 2, figsize=(11, 4.4),
                                          gridspec_kw={"width_ratios": [1.1, 1]})
    _blank(ax_stack, "where the bytes live: faster at the top, larger at the bottom")
    colors = ["#e6d4f2", "#d4f0d4", "#fde9c9", "#d9e7f5"]
    for i, (lv, color) in enumerate(zip(levels, colors)):
        width = 0.45 + 0.5 * i / (len(levels) - 1)      # wider going down: larger
        y = 0.76 - i * 0.235
        size = "size not given" if lv["total_kib"] is None else (
            f"{_size(lv['per_sm_kib'])} per SM x {spec.sm_count} = {_size(lv['total_kib'])}"
            if lv["per_sm_kib"] else _size(lv["total_kib"]))
        _box(ax_stack, 0.5 - width / 2, y, width, 0.2,
             f"{lv['name']} ({lv['where']})\n{size}", color=color)

    shown = [lv for lv in levels if lv["gbps"]]
    ys = range(len(shown))
    ax_bw.barh(list(ys), [lv["gbps"] for lv in shown],
               color=[colors[levels.index(lv)] for lv in shown], edgecolor="0.3",
               label="bandwidth (all SMs together)")
    for y, lv in zip(ys, shown):
        ax_bw.text(lv["gbps"], y, f" {lv['gbps']:,.0f} GB/s ({lv['how']})", va="center",
                   fontsize=7)
    ax_bw.set_yticks(list(ys), [lv["name"] for lv in shown])
    ax_bw.invert_yaxis()
    ax_bw.set_xscale("log")
    top = max(lv["gbps"] for lv in shown)
    ax_bw.set_xlim(min(lv["gbps"] for lv in shown) / 2, top * 12)
    finish(ax_bw, title="how fast they deliver", xlabel="bandwidth (GB/s, log scale)",
           ylabel="level", source=textwrap.fill(source or _spec_source(spec), 90))
    fig.suptitle(f"The memory hierarchy of the {spec.name}", fontsize=11)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.85, bottom=0.2, wspace=0.3)
    return fig
