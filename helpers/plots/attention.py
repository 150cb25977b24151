"""Lesson 06's tables and figures, drawn from its record (``records.get("attention")``).

* time and peak memory of naive attention and our fused kernel against the sequence length,
  naive attention's out-of-memory marked (:func:`plot_time`, :func:`plot_memory`);
* TFLOP/s of our forward and backward next to each SDPA backend, with the ratios to
  FlashAttention-2 (SDPA flash) and to cuDNN (:func:`tflops_rows`, :func:`plot_tflops`);
* the kernels one naive forward launches next to the fused kernel (:func:`format_profile`);
* both on the roofline (:func:`plot_roofline`), and the lesson's targets (:func:`targets`).

Every figure names its source, the record's label (GPU, date, versions). Nothing here
measures: the numbers come from :mod:`helpers.experiments.attention`.
"""

from __future__ import annotations

import math

from .. import hardware, roofline
from ..experiments.attention import (BACKWARD_VS_FLASH, CUDNN, FLASH, FORWARD_TFLOPS,
                                     FORWARD_VS_FLASH, MEMORY_EXPONENT, NAIVE, OURS,
                                     TARGET_DTYPE, TARGET_HEAD_DIM, VERSIONS)
from . import finish
from . import roofline as roofline_plots
from .fusion import format_rows

GIB = 2**30


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# --------------------------------------------------------------------------------------
# Time and memory against the sequence length.
# --------------------------------------------------------------------------------------


def _memory(rec) -> dict:
    return rec.results["memory"]


def _rows_of(rec, name: str) -> list[dict]:
    return [r for r in _memory(rec)["rows"] if r["name"] == name]


def memory_rows(rec) -> list[dict]:
    """One line per length: time and peak memory of naive attention and of ours."""
    out = []
    for n in sorted({r["seq"] for r in _memory(rec)["rows"]}):
        line = {"N": n}
        for name, short in ((NAIVE, "naive"), (OURS, "ours")):
            r = next((r for r in _rows_of(rec, name) if r["seq"] == n), None)
            missing = "-" if r is None else "out of memory" if r.get("oom") else "failed"
            line[f"{short} ms"] = r["ms"] if r and "ms" in r else missing
            line[f"{short} GiB"] = r["peak_bytes"] / GIB if r and "peak_bytes" in r else missing
        a, b = line["naive ms"], line["ours ms"]
        line["speed-up"] = a / b if isinstance(a, float) and isinstance(b, float) else "-"
        out.append(line)
    return out


def _mark_oom(ax, rec) -> None:
    ooms = [r["seq"] for r in _rows_of(rec, NAIVE) if r.get("oom")]
    if ooms:
        ax.plot(ooms, [0.92] * len(ooms), "x", ms=11, mew=2.5, color="C0",
                transform=ax.get_xaxis_transform(),
                label=f"naive: out of memory at N = {', '.join(_k(n) for n in ooms)}")


def _against_length(rec, key: str, scale: float, ax, title: str, ylabel: str):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    for j, (name, marker) in enumerate(((NAIVE, "o"), (OURS, "s"))):
        pts = [(r["seq"], r[key] * scale) for r in _rows_of(rec, name) if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=f"C{j}",
                label=name)
    _mark_oom(ax, rec)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    m = _memory(rec)
    return finish(ax, title=f"{title}, B={m['batch']} H={m['heads']} d={m['head_dim']} "
                  f"{m['dtype']}", xlabel="sequence length N (tokens)", ylabel=ylabel,
                  source=rec.label)


def plot_time(rec, ax=None):
    """Forward time of naive attention and of ours against N, log-log."""
    return _against_length(rec, "ms", 1.0, ax, "Attention forward time", "time (ms)")


def plot_memory(rec, ax=None):
    """Peak memory beyond the inputs against N: naive grows like N^2, ours like N."""
    ax = _against_length(rec, "peak_bytes", 1 / GIB, ax, "Attention forward peak memory",
                         "peak memory beyond Q, K, V (GiB)")
    total = _memory(rec).get("device_bytes")
    if total:
        ax.axhline(total / GIB, color="0.3", ls=":", lw=1,
                   label=f"GPU memory: {total / GIB:.0f} GiB")
        ax.legend(fontsize=8)
    return ax


