"""Lesson 05's tables and figures, drawn from its record (``records.get("fusion")``).

Each comparison is a table of time, speed-up and the GB/s of each version's own bytes;
:func:`targets` checks the lesson's performance goals against the record; the figures
show the softmax speed-ups, the long-row bandwidth and each fusion on the roofline.
Every one names its source: the record's label (GPU, date, versions).
"""

from __future__ import annotations

from .. import bench, hardware, roofline
from ..bench import geomean
from ..experiments.fusion import (BIAS_GELU_VS_EAGER, LONG_ROW_ELEMENTS, RMSNORM_OF_COPY,
                                  RMSNORM_VS_EAGER, SOFTMAX_M, SOFTMAX_VS_NAIVE,
                                  SOFTMAX_VS_TORCH)
from . import finish
from . import roofline as roofline_plots


def _peak_gbps(rec) -> float | None:
    try:
        return hardware.lookup(rec.gpu).hbm_bandwidth_gbs
    except KeyError:
        return None


def comparison(rec, entry: dict | str) -> bench.Comparison:
    """A recorded comparison (``"bias_gelu"``, ``"swiglu"``, ``"rmsnorm"``, or one entry
    of ``"softmax"``) as a table: time, speed-up, GB/s of each version's own bytes."""
    d = rec.results[entry] if isinstance(entry, str) else entry
    rows = [bench.Measurement(r["name"], r["ms"], r["bytes"], r.get("flops", 0))
            for r in d["rows"] if "ms" in r]
    return bench.Comparison(title=d["title"], rows=rows, baseline=d["baseline"],
                            peak_gbps=_peak_gbps(rec), source=rec.label)


def _ms(entry: dict, name: str) -> float | None:
    for r in entry["rows"]:
        if r["name"] == name:
            return r.get("ms")
    return None


def softmax_rows(rec) -> list[dict]:
    """One line per (dtype, N) of the softmax targets: times in microseconds and ratios."""
    rows = []
    for e in rec.results["softmax"]:
        naive, torch_, compiled, fused = (_ms(e, k) for k in (
            "naive (5 PyTorch ops)", "torch.softmax", "torch.compile(naive)", "fused Triton"))
        rows.append({"dtype": e["dtype"], "N": e["n"], "naive us": 1e3 * naive,
                     "torch.softmax us": 1e3 * torch_, "compile us": 1e3 * compiled,
                     "fused us": 1e3 * fused,
                     "fused GB/s": bench.gbps(_row(e, "fused Triton")["bytes"], fused),
                     "vs torch": torch_ / fused, "vs naive": naive / fused,
                     "vs compile": compiled / fused})
    return rows


def _row(entry: dict, name: str) -> dict:
    return next(r for r in entry["rows"] if r["name"] == name)


def format_rows(rows: list[dict]) -> str:
    """A list of dicts as an aligned text table (numbers to 3 significant figures)."""
    cols = list(rows[0])
    cell = lambda v: (f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}") if isinstance(v, float) \
        else str(v)  # noqa: E731
    cells = [[cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])



# The kinds of kernel PyTorch launches for the five-op softmax, told apart by name (first
# match wins): exp runs the vectorized elementwise kernel; sub and div, whose second operand
# is broadcast along the row (a stride of 0), the generic one; amax and sum, reductions.
KERNEL_FAMILIES = (
    ("vectorized_elementwise_kernel", "vectorized elementwise (exp)"),
    ("elementwise_kernel", "generic elementwise (sub, div)"),
    ("reduce_kernel", "reductions (amax, sum)"),
)


def kernel_families(prof, op_name: str = "softmax naive") -> list[dict]:
    """The kernels one op of the ``profiles`` record launched, grouped by kind
    (:data:`KERNEL_FAMILIES`): launches, device µs per call, share of the op's time and the
    slowest and fastest GB/s among them; then the op's total."""
    op = prof.results["ops"][op_name]
    groups: dict[str, list[dict]] = {}
    for k in op["kernels"]:
        family = next((f for key, f in KERNEL_FAMILIES if key in k["name"]), k["name"][:40])
        groups.setdefault(family, []).append(k)
    rows = []
    for family, ks in sorted(groups.items(), key=lambda kv: -sum(k["share"] for k in kv[1])):
        rates = [k["gbps"] for k in ks if k.get("gbps")]
        rows.append({"kernels": family, "launches": int(sum(k["calls_per_op"] for k in ks)),
                     "us": sum(k["us_per_call"] * k["calls_per_op"] for k in ks),
                     "share %": 100 * sum(k["share"] for k in ks),
                     "GB/s": " to ".join(f"{g:,.0f}" for g in sorted({min(rates), max(rates)}))
                     if rates else "-"})
    rows.append({"kernels": "all", "launches": int(sum(r["launches"] for r in rows)),
                 "us": op["total_us"], "share %": 100.0, "GB/s": ""})
    return rows


