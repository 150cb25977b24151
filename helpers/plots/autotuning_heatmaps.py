"""Lesson 07's heatmaps, drawn from the autotuning records (one per GPU): TFLOP/s over tile x
warps x stages for each recorded shape.

* :func:`plot_heatmaps`: one row of panels per GPU, so that the winner's move from shape
  to shape and from GPU to GPU is seen at once; :func:`winners` says the same in a table.
* :class:`HeatmapExplorer`: one heatmap, one (warps, stages) column of it at a time.
* :func:`gpu_key`: how a record's GPU is named in every table of the lesson (a setting's
  name, :func:`~helpers.experiments.autotuning.describe`, is the experiment's).

Every figure and table names its source (the record's label). Nothing here measures.
"""

from __future__ import annotations

from ..experiments.autotuning import describe
from ..kernels.matmul.space import KEYS
from . import finish
from .explorer import Explorer, new_figure, readout_box


def gpu_key(rec) -> str:
    return rec.provenance.get("gpu_key", rec.gpu)


def _setting(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEYS)


# --- Heatmaps: one shape, every setting. --------------------------------------------------


def heatmap(entry: dict) -> dict:
    """One recorded heatmap as a grid: a row per tile, a column per (warps, stages)."""
    rows = entry["rows"]
    tile = lambda r: (r["BLOCK_M"], r["BLOCK_N"], r["BLOCK_K"], r.get("SPLIT_K", 1))  # noqa: E731
    tiles = sorted({tile(r) for r in rows}, key=lambda t: (t[0] * t[1], t))
    cols = sorted({(r["num_warps"], r["num_stages"]) for r in rows})
    tflops, errors = ([[None] * len(cols) for _ in tiles] for _ in range(2))
    for r in rows:
        i, j = tiles.index(tile(r)), cols.index((r["num_warps"], r["num_stages"]))
        if r.get("tflops") is not None and (tflops[i][j] or 0) < r["tflops"]:
            tflops[i][j] = r["tflops"]
        elif r.get("tflops") is None:
            errors[i][j] = r.get("error", "no time recorded")
    timed = [r for r in rows if r.get("tflops")]
    best = max(timed, key=lambda r: r["tflops"]) if timed else None
    return {"tiles": tiles, "cols": cols, "tflops": tflops, "errors": errors, "best": best,
            "rows": rows}


def tflops_of(entry: dict, config: dict) -> float | None:
    """The recorded TFLOP/s of one setting on one heatmap shape (None: not in the sweep,
    or it did not run)."""
    want = _setting(config)
    hits = [r["tflops"] for r in entry["rows"] if _setting(r) == want and r.get("tflops")]
    return max(hits) if hits else None


def _tile_label(t) -> str:
    return f"{t[0]}x{t[1]}x{t[2]}" + (f" /{t[3]}" if t[3] > 1 else "")


