"""Lesson 07's figures and tables, drawn from the autotuning records (one per GPU).

* The heatmaps (:func:`plot_heatmaps`, :func:`winners`, :class:`HeatmapExplorer`) live in
  :mod:`~helpers.plots.autotuning_heatmaps` and are re-exported here, so the lesson reads
  every figure from one module.
* :func:`shape_rows`, :func:`geomeans`, :func:`plot_sweep`: the tuned kernel against
  ``torch.matmul`` and lesson 04's single setting, shape by shape; :func:`targets` checks
  the lesson's goals against a record.
* :func:`plot_costs`: what tuning costs (cold, cached, untuned) and what a call costs on
  the host (launchers, CUDA graph replay) against the kernel's own GPU time.
* :func:`prune_rows`: the pruning decisions of :mod:`helpers.kernels.matmul.tuned` for one
  shape; :func:`persistent_rows`: lesson 04's persistent kernel against its non-persistent
  one by tiles per SM; :func:`kernel_choice_rows`: which of the two tuned kernels (v6, the
  persistent TMA kernel) the tuned path kept, shape by shape.

Every figure and table names its source (the record's label). Nothing here measures.
"""

from __future__ import annotations

import math

from .. import records
from ..bench import geomean
from ..experiments.autotuning import (CACHED_OVER_UNTUNED, FLOOR_VS_TORCH,
                                      GEOMEAN_VS_FIXED, GEOMEAN_VS_TORCH, SQUARE_8192_VS_TORCH,
                                      cached_over_untuned, describe)
from ..kernels.matmul import tuned as mt
from . import finish
from .autotuning_heatmaps import (HeatmapExplorer, draw_heatmap,  # noqa: F401
                                  gpu_key, heatmap, plot_heatmaps, tflops_of, winners)
from .explorer import new_figure
from .fusion import format_rows  # noqa: F401  (format_rows: the lesson's tables)

TOPIC = "autotuning"

# The lesson's performance targets (H100, side by side in one run) are the experiment's,
# beside the measurements they judge: GEOMEAN_VS_TORCH, FLOOR_VS_TORCH, ... above.
MIN_SHAPES = 16              # shapes in the sweep, each in fp16 and bf16


def load_all() -> list:
    """Every committed autotuning record, the course's reference GPU first."""
    have = records.available(TOPIC)
    rank = {g: i for i, g in enumerate(records.PREFERRED_GPUS)}
    return [records.load(TOPIC, g) for g in sorted(have, key=lambda g: (rank.get(g, 99), g))]


# --- The shape sweep: tuned against torch.matmul and lesson 04's setting. -----------------


def shape_rows(rec) -> list[dict]:
    """One line per (shape, dtype) of the sweep, with the ratios and the chosen setting."""
    return [{"shape": s["label"], "dtype": s["dtype"], "M x N x K": f"{s['M']}x{s['N']}x{s['K']}",
             "torch TFLOP/s": s["torch_tflops"], "tuned TFLOP/s": s["tuned_tflops"],
             "fixed TFLOP/s": s["torch_tflops"] * s["torch_ms"] / s["fixed_ms"],
             "tuned/torch": s["tuned_vs_torch"], "tuned/fixed": s["tuned_vs_fixed"],
             "chosen setting": _kept(s) + (" persistent TMA" if s.get("tuned_kernel") ==
                                           "persistent" else "")} for s in rec.results["shapes"]]


def _kept(row) -> str:
    """The setting a sweep row kept, with the persistent kernel's options when it is its."""
    return describe({**row["tuned_config"], **row.get("tuned_options", {})})


def _tiles(M: int, N: int, config: dict) -> int:
    """Output tiles of ``config`` on an ``M x N`` output."""
    return math.ceil(M / config["BLOCK_M"]) * math.ceil(N / config["BLOCK_N"])