def targets(rec) -> list[dict]:
    """Lesson 05's performance targets, each with the measured value and a verdict."""
    res = rec.results
    soft = softmax_rows(rec)
    copy_gbps = res["copy"]["gbps"]
    rms, gel = res["rmsnorm"], res["bias_gelu"]
    rms_fused = _ms(rms, "fused Triton")
    rms_gbps = bench.gbps(_row(rms, "fused Triton")["bytes"], rms_fused)
    gelu_fused = _ms(gel, "fused Triton (v1, flat)")
    out = [
        ("fused softmax vs torch.softmax (geomean, M=4096, N=1024..16384)",
         geomean(r["vs torch"] for r in soft), SOFTMAX_VS_TORCH, "x"),
        ("fused softmax vs naive softmax (geomean)",
         geomean(r["vs naive"] for r in soft), SOFTMAX_VS_NAIVE, "x"),
        ("fused residual + RMSNorm vs eager PyTorch",
         _ms(rms, "eager PyTorch (Llama style)") / rms_fused, RMSNORM_VS_EAGER, "x"),
        ("fused residual + RMSNorm, fraction of copy bandwidth", rms_gbps / copy_gbps,
         RMSNORM_OF_COPY, ""),
        ("fused bias + GELU vs eager PyTorch",
         _ms(gel, "eager PyTorch (2 kernels)") / gelu_fused, BIAS_GELU_VS_EAGER, "x"),
        ("torch.compile bias + GELU vs eager PyTorch (reported)",
         _ms(gel, "eager PyTorch (2 kernels)") / _ms(gel, "torch.compile(eager)"), None, "x"),
    ]
    return [{"target": name, "measured": value, "goal": goal, "unit": unit,
             "met": None if goal is None else value >= goal} for name, value, goal, unit in out]


def format_targets(rows: list[dict]) -> str:
    lines = []
    for t in rows:
        goal = "" if t["goal"] is None else f"goal >= {t['goal']:g}{t['unit']}"
        mark = {True: "met", False: "NOT met", None: ""}[t["met"]]
        lines.append(f"{t['target']:<66} {t['measured']:6.2f}{t['unit']:<2} {goal:<13} {mark}")
    return "\n".join(lines)


def plot_softmax(rec, ax=None):
    """Speed-up over ``torch.softmax`` against row length, per version and dtype."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    rows = softmax_rows(rec)
    styles = {"fp16": "-", "bf16": "--"}
    for j, (key, label) in enumerate((("fused us", "fused Triton"),
                                      ("compile us", "torch.compile(naive)"),
                                      ("naive us", "naive (5 PyTorch ops)"))):
        for dt in sorted({r["dtype"] for r in rows}):
            sel = [r for r in rows if r["dtype"] == dt]
            ax.plot([r["N"] for r in sel], [r["torch.softmax us"] / r[key] for r in sel],
                    styles.get(dt, "-"), marker="o", color=f"C{j}", label=f"{label}, {dt}")
    ax.axhline(1.0, color="0.3", lw=1, ls=":", label="torch.softmax")
    ax.set_xscale("log", base=2)
    return finish(ax, title=f"Row softmax, M = {SOFTMAX_M} rows: speed-up over torch.softmax",
                  xlabel="row length N (elements)", ylabel="speed-up over torch.softmax (x)",
                  source=rec.label)


def plot_long_rows(rec, ax=None):
    """Effective bandwidth (the 2MN compulsory bytes over the time) against row length."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    entries = rec.results["softmax_long_rows"]
    names = [r["name"] for r in entries[0]["rows"]]
    for j, name in enumerate(names):
        pts = [(e["n"], bench.gbps(e["compulsory_bytes"], _row(e, name)["ms"]))
               for e in entries if "ms" in _row(e, name)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{j}", label=name)
    copy = rec.results["copy"]["gbps"]
    ax.axhline(copy, color="0.3", lw=1, ls=":", label=f"copy: {copy:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, copy * 1.15)
    e0 = entries[0]
    return finish(ax, title=f"Softmax on {LONG_ROW_ELEMENTS // 2**20} Mi {e0['dtype']} elements, "
                  "cut into rows of N", xlabel="row length N (elements)",
                  ylabel="effective bandwidth, 2MN bytes / time (GB/s)", source=rec.label)


def roofline_points(rec) -> list:
    """Each op's unfused and fused versions as roofline points: same FLOPs, fewer bytes."""
    res = rec.results
    soft = next((e for e in res["softmax"] if e["n"] == 4096 and e["dtype"] == "fp16"),
                res["softmax"][len(res["softmax"]) // 2])
    picks = [(soft, "naive (5 PyTorch ops)", "softmax, naive"),
             (soft, "fused Triton", "softmax, fused"),
             (res["bias_gelu"], "eager PyTorch (2 kernels)", "bias+GELU, eager"),
             (res["bias_gelu"], "fused Triton (v1, flat)", "bias+GELU, fused"),
             (res["rmsnorm"], "eager PyTorch (Llama style)", "residual+RMSNorm, eager"),
             (res["rmsnorm"], "fused Triton", "residual+RMSNorm, fused")]
    points = []
    for entry, name, label in picks:
        r = _row(entry, name)
        points.append(roofline.Point(label, r["flops"] / r["bytes"],
                                     bench.tflops(r["flops"], r["ms"]), rec.label))
    return points


def plot_roofline(rec, ax=None):
    """The fp32 (CUDA-core) roofline of the recorded GPU, each op's unfused version (open
    circle) joined by an arrow to its fused version (square)."""
    gpu = hardware.lookup(rec.gpu)
    ax = roofline_plots.plot(
        gpu, dtypes=("fp32",), points=(), ax=ax, xlim=(1 / 64, 64), source=rec.label,
        title=f"Fusion moves each op right and up ({gpu.name}, fp32 CUDA cores)")
    points = roofline_points(rec)
    for j, (before, after) in enumerate(zip(points[::2], points[1::2])):
        colour = f"C{j + 3}"
        for p, marker, face in ((before, "o", "none"), (after, "s", colour)):
            ax.plot([p.intensity], [p.tflops], marker, mfc=face, color=colour, ms=7,
                    label=f"{p.label}: {p.tflops:.3g} TFLOP/s at {p.intensity:.3g} FLOP/B")
        ax.annotate("", xy=(after.intensity, after.tflops),
                    xytext=(before.intensity, before.tflops),
                    arrowprops={"arrowstyle": "->", "color": colour, "lw": 1.2})
    ax.legend(fontsize=7, loc="lower right")
    return ax