def draw_heatmap(ax, rec, entry: dict, column: tuple | None = None, source: bool = True):
    """Every setting of one shape, coloured by its share of the fastest and labelled with
    its TFLOP/s: the fastest boxed, lesson 04's setting starred, what does not fit crossed;
    ``column`` (warps, stages) outlined. Returns the grid (:func:`heatmap`) and the image."""
    import numpy as np
    from matplotlib.patches import Rectangle

    h = heatmap(entry)
    best = h["best"]
    top = best["tflops"] if best else 1.0
    share = np.array([[np.nan if v is None else v / top for v in row] for row in h["tflops"]])
    im = ax.imshow(share, cmap="viridis", aspect="auto", vmin=0, vmax=1)
    for i, row in enumerate(h["tflops"]):
        for j, v in enumerate(row):
            ax.text(j, i, "x" if v is None else f"{v:.0f}", ha="center", va="center",
                    fontsize=7, color="0.4" if v is None else ("black" if v > 0.6 * top
                                                                else "white"))
    ax.set_xticks(range(len(h["cols"])))
    ax.set_xticklabels([f"w{w}\ns{s}" for w, s in h["cols"]], fontsize=7)
    ax.set_yticks(range(len(h["tiles"])))
    ax.set_yticklabels([_tile_label(t) for t in h["tiles"]], fontsize=7)

    def cell(c):
        return (h["cols"].index((c["num_warps"], c["num_stages"])),
                h["tiles"].index((c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.get("SPLIT_K", 1))))

    if best:
        j, i = cell(best)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2.2,
                               label="the fastest"))
    fixed = rec.results.get("fixed")
    if fixed and tflops_of(entry, fixed):
        j, i = cell(fixed)
        ax.plot([j + 0.3], [i - 0.25], "*", color="white", mec="black", ms=8,
                label="lesson 04's setting")
    if column is not None and column in h["cols"]:
        j = h["cols"].index(column)
        ax.add_patch(Rectangle((j - 0.5, -0.5), 1, len(h["tiles"]), fill=False, ec="orange",
                               lw=1.5, ls="--", label=f"w{column[0]} s{column[1]}"))
    ax.plot([], [], "x", color="0.4", ls="none", label="does not fit")
    finish(ax, title=f"{gpu_key(rec)}: {entry['label']}\n{entry['M']}x{entry['N']}x{entry['K']} "
           f"{entry['dtype']}", xlabel="num_warps (w), num_stages (s)",
           ylabel="tile BLOCK_M x BLOCK_N x BLOCK_K", source=rec.label, legend=False)
    ax.grid(False)
    if not source:                       # a grid of panels carries one source line
        ax.texts[-1].remove()
    return h, im


def plot_heatmaps(recs, labels=None):
    """One row of heatmaps per record (GPU), one column per recorded shape."""
    recs = list(recs)
    labels = labels or [e["label"] for e in recs[0].results["heatmaps"]]
    fig, axes = new_figure((3.3 * len(labels) + 1, 3.9 * len(recs) + 0.9), nrows=len(recs),
                           ncols=len(labels), squeeze=False)
    im = None
    for r, rec in enumerate(recs):
        by_label = {e["label"]: e for e in rec.results["heatmaps"]}
        for c, label in enumerate(labels):
            ax = axes[r][c]
            if label in by_label:
                _, im = draw_heatmap(ax, rec, by_label[label], source=False)
            else:
                ax.set_axis_off()
                ax.set_title(f"{gpu_key(rec)}: {label}\nnot recorded")
            if c:
                ax.set_ylabel("")
    fig.suptitle("One kernel, every setting: TFLOP/s in each cell, colour = share of the "
                 "shape's fastest (red box)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower right", ncol=3, fontsize=8, frameon=False)
    fig.text(0.01, 0.005, "source: " + "; ".join(r.label for r in recs), fontsize=7,
             color="0.35")
    fig.tight_layout(rect=(0, 0.04, 0.93, 1))
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), label="share of the shape's fastest",
                     shrink=0.7, pad=0.02)
    return fig


def winners(recs) -> list[dict]:
    """Per GPU and shape: the fastest setting, and what other choices would have given, as
    a share of it: lesson 04's setting, the first shape's winner and, when several GPUs
    were recorded, each GPU's winner (its own: 100 %)."""
    out = []
    for rec in recs:
        entries = rec.results["heatmaps"]
        first_best = heatmap(entries[0])["best"]
        for e in entries:
            best = heatmap(e)["best"]
            if best is None:
                continue
            row = {"GPU": gpu_key(rec), "shape": e["label"], "fastest setting": describe(best),
                   "TFLOP/s": best["tflops"]}
            fixed = tflops_of(e, rec.results.get("fixed") or {})
            row["lesson 04's setting"] = _share(fixed, best["tflops"])
            row[f"{entries[0]['label']}'s winner"] = _share(tflops_of(e, first_best),
                                                             best["tflops"])
            for other in recs if len(recs) > 1 else ():   # every row: the same columns
                theirs = {x["label"]: x for x in other.results["heatmaps"]}.get(e["label"])
                win = heatmap(theirs)["best"] if theirs else None
                row[f"{gpu_key(other)}'s winner"] = _share(
                    tflops_of(e, win) if win else None, best["tflops"])
            out.append(row)
    return out