def geomeans(rec) -> dict:
    """Geometric means of tuned/torch and tuned/fixed, per dtype and over the whole sweep."""
    shapes = rec.results["shapes"]
    groups = {d: [s for s in shapes if s["dtype"] == d]
              for d in sorted({s["dtype"] for s in shapes})}
    groups["all"] = shapes
    return {name: {"tuned/torch": geomean(s["tuned_vs_torch"] for s in rows),
                   "tuned/fixed": geomean(s["tuned_vs_fixed"] for s in rows),
                   "fixed/torch": geomean(s["tuned_vs_torch"] / s["tuned_vs_fixed"] for s in rows),
                   "shapes": len(rows)} for name, rows in groups.items()}


def targets(rec) -> list[dict]:
    """The lesson's performance targets, each with the measured value, the goal, whether it
    is met and (where one shape decides it) which shape."""
    shapes, res = rec.results["shapes"], rec.results
    g = geomeans(rec)["all"]
    worst = min(shapes, key=lambda s: s["tuned_vs_torch"])
    squares = [s for s in shapes if (s["M"], s["N"], s["K"]) == (8192, 8192, 8192)]
    sq = min(squares, key=lambda s: s["tuned_vs_torch"]) if squares else None
    t = res.get("tuning_time", {})
    cached = cached_over_untuned(t)
    rows = [
        ("tuned vs torch.matmul, geometric mean over the sweep", g["tuned/torch"], ">=",
         GEOMEAN_VS_TORCH, "x", f"{g['shapes']} shapes x dtypes"),
        ("tuned vs torch.matmul, worst shape", worst["tuned_vs_torch"], ">=", FLOOR_VS_TORCH, "x",
         f"{worst['label']} {worst['dtype']}"),
        ("tuned vs torch.matmul at 8192^3 (worse dtype)",
         sq["tuned_vs_torch"] if sq else math.nan, ">=", SQUARE_8192_VS_TORCH, "x",
         sq["dtype"] if sq else "8192^3 not in the sweep"),
        ("tuned vs lesson 04's setting, geometric mean", g["tuned/fixed"], ">=",
         GEOMEAN_VS_FIXED, "x", ""),
        ("cached run over a run that never tunes", cached, "<=", CACHED_OVER_UNTUNED, "x",
         f"median of {len(t.get('cached_runs_s') or [])} pairs; medians "
         f"{t.get('cached_s', math.nan):.2f} s vs {t.get('untuned_s', math.nan):.2f} s"),
        ("cold tuning of the whole sweep (reported)", t.get("cold_s", math.nan), None, None, "s",
         ""),
    ]
    out = []
    for name, value, op, goal, unit, detail in rows:
        met = (None if goal is None else False if not math.isfinite(value)
               else bool(value >= goal if op == ">=" else value <= goal))
        out.append({"target": name, "measured": value, "op": op, "goal": goal, "unit": unit,
                    "met": met, "detail": detail})
    return out


def format_targets(rows: list[dict]) -> str:
    lines = []
    for t in rows:
        goal = "" if t["goal"] is None else f"goal {t['op']} {t['goal']:g}{t['unit']}"
        mark = {True: "met", False: "NOT met", None: ""}[t["met"]]
        detail = f"  ({t['detail']})" if t["detail"] else ""
        lines.append(f"{t['target']:<54} {t['measured']:7.3g}{t['unit']:<2} {goal:<14} "
                     f"{mark:<7}{detail}")
    return "\n".join(lines)


