"""The FP8 lesson's pictures and tables, drawn from the ``fp8`` record
(:mod:`helpers.experiments.fp8`) or from what a cell computed: every number the two formats
hold; what each scaling costs in accuracy as outliers grow; the error of the tensor cores'
sum with and without promotion; the speed of each version beside bf16, against the GPU's
dense roofs (:mod:`helpers.hardware`); the quantisation kernel beside a copy; the lesson's
targets."""

from __future__ import annotations

import torch

from ..kernels import fp8
from . import finish


def representable(fmt) -> torch.Tensor:
    """Every finite positive value of an FP8 format, ascending (all 256 bit patterns
    read as the format, the negative, zero, inf and NaN ones left out)."""
    fmt = fp8.format_of(fmt)
    values = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(fmt.dtype).float()
    return values[torch.isfinite(values) & (values > 0)].unique()


def plot_formats(ax=None):
    """Each format's positive values on a log axis, and the gap to the next one over the
    value (the relative spacing): e4m3 finer, e5m2 wider; both step up by a power of two."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    for i, name in enumerate(fp8.FORMATS):
        v = representable(name)
        gap = (v[1:] - v[:-1]) / v[:-1]
        ax.step(v[:-1], gap, where="post", color=f"C{i}",
                label=f"{name}: {v[0].item():.3g} to {v[-1].item():,.0f}, {len(v)} values")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    finish(ax, title="FP8: where the numbers are", xlabel="value (log scale)",
           ylabel="gap to the next value / value",
           source="every bit pattern of torch.float8_e4m3fn and torch.float8_e5m2")
    return ax


def plot_accuracy(table: list[dict], source: str, ax=None):
    """Relative error of the product against float64 as the outliers grow, one line a
    version (``table``: :func:`helpers.experiments.fp8.accuracy_table`'s rows)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    scales = [r["outlier_scale"] for r in table]
    for i, name in enumerate(in_order(table[0]["errors"], ACCURACY_ORDER)):
        ax.plot(scales, [r["errors"][name] for r in table], marker="o", color=f"C{i}",
                label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    finish(ax, title="FP8 products against float64, activations with outlier channels",
           xlabel="outlier channels' size (times the rest)",
           ylabel="relative error ||C - C64|| / ||C64||", source=source)
    return ax


def in_order(names, first) -> list[str]:
    """``names`` with those of ``first`` leading, in its order (a record's JSON keeps its
    keys sorted; a table computed now keeps the experiment's order)."""
    names = list(names)
    return [n for n in first if n in names] + [n for n in names if n not in first]


ACCURACY_ORDER = ("bf16 operands", "tensor", "tensor, promoted", "row", "row, promoted", "block")


def accuracy_rows(table: list[dict]) -> list[dict]:
    """The accuracy table as rows: the outliers' size, then each version's relative error."""
    names = in_order(table[0]["errors"], ACCURACY_ORDER)
    return [{"outliers x": r["outlier_scale"], **{n: r["errors"][n] for n in names}}
            for r in table]


def plot_accuracy_record(rec, ax=None):
    """:func:`plot_accuracy` of a record's table, at the record's size."""
    M, N, K = rec.results["accuracy"][0]["shape"]
    ax = plot_accuracy(rec.results["accuracy"], f"{rec.label}; M={M} N={N} K={K}", ax=ax)
    return ax


# --------------------------------------------------------------------------------------
# The tensor cores' sum: promoted or not (the record's "accumulation" rows).
# --------------------------------------------------------------------------------------

SIGN_WORDS = {"mixed": "operands of mixed signs", "positive": "all-positive operands"}


def accumulation_rows(rec) -> list[dict]:
    """One row per (signs, K): each way of keeping the sum, its relative error against the
    exact product of the same FP8 operands, and how many times the unpromoted error is the
    promoted one."""
    every = rec.results["config"]["promote_every"]
    rows = []
    for r in rec.results["accumulation"]:
        e = r["errors"]
        order = in_order(e, ("never promoted", f"promoted every {every}", "block scales"))
        rows.append({"signs": r["signs"], "K": r["K"], **{n: e[n] for n in order},
                     "never / promoted": e["never promoted"] / e[f"promoted every {every}"]})
    return rows


def plot_accumulation(rec, fig=None):
    """The error of the sum alone as K grows, one panel per sign pattern of the operands,
    one line per way of keeping the sum (never promoted, promoted, block scales)."""
    import matplotlib.pyplot as plt

    rows = rec.results["accumulation"]
    signs = list(dict.fromkeys(r["signs"] for r in rows))
    if fig is None:
        fig = plt.figure(figsize=(12, 4.3))
    axes = fig.subplots(1, len(signs), sharey=True, squeeze=False)[0]
    for ax, s in zip(axes, signs):
        sel = sorted((r for r in rows if r["signs"] == s), key=lambda r: r["K"])
        every = rec.results["config"]["promote_every"]
        names = in_order(sel[0]["errors"], ("never promoted", f"promoted every {every}"))
        for i, name in enumerate(names):
            ax.plot([r["K"] for r in sel], [r["errors"][name] for r in sel], marker="o",
                    color=f"C{i}", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        M, N, _ = sel[0]["shape"]
        source = (rec.label if ax is axes[0] else
                  f"M={M} N={N}; against float64 of the same FP8 operands")
        finish(ax, title=f"The sum over K, {SIGN_WORDS.get(s, s)}", xlabel="K",
               ylabel="relative error of the sum alone", source=source)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# Speed: TFLOP/s beside bf16, on the roofline.
# --------------------------------------------------------------------------------------

FP8_TENSOR = "ours, tensor scales"
BF16_TORCH = "torch.matmul, bf16"
SPEED_COLUMNS = {"ours, tensor scales": "ours tensor", "ours, row scales": "ours row",
                 "ours, block scales": "ours block",
                 "ours, tensor scales, promoted every 128": "ours promoted",
                 "torch._scaled_mm, tensor scales": "_scaled_mm tensor",
                 "torch._scaled_mm, row scales": "_scaled_mm row",
                 "torch.matmul, bf16": "torch bf16", "course matmul, bf16": "course bf16"}


def version(entry: dict, name: str) -> dict | None:
    """A speed entry's version ``name``, or None when it is missing or failed."""
    v = next((v for v in entry["versions"] if v["name"] == name), None)
    return None if v is None or "error" in v else v


def shape_label(entry: dict) -> str:
    M, N, K = entry["shape"]
    return f"{M}x{N}x{K}" + (" (drawn)" if entry.get("drawn") else "")


def speed_entry(rec, shape) -> dict:
    """The speed entry of ``shape`` (M, N, K)."""
    for e in rec.results["speed"]:
        if tuple(e["shape"]) == tuple(shape):
            return e
    raise KeyError(f"the record has no speed entry at {tuple(shape)}; it has "
                   f"{[tuple(e['shape']) for e in rec.results['speed']]}")


def speedup(rec, shape, name: str = FP8_TENSOR, over: str = BF16_TORCH) -> float | None:
    """How many times faster ``name`` ran than ``over`` at ``shape`` (medians)."""
    e = speed_entry(rec, shape)
    a, b = version(e, name), version(e, over)
    return None if a is None or b is None else b["ms"] / a["ms"]


PADDED_COLUMN = "_scaled_mm padded"


def speed_columns(rec) -> dict[str, str]:
    """:data:`SPEED_COLUMNS`, and cuBLAS on operands padded to 16 where the record has it
    (the shapes whose K or N ``torch._scaled_mm`` refuses)."""
    from ..experiments.fp8 import PADDED

    columns = dict(SPEED_COLUMNS)
    if any(version(e, PADDED) for e in rec.results["speed"]):
        columns[PADDED] = PADDED_COLUMN
    return columns


def speed_rows(rec) -> list[dict]:
    """One row per shape: each version's TFLOP/s (``-`` where it failed or was not run),
    and FP8 with per-tensor scales over bf16 ``torch.matmul``."""
    rows = []
    for e in rec.results["speed"]:
        row = {"shape": shape_label(e)}
        for name, column in speed_columns(rec).items():
            v = version(e, name)
            row[column] = "-" if v is None else float(v["tflops"])
        s = speedup(rec, e["shape"])
        row["fp8 / bf16"] = "-" if s is None else s
        rows.append(row)
    return rows


def plot_speed(rec, ax=None):
    """TFLOP/s of each version at each shape, with the GPU's dense bf16 and FP8 roofs
    (:mod:`helpers.hardware`, the record's GPU)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .. import hardware

    if ax is None:
        _, ax = plt.subplots(figsize=(13, 4.8))
    entries = rec.results["speed"]
    names = list(speed_columns(rec))
    width = 0.8 / len(names)
    x = np.arange(len(entries))
    for i, name in enumerate(names):
        ys = [(version(e, name) or {"tflops": 0.0})["tflops"] for e in entries]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, ys, width, color=f"C{i}", label=name)
    gpu = hardware.lookup(rec.gpu)
    for dt, ls in (("fp8", "--"), ("bf16", ":")):
        ax.axhline(gpu.peak(dt), color="0.2", ls=ls, lw=1.2,
                   label=f"{dt} dense roof, {gpu.peak(dt):,.0f} TFLOP/s")
    ax.set_xticks(x, [shape_label(e) for e in entries], fontsize=8)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    finish(ax, title=f"FP8 and bf16 matmuls on the {gpu.name}", xlabel="M x N x K",
           ylabel="TFLOP/s", source=f"{rec.label}; roofs: helpers.hardware (datasheet)",
           legend=False)
    ax.set_ylim(0, gpu.peak("fp8") * 1.25)
    return ax


def matmul_bytes(M: int, N: int, K: int, operand_bytes: int, out_bytes: int = 2) -> int:
    """The compulsory DRAM bytes of ``C = A B^T``: A and B read once, C (bf16) written once."""
    return (M * K + N * K) * operand_bytes + M * N * out_bytes


def roofline_points(rec, shape) -> list:
    """The versions at ``shape`` as roofline points: FP8 operands 1 byte, bf16 2, C bf16."""
    from ..roofline import Point

    e = speed_entry(rec, shape)
    M, N, K = e["shape"]
    points = []
    for name in (FP8_TENSOR, "ours, block scales", "torch._scaled_mm, tensor scales",
                 BF16_TORCH, "course matmul, bf16"):
        v = version(e, name)
        if v is not None:
            nbytes = matmul_bytes(M, N, K, 2 if "bf16" in name else 1)
            points.append(Point(name, 2 * M * N * K / nbytes, v["tflops"], rec.label))
    return points


def plot_roofline(rec, shape, ax=None):
    """The record's GPU's bf16 and FP8 roofs, the versions at ``shape`` placed on them."""
    from .. import hardware
    from .roofline import plot

    M, N, K = shape
    return plot(hardware.lookup(rec.gpu), dtypes=("bf16", "fp8"),
                points=roofline_points(rec, shape), ax=ax, xlim=(16, 16384),
                title=f"FP8 and bf16 matmuls at {M}x{N}x{K} on the roofline",
                source=rec.label)


def quantize_rows(rec) -> list[dict]:
    """The quantisation kernel per granularity beside a copy of the same bf16 tensor.
    ``timed``: ``graph`` where the record timed the GPU's work (a CUDA graph of the call,
    recorded with ``call_ms`` beside it), ``call`` for older records, which timed the call
    as Python makes it, the host's gaps between launches included."""
    q = rec.results["quantize"]
    how = "graph" if any("call_ms" in r for r in q.values() if isinstance(r, dict)) else "call"
    rows = [{"kernel": "copy (bf16 to bf16)", "ms": q["copy"]["ms"], "GB/s": q["copy"]["gbps"],
             "of copy GB/s": 1.0, "timed": how}]
    names = {g: f"quantize, {g}" for g in ("tensor", "row", "1x128", "128x128")}
    if "delayed" in q:          # recorded since the delayed-scale kernel exists
        names["delayed"] = "quantize_delayed, tensor"
    for g, kernel in names.items():
        r = q.get(g, {})
        if "error" in r or not r:
            rows.append({"kernel": kernel, "ms": "-", "GB/s": "-", "of copy GB/s": "-",
                         "timed": how})
            continue
        rows.append({"kernel": kernel, "ms": r["ms"], "GB/s": r["gbps"],
                     "of copy GB/s": r["gbps"] / q["copy"]["gbps"], "timed": how})
    return rows


def targets(rec) -> list[dict]:
    """The lesson's goals (:mod:`helpers.experiments.fp8`) against the record: per-tensor
    FP8 against ``torch._scaled_mm`` and against the course's bf16 matmul at every shape
    (the worst shape shown), block scales against per-tensor at their shape, and the
    quantisation kernel's share of a copy's bandwidth."""
    from ..experiments import fp8 as f

    rows = []

    def add(name, value, goal):
        rows.append({"target": name, "measured": value, "goal": goal, "unit": "x",
                     "at_most": False, "met": value is not None and value >= goal})

    def worst(*over):
        """The smallest ratio over the shapes, against the first of ``over`` that ran there
        (cuBLAS on padded operands where it refuses the shape), and the shapes where none
        did."""
        ratios, lacking = [], 0
        for e in rec.results["speed"]:
            ran = [r for name in over if (r := speedup(rec, e["shape"], FP8_TENSOR, name))]
            if ran:
                ratios.append(ran[0])
            else:
                lacking += 1
        return (min(ratios) if ratios else None), lacking

    def shapes(lacking):
        n = len(rec.results["speed"])
        return f"worst of {n - lacking} shapes" + (f"; {lacking} without it" if lacking else "")

    value, lacking = worst("torch._scaled_mm, tensor scales", f.PADDED)
    add(f"per-tensor FP8 vs torch._scaled_mm ({shapes(lacking)})", value, f.TENSOR_VS_SCALED_MM)
    value, lacking = worst("course matmul, bf16")
    add(f"per-tensor FP8 vs the course's bf16 matmul ({shapes(lacking)})", value, f.VS_BF16)
    goal, shape = f.BLOCK_VS_TENSOR
    block = None
    if any(tuple(e["shape"]) == tuple(shape) for e in rec.results["speed"]):
        block = speedup(rec, shape, "ours, block scales", FP8_TENSOR)
    add(f"block scales vs per-tensor, {'x'.join(map(str, shape))}", block, goal)
    share, g = f.QUANTIZE_OF_COPY
    q = rec.results["quantize"]
    mine = q.get(g, {})
    add(f"quantize {g}, of copy bandwidth", mine.get("gbps", 0) / q["copy"]["gbps"]
        if "gbps" in mine else None, share)
    return rows


def format_targets(rows: list[dict]) -> str:
    lines = []
    for t in rows:
        value = "missing" if t["measured"] is None else f"{t['measured']:.3g}{t['unit']}"
        mark = "met" if t["met"] else "NOT met"
        lines.append(f"{t['target']:<70} {value:>8}  goal >= {t['goal']:g}{t['unit']:<3} {mark}")
    return "\n".join(lines)