def _share(value, best) -> str:
    return "not run" if not value else f"{value / best:.0%}"


# --- The explorer: one heatmap, one column of it at a time. -------------------------------


class HeatmapExplorer(Explorer):
    """Pick a GPU, a shape and a (warps, stages) column of its heatmap; read the best tile
    in that column against the best setting overall."""

    figsize = (7.5, 5.2)

    def __init__(self, recs, shape: str | None = None, column: tuple = (8, 4)):
        import ipywidgets as w

        self.recs = {gpu_key(r): r for r in recs}
        first = next(iter(self.recs.values()))
        labels = [e["label"] for e in first.results["heatmaps"]]
        cols = heatmap(first.results["heatmaps"][0])["cols"]
        gpu_w = w.Dropdown(options=list(self.recs), description="GPU")
        shape_w = w.Dropdown(options=labels, value=shape or labels[0], description="shape")
        warps, stages = sorted({c[0] for c in cols}), sorted({c[1] for c in cols})
        warps_w = w.Dropdown(options=warps, value=column[0] if column[0] in warps else warps[0],
                             description="num_warps")
        stages_w = w.Dropdown(options=stages, value=column[1] if column[1] in stages
                              else stages[0], description="num_stages")
        super().__init__({"gpu": gpu_w, "shape": shape_w, "warps": warps_w, "stages": stages_w},
                         [w.HBox([gpu_w, shape_w]), w.HBox([warps_w, stages_w])])

    def on_change(self, name, change):
        if name == "gpu":
            labels = [e["label"] for e in self.recs[change["new"]].results["heatmaps"]]
            shape = self.controls["shape"]
            keep = shape.value if shape.value in labels else labels[0]
            shape.options, shape.value = labels, keep

    def draw(self, ax, gpu, shape, warps, stages) -> str:
        rec = self.recs[gpu]
        entry = next(e for e in rec.results["heatmaps"] if e["label"] == shape)
        h, _ = draw_heatmap(ax, rec, entry, column=(warps, stages))
        best = h["best"]
        j = h["cols"].index((warps, stages)) if (warps, stages) in h["cols"] else None
        column = [(v, t) for t, v in zip(h["tiles"], (row[j] for row in h["tflops"]))
                  if v is not None] if j is not None else []
        near = sum(1 for r in h["rows"] if r.get("tflops") and r["tflops"] >= 0.95 * best["tflops"])
        lines = [f"best overall: {describe(best)}, {best['tflops']:.0f} TFLOP/s",
                 f"settings within 5% of it: {near} of {len(h['rows'])}"]
        if column:
            v, t = max(column)
            lines.append(f"best in w{warps} s{stages}: {_tile_label(t)}, {v:.0f} TFLOP/s "
                         f"({v / best['tflops']:.0%} of the best)")
        else:
            lines.append(f"nothing ran with w{warps} s{stages}")
        fixed = tflops_of(entry, rec.results.get("fixed") or {})
        if fixed:
            lines.append(f"lesson 04's setting: {fixed / best['tflops']:.0%} of the best")
        return "\n".join(lines)

    def axes(self):
        # The heatmap above, the readout in a strip of its own below (not over the cells).
        fig, (self._heat_ax, self._text_ax) = new_figure(
            self.figsize, nrows=2, gridspec_kw={"height_ratios": [5, 1]})
        return fig, self._heat_ax

    def decorate(self, fig) -> None:
        self._text_ax.set_axis_off()
        readout_box(self._text_ax, self.readout)
        self._text_ax.legend(*self._heat_ax.get_legend_handles_labels(), loc="upper right",
                             fontsize=7, frameon=False)
