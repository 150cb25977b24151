"""Lesson 08's pictures of one routing: tokens per expert and the tiles a grouped GEMM runs.

Both are drawn from ``counts``, the rows (token copies) each expert got from
:func:`helpers.kernels.moe.dispatch`, so a notebook can draw a routing it made a moment
ago, in either mode, and the imbalance explorer (:mod:`helpers.exercises.moe`) redraws them
as its controls move.
"""

from __future__ import annotations

from ..intensity import tiles_per_expert
from . import finish


def draw_tokens_per_expert(ax, counts, block_m: int, capacity: int | None = None, *,
                           title: str = "Tokens per expert", source: str = "") -> dict:
    """Bars of each expert's rows: those kept, the padding up to whole ``block_m`` tiles
    (computed and thrown away) and, with a ``capacity``, the copies dropped above it.
    Returns the totals drawn: kept, padding and dropped rows, the busiest expert."""
    counts = [int(c) for c in counts]
    kept = [min(c, capacity) for c in counts] if capacity is not None else counts
    pad = [t * block_m - k for t, k in zip(tiles_per_expert(kept, block_m), kept)]
    dropped = [c - k for c, k in zip(counts, kept)]
    xs = range(len(counts))
    ax.bar(xs, kept, width=1.0, color="C0", label="rows kept")
    ax.bar(xs, pad, width=1.0, bottom=kept, color="0.75", hatch="//", edgecolor="0.55",
           lw=0, label=f"padding to {block_m}-row tiles: {sum(pad):,} rows")
    if capacity is not None:
        top = [k + p for k, p in zip(kept, pad)]
        ax.bar(xs, dropped, width=1.0, bottom=top, color="C3",
               label=f"dropped over the capacity: {sum(dropped):,} copies")
        ax.axhline(capacity, color="C3", ls="--", lw=1, label=f"capacity: {capacity:,} rows")
    mean = sum(counts) / len(counts)
    ax.axhline(mean, color="0.2", ls=":", lw=1, label=f"mean: {mean:,.0f} rows")
    ax.set_xlim(-0.5, len(counts) - 0.5)
    ax.set_ylim(bottom=0)
    finish(ax, title=title, xlabel="expert", ylabel="rows (token copies)", source=source)
    return {"kept": sum(kept), "padding": sum(pad), "dropped": sum(dropped),
            "max": max(counts), "mean": mean}


def draw_tiles(ax, counts, block_m: int, *, source: str = "") -> int:
    """The grouped GEMM's row tiles in launch order: each expert's rows cut into
    ``block_m``-row tiles, the real rows coloured by expert, the padding hatched. An
    expert with no rows has no tile. Returns the number of tiles."""
    from matplotlib.patches import Patch, Rectangle

    x = 0
    tiles = tiles_per_expert(counts, block_m)
    for e, (c, t) in enumerate(zip(counts, tiles)):
        colour = f"C{e % 10}"
        for i in range(t):
            real = min(block_m, int(c) - i * block_m)
            ax.add_patch(Rectangle((x, 0), real, 1, color=colour, ec="white", lw=0.5))
            if real < block_m:
                ax.add_patch(Rectangle((x + real, 0), block_m - real, 1, fc="0.9",
                                       hatch="//", ec="0.55", lw=0.5))
            ax.add_patch(Rectangle((x, 0), block_m, 1, fill=False, ec="black", lw=1))
            x += block_m
        if t:
            ax.text(x - t * block_m / 2, 1.08, f"e{e}", ha="center", fontsize=8)
    ax.set_xlim(0, max(x, block_m))
    ax.set_ylim(0, 1.3)
    ax.set_yticks([])
    ax.legend(handles=[Patch(color="C0", label="rows of an expert (colour = expert)"),
                       Patch(fc="0.9", hatch="//", ec="0.55", label="padding rows")],
              fontsize=8, loc="lower right")
    rows = sum(int(c) for c in counts)
    finish(ax, title=f"{sum(tiles)} row tiles of {block_m} rows for {rows} sorted rows",
           xlabel="sorted row (padded to whole tiles)", ylabel="tile", source=source,
           legend=False)
    return sum(tiles)


def plot_balancing(runs: dict, axes=None):
    """Lesson 08's load-balancing runs (:mod:`helpers.exercises.moe_balancing`): the busiest
    expert's load over the mean at each step, and the task loss, one line per policy."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    source = "trained just now on this machine (helpers.exercises.moe_balancing)"
    for i, (policy, run) in enumerate(runs.items()):
        steps = range(1, len(run.load_over_mean) + 1)
        axes[0].plot(steps, run.load_over_mean, color=f"C{i}", label=policy)
        axes[1].plot(steps, run.task_loss, color=f"C{i}", label=policy)
    axes[0].axhline(1.0, color="0.3", ls=":", lw=1, label="even load")
    finish(axes[0], title="Busiest expert's load while the router trains", xlabel="step",
           ylabel="busiest expert / mean (copies)", source=source)
    axes[1].set_yscale("log")
    finish(axes[1], title="Task loss", xlabel="step", ylabel="mean squared error", source=source)
    return axes