def plot_sweep(rec, ax=None):
    """Speed against ``torch.matmul`` per shape: lesson 04's single setting (open circle)
    joined to the tuned kernel (filled), per dtype, with the lesson's goals."""
    import numpy as np

    if ax is None:
        _, ax = new_figure((9, 6.5))
    shapes = rec.results["shapes"]
    labels = list(dict.fromkeys(s["label"] for s in shapes))
    dts = sorted({s["dtype"] for s in shapes}, reverse=True)
    for k, dt in enumerate(dts):
        by = {s["label"]: s for s in shapes if s["dtype"] == dt}
        y = np.arange(len(labels)) + (k - (len(dts) - 1) / 2) * 0.3
        tuned = np.array([by[lb]["tuned_vs_torch"] if lb in by else np.nan for lb in labels])
        fixed = np.array([by[lb]["tuned_vs_torch"] / by[lb]["tuned_vs_fixed"] if lb in by
                          else np.nan for lb in labels])
        ax.hlines(y, fixed, tuned, color=f"C{k}", lw=1, alpha=0.6)
        ax.plot(fixed, y, "o", mfc="white", color=f"C{k}", ms=5,
                label=f"lesson 04's setting, {dt}")
        ax.plot(tuned, y, "o", color=f"C{k}", ms=6, label=f"tuned, {dt}")
    ax.axvline(1.0, color="k", lw=1, label="torch.matmul")
    ax.axvline(FLOOR_VS_TORCH, color="C3", lw=1, ls="--", label=f"goal: no shape below "
               f"{FLOOR_VS_TORCH:g}x")
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    finish(ax, title=f"Speed against torch.matmul, shape by shape ({gpu_key(rec)})",
           xlabel="torch time / our time (x, log scale; > 1: faster than torch)",
           ylabel="shape", source=rec.label, legend=False)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax


# --- What tuning costs, and what the tuner cannot fix. ------------------------------------

LAUNCHERS = (("autotuned_us", "matmul_tuned(a, b)"), ("fixed_us", "matmul_tuned(a, b, config=...)"),
             ("torch_us", "torch.matmul"), ("graph_replay_us", "CUDA graph replay"))


def launch_rows(rec) -> list[dict]:
    """Host microseconds per call at the tiny shape, next to the kernel's GPU time."""
    lo = rec.results["launch_overhead"]
    return [{"GPU": gpu_key(rec), "call": name, "host us per call": lo[key],
             "x the GPU time": lo[key] / lo["gpu_us"]} for key, name in LAUNCHERS if key in lo]


def plot_costs(recs, panels=("tuning", "host")):
    """``"tuning"``: seconds to run the sweep's first calls cold, cached, never tuned.
    ``"host"``: host time per call at a tiny shape against the kernel's GPU time."""
    import numpy as np

    recs, panels = list(recs), tuple(panels)
    if not panels or set(panels) - {"tuning", "host"}:
        raise ValueError(f"panels={panels!r}: choose from 'tuning' and 'host'")
    fig, axes = new_figure((6.5 * len(panels), 4.2), ncols=len(panels), squeeze=False)
    ax = dict(zip(panels, axes[0]))
    w = 0.8 / len(recs)
    source = "\n".join(r.label for r in recs)      # a line per record: the panel keeps its width
    for k, rec in enumerate(recs):
        offset = (k - (len(recs) - 1) / 2) * w
        if "tuning" in ax:
            t = rec.results.get("tuning_time", {})
            ax["tuning"].bar(np.arange(3) + offset, [t.get(key, np.nan) for _, key in COSTS],
                             width=w, color=f"C{k}", label=gpu_key(rec))
        if "host" in ax:
            rows = launch_rows(rec)
            ax["host"].barh(np.arange(len(rows)) + offset, [r["host us per call"] for r in rows],
                            height=w, color=f"C{k}", label=f"host time, {gpu_key(rec)}")
            ax["host"].axvline(rec.results["launch_overhead"]["gpu_us"], color=f"C{k}", ls="--",
                               lw=1, label=f"the kernel's GPU time, {gpu_key(rec)}")
    if "tuning" in ax:
        ax["tuning"].set_xticks(range(3))
        ax["tuning"].set_xticklabels([name for name, _ in COSTS], fontsize=8)
        ax["tuning"].set_yscale("log")
        finish(ax["tuning"], title="First calls of the whole sweep", xlabel="process",
               ylabel="seconds (log scale)", source=source)
    if "host" in ax:
        shape = "x".join(map(str, recs[0].results["launch_overhead"]["shape"]))
        ax["host"].set_yticks(range(len(LAUNCHERS)))
        ax["host"].set_yticklabels([name for _, name in LAUNCHERS], fontsize=8)
        ax["host"].invert_yaxis()
        finish(ax["host"], title=f"One call at {shape}: host time",
               xlabel="microseconds per call", ylabel="launcher", source=source)
        ax["host"].legend(fontsize=8, loc="lower right")   # clear of the longest bars
    fig.tight_layout()
    return fig