def growth_exponent(rec, name: str, from_seq: int = MEMORY_EXPONENT[1]) -> float | None:
    """p in peak memory ~ N^p, between the shortest length >= ``from_seq`` and the longest
    measured: 1 for linear, 2 for quadratic."""
    pts = sorted((r["seq"], r["peak_bytes"]) for r in _rows_of(rec, name)
                 if "peak_bytes" in r and r["seq"] >= from_seq)
    if len(pts) < 2 or pts[0][1] <= 0:
        return None
    (n0, b0), (n1, b1) = pts[0], pts[-1]
    return math.log(b1 / b0) / math.log(n1 / n0)


# --------------------------------------------------------------------------------------
# TFLOP/s next to PyTorch's SDPA backends.
# --------------------------------------------------------------------------------------


def _entries(rec, **match) -> list[dict]:
    return [e for e in rec.results["tflops"] if all(e[k] == v for k, v in match.items())]


def _ms(entry: dict, name: str) -> float | None:
    return next((r.get("ms") for r in entry["rows"] if r["name"] == name), None)


def ratio(entry: dict, other: str) -> float | None:
    """How many times faster ours ran than ``other`` (its time over ours)."""
    ours, theirs = _ms(entry, OURS), _ms(entry, other)
    return theirs / ours if ours and theirs else None


def tflops_rows(rec, pass_: str | None = None, dtype: str | None = None) -> list[dict]:
    """One line per (pass, dtype, d, causal, N): each version's TFLOP/s (``n/a`` where a
    backend refused or failed) and our speed ratio to SDPA flash and to cuDNN."""
    match = {k: v for k, v in (("pass", pass_), ("dtype", dtype)) if v is not None}
    out = []
    for e in _entries(rec, **match):
        line = {"pass": e["pass"], "dtype": e["dtype"], "d": e["head_dim"],
                "causal": "yes" if e["causal"] else "no", "N": e["seq"]}
        for r in e["rows"]:
            line[r["name"]] = r["tflops"] if "tflops" in r else "n/a"
        for other in (FLASH, CUDNN):
            value = ratio(e, other)
            line[f"vs {other[5:]}"] = value if value is not None else "-"
        out.append(line)
    return out


def plot_tflops(rec, pass_: str = "forward", head_dim: int = 128, causal: bool = False,
                dtype: str = "bf16", ax=None):
    """TFLOP/s of every version against N, for one pass, head size and mask."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    entries = sorted(_entries(rec, **{"pass": pass_, "dtype": dtype, "head_dim": head_dim,
                                      "causal": causal}), key=lambda e: e["seq"])
    for j, name in enumerate(VERSIONS):
        pts = [(e["seq"], r["tflops"]) for e in entries for r in e["rows"]
               if r["name"] == name and "tflops" in r]
        label = name if pts else f"{name}: unavailable"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^v"[j % 4],
                lw=2.5 if name == OURS else 1.2, color=f"C{j}", label=label)
    try:
        peak = hardware.lookup(rec.gpu).peak(dtype)
        ax.axhline(peak, color="0.3", ls=":", lw=1,
                   label=f"dense {dtype} peak: {peak:,.0f} TFLOP/s")
    except (KeyError, ValueError):
        pass
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    mask = "causal" if causal else "non-causal"
    return finish(ax, title=f"Attention {pass_}, {dtype}, d={head_dim}, {mask}",
                  xlabel="sequence length N (tokens)",
                  ylabel=f"TFLOP/s ({'10' if pass_ == 'backward' else '4'} B H N^2 d"
                  f"{' / 2' if causal else ''} FLOP)", source=rec.label)


def plot_tflops_grid(rec, dtype: str = "bf16"):
    """:func:`plot_tflops` for both passes (rows), each head size and mask (columns)."""
    import matplotlib.pyplot as plt

    dims = sorted({e["head_dim"] for e in _entries(rec, dtype=dtype)})
    panels = [(d, c) for d in dims for c in (False, True)]
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 9), squeeze=False)
    for i, pass_ in enumerate(("forward", "backward")):
        for j, (d, c) in enumerate(panels):
            plot_tflops(rec, pass_, d, c, dtype, ax=axes[i][j])
    fig.tight_layout(h_pad=3)
    return fig


# --------------------------------------------------------------------------------------
# What naive attention launches, and where both land on the roofline.
# --------------------------------------------------------------------------------------


def profile_rows(rec, name: str = NAIVE) -> list[dict]:
    """The kernels ``name`` launched for one forward (longest first): calls, time, share."""
    p = rec.results["profile"][name]
    total = p["total_us"] or 1.0
    return [{"kernel": r["name"] if len(r["name"]) <= 70 else r["name"][:67] + "...",
             "calls": r["calls"], "CUDA us": r["cuda_us"], "share %": 100 * r["cuda_us"] / total}
            for r in p["kernels"]]


def format_profile(rec) -> str:
    """Both profiles as text: naive attention's kernels, then the fused kernel."""
    p = rec.results["profile"]
    out = []
    for name in (NAIVE, OURS):
        q = p[name]
        if "error" in q:
            out.append(f"{name}: {q['error']}")
            continue
        shown = f", top {len(q['kernels'])}" if len(q["kernels"]) < q["kernel_count"] else ""
        out.append(f"{name}: {q['launches']} launches of {q['kernel_count']} kernels, "
                   f"{q['total_us']:,.0f} us of GPU time{shown}")
        out.append(format_rows(profile_rows(rec, name)))
    head = (f"One forward, B={p['batch']} H={p['heads']} N={p['seq']} d={p['head_dim']} "
            f"{p['dtype']} ({rec.label})")
    return "\n\n".join([head] + out)