# The tuning-cost panel's bars: (label, field of the record's tuning_time).
COSTS = [("cold (search + compile)", "cold_s"), ("cached (disk)", "cached_s"),
         ("never tunes", "untuned_s")]


def split_k_rows(rec) -> list[dict]:
    """The sweep's shapes where the tuner chose split-K, with programs with and without."""
    out = []
    for s in rec.results["shapes"]:
        c = s["tuned_config"]
        if c["SPLIT_K"] > 1:
            out.append({"shape": s["label"], "dtype": s["dtype"], "chosen": describe(c),
                        "programs": _tiles(s["M"], s["N"], c) * c["SPLIT_K"],
                        "lesson 04's programs": _tiles(s["M"], s["N"], rec.results["fixed"]),
                        "tuned/fixed": s["tuned_vs_fixed"], "tuned/torch": s["tuned_vs_torch"]})
    return out


def persistent_rows(tiling_rec) -> list[dict]:
    """Lesson 04's persistent TMA kernel (v5) against the same tiles without it (v4), by
    the number of output tiles per SM (from lesson 04's record)."""
    sms = tiling_rec.provenance.get("sm_count") or 132
    ladder = tiling_rec.results["ladder"]
    v4 = {(x["n"], x["dtype"]): x["tflops"] for x in reversed(ladder) if x["step"] == "v4"}
    out = []
    for r in ladder:
        if r["step"] == "v5" and (r["n"], r["dtype"]) in v4:
            tiles = _tiles(r["n"], r["n"], r["config"])
            out.append({"n": r["n"], "dtype": r["dtype"],
                        "v5 tile": "{BLOCK_M}x{BLOCK_N}".format(**r["config"]),
                        "tiles": tiles, "tiles per SM": tiles / sms,
                        "v5/v4": r["tflops"] / v4[r["n"], r["dtype"]]})
    return out


def kernel_choice_rows(rec) -> list[dict]:
    """Per (shape, dtype) of the sweep: the kernel the tuned path kept (``v6``: a program a
    tile; ``persistent``: a program an SM walking tiles), its setting, that setting's output
    tiles per SM, and the speed against ``torch.matmul``."""
    sms = rec.provenance.get("sm_count") or 132
    return [{"shape": s["label"], "dtype": s["dtype"], "kernel kept": s.get("tuned_kernel", "v6"),
             "setting": _kept(s), "tiles per SM": _tiles(s["M"], s["N"], s["tuned_config"]) / sms,
             "tuned/torch": s["tuned_vs_torch"]} for s in rec.results["shapes"]]


def prune_rows(M: int, N: int, K: int, dtype, space=mt.CONFIG_SPACE, gpu="H100-SXM",
               sms: int = 132) -> list[dict]:
    """Why each setting of ``space`` is kept or dropped for one shape (an H100 by default):
    the same decisions as :func:`helpers.kernels.matmul.tuned.prune` (``verdict``)."""
    out = []
    for c in space:
        ok, why = mt.verdict(c, M, N, K, dtype, gpu, sms)
        out.append({"setting": c.describe(), "shared KiB": c.shared_memory_bytes(dtype) / 1024,
                    "acc regs": c.accumulator_registers(), "kept": "yes" if ok else "no",
                    "why": why})
    return out


WAVE_TILE = 128     # the output tile the drawn record's tail shapes are counted in


def wave_rows(rec, family: str = "tail") -> list[dict]:
    """The drawn record's rows of one ``family`` (``matmul_shapes``: the tail shapes by
    default): 128 x 128 output tiles, the work in waves of one tile per SM, what a
    data-parallel launch pays (whole waves) and how full its last wave is, the kernel the
    tuned path kept, and the speed against cuBLAS (padded where that is faster)."""
    sms = rec.results["sms"]
    out = []
    for r in rec.results["rows"]:
        if r["family"] != family:
            continue
        tiles = math.ceil(r["M"] / WAVE_TILE) * math.ceil(r["N"] / WAVE_TILE)
        last = tiles - (math.ceil(tiles / sms) - 1) * sms
        out.append({"shape": f"{r['M']}x{r['N']}x{r['K']}", "dtype": r["dtype"],
                    "tiles": tiles, "waves of work": tiles / sms,
                    "waves paid": math.ceil(tiles / sms), "last wave full": last / sms,
                    "kernel kept": r["choice"].get("kernel", "?"),
                    "ours/cuBLAS": r["vs_cublas"]})
    return out


def drawn_summary_rows(rec) -> list[dict]:
    """The drawn record's geometric means against cuBLAS (padded where faster) and
    ``F.linear``: all rows, aligned (every dimension a multiple of 8) and unaligned apart."""
    out = []
    for part in ("all", "aligned", "unaligned"):
        mine, linear = rec.results["summary"][part], rec.results["linear_summary"][part]
        if mine["rows"]:
            out.append({"rows": part, "shapes": mine["rows"], "ours/cuBLAS": mine["geomean"],
                        "worst": mine["worst"], "x @ W.T / F.linear": linear["geomean"],
                        "under 0.85x": mine["below_0.85"]})
    return out


def drawn_family_rows(rec) -> list[dict]:
    """The drawn record's rows by family (LLM layers, squares, random sizes, tail shapes),
    aligned and unaligned apart: where the losses sit."""
    groups: dict[tuple[str, bool], list[dict]] = {}
    for row in rec.results["rows"]:
        groups.setdefault((row["family"], row["aligned"]), []).append(row)
    out = []
    for (family, aligned), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        worst = min(rows, key=lambda r: r["vs_cublas"])
        out.append({"family": family, "rows": "aligned" if aligned else "unaligned",
                    "shapes": len(rows), "ours/cuBLAS": geomean([r["vs_cublas"] for r in rows]),
                    "worst": worst["vs_cublas"],
                    "x @ W.T / F.linear": geomean([r["linear_vs_f_linear"] for r in rows])})
    return out


def drawn_plan_rows(rec, count: int = 6) -> list[dict]:
    """The ``count`` drawn rows furthest behind cuBLAS, each with what its candidate plans
    took as the tuner timed them (``candidates_ms``): the best on the operands as given and
    the best on copies onto whole lines (copy included; none for rows already on them),
    beside cuBLAS on padded operands (copy not included) and the plan kept."""
    def best(candidates: dict, layout: str):
        times = [ms for name, ms in candidates.items() if name.endswith(layout)]
        return min(times) * 1e3 if times else "-"

    out = []
    for row in sorted(rec.results["rows"], key=lambda r: r["vs_cublas"])[:count]:
        choice = row["choice"]
        candidates = choice.get("candidates_ms") or {}
        out.append({"shape": f"{row['M']}x{row['N']}x{row['K']}", "dtype": row["dtype"],
                    "family": row["family"],
                    "cuBLAS us": row.get("cublas_padded_ms", row["cublas_ms"]) * 1e3,
                    "ours us": row["ours_ms"] * 1e3,
                    "best as given": best(candidates, "as given"),
                    "best on copies": best(candidates, "whole lines"),
                    "kept": f"{choice['kernel']}, {choice['layout']}"})
    return out