def roofline_points(rec) -> list[roofline.Point]:
    """Naive attention and ours at each measured length: same FLOPs, very different bytes."""
    out = []
    for name, short in ((NAIVE, "naive"), (OURS, "ours")):
        for r in _rows_of(rec, name):
            if "ms" in r:
                out.append(roofline.Point(f"{short}, N={_k(r['seq'])}", r["flops"] / r["bytes"],
                                          r["flops"] / (r["ms"] * 1e-3) / 1e12, rec.label))
    return out


def plot_roofline(rec, ax=None):
    """The recorded GPU's roofline with naive attention (circles), stuck on the memory
    slope, and ours (squares), moving right with N into the compute roof."""
    m = _memory(rec)
    gpu = hardware.lookup(rec.gpu)
    points = roofline_points(rec)
    xs = [p.intensity for p in points] or [1.0]
    xlim = (2 ** math.floor(math.log2(min(xs) / 2)), 2 ** math.ceil(math.log2(max(xs) * 2)))
    ax = roofline_plots.plot(gpu, dtypes=(m["dtype"],), points=(), ax=ax, xlim=xlim,
                             source=rec.label, title=f"Attention forward on the {gpu.name} "
                             f"roofline, d={m['head_dim']} {m['dtype']}")
    for short, marker, colour in (("naive", "o", "C3"), ("ours", "s", "C2")):
        pts = [p for p in points if p.label.startswith(short)]
        ax.plot([p.intensity for p in pts], [p.tflops for p in pts], marker, ls="-", lw=0.8,
                color=colour, mfc="none" if marker == "o" else colour, ms=7,
                label={"naive": NAIVE, "ours": OURS}[short])
        # Naive attention's points pile up (its intensity hardly moves): one label for all.
        named = pts if short == "ours" else pts[-1:]
        for p in named:
            text = p.label.split("N=")[1] if short == "ours" else \
                f"N = {pts[0].label.split('N=')[1]}..{p.label.split('N=')[1]}"
            ax.annotate(text, (p.intensity, p.tflops), fontsize=7, xytext=(4, -10),
                        textcoords="offset points", color=colour)
    ax.legend(fontsize=7, loc="lower right")
    return ax


# --------------------------------------------------------------------------------------
# The lesson's targets.
# --------------------------------------------------------------------------------------


def targets(rec) -> list[dict]:
    """Lesson 06's performance targets, each with the measured value and a verdict (a value
    the record lacks counts as not met). Goals: the experiment's (FORWARD_VS_FLASH, ...,
    in :mod:`helpers.experiments.attention`)."""
    rows = []

    def add(name, value, goal, unit, at_most=False):
        met = None if goal is None else value is not None and (
            value <= goal if at_most else value >= goal)
        rows.append({"target": name, "measured": value, "goal": goal, "unit": unit,
                     "at_most": at_most, "met": met})

    sel = {"dtype": TARGET_DTYPE, "head_dim": TARGET_HEAD_DIM}
    for pass_, (goal, start) in (("forward", FORWARD_VS_FLASH), ("backward", BACKWARD_VS_FLASH)):
        for e in sorted(_entries(rec, **{"pass": pass_}, **sel),
                        key=lambda e: (e["causal"], e["seq"])):
            if e["seq"] >= start:
                mask = "causal" if e["causal"] else "non-causal"
                add(f"{pass_} vs SDPA flash, N={_k(e['seq'])}, {mask}", ratio(e, FLASH),
                    goal, "x")
    goal, seq = FORWARD_TFLOPS
    e = next(iter(_entries(rec, **{"pass": "forward", "causal": False, "seq": seq}, **sel)),
             None)
    value = next((r.get("tflops") for r in e["rows"] if r["name"] == OURS), None) if e else None
    add(f"forward TFLOP/s, N={_k(seq)}, non-causal", value, goal, " TFLOP/s")
    add("ours: peak memory ~ N^p, p", growth_exponent(rec, OURS), MEMORY_EXPONENT[0], "",
        at_most=True)
    add("naive: peak memory ~ N^p, p (reported)", growth_exponent(rec, NAIVE), None, "")
    for pass_ in ("forward", "backward"):
        e = next(iter(_entries(rec, **{"pass": pass_, "causal": False, "seq": seq}, **sel)),
                 None)
        add(f"{pass_} vs SDPA cuDNN, N={_k(seq)}, non-causal (reported)",
            ratio(e, CUDNN) if e else None, None, "x")
    return rows


def format_targets(rows: list[dict]) -> str:
    lines = []
    for t in rows:
        value = "missing" if t["measured"] is None else f"{t['measured']:.3g}{t['unit']}"
        goal = "" if t["goal"] is None else \
            f"goal {'<=' if t['at_most'] else '>='} {t['goal']:g}{t['unit']}"
        mark = {True: "met", False: "NOT met", None: ""}[t["met"]]
        lines.append(f"{t['target']:<52} {value:>16}  {goal:<20} {mark}")
    return "\n".join(lines)



def decode_rows(rec) -> list[dict]:
    """The decoding rows of an ``attention_decode`` record: ours against SDPA's default,
    call against call, the backend SDPA chose, how many programs each launches for its
    main kernel and how many times it reads the K/V cache. SDPA's FlashAttention-2 kernel
    runs one program per (batch, query head, block of 128 queries), each reading its K/V
    head's keys: once per query head of the group. Ours runs one per (batch, K/V head,
    split of the keys) for all the group's rows, as many as the record ran ("-" where an
    older record did not say: the rule that splits the keys has changed since)."""
    from ..experiments import attention_decode as ad

    rows = []
    for e in rec.results["decode"]:
        batch = e["batch"]
        backend = e.get("sdpa_backend") or ad.backend(e["sdpa"]["kernels"])
        rows.append({"batch": batch, "queries": e["queries"], "keys": _k(e["keys"]),
                     "ours us": round(e["ours"]["call_ms"] * 1e3, 1),
                     "SDPA us": round(e["sdpa"]["call_ms"] * 1e3, 1), "SDPA runs": backend,
                     "ours / SDPA": round(e["sdpa"]["call_ms"] / e["ours"]["call_ms"], 2),
                     "our programs": e["ours"].get("programs", "-"),
                     "FA-2 programs": batch * ad.HEADS * math.ceil(e["queries"] / 128)
                     if backend == "flash" else "-",
                     "FA-2 cache reads": ad.HEADS // ad.KV_HEADS if backend == "flash"
                     else "-"})
    return rows
