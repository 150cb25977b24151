"""Lesson 08's tables and figures, drawn from its record (``records.get("moe")``).

* the experts alone: TFLOP/s of ours (gathering, and on pre-sorted tokens), the per-expert
  loop, ``torch._grouped_mm`` and a dense matmul with the same FLOPs, against the token
  count, at both shapes (:func:`experts_rows`, :func:`plot_experts_grid`);
* the whole layer, ours against the loop (:func:`layer_rows`, :func:`plot_layer`), and
  each stage's share of ours with the kernels both launch (:func:`stage_rows`,
  :func:`format_profile`, :func:`plot_stages`);
* load imbalance: tokens per expert, padding, time and dropped copies as the router is
  skewed (:func:`imbalance_rows`, :func:`plot_imbalance`);
* every version's error (:func:`check_rows`) and the lesson's targets (:func:`targets`).

Every figure names its source, the record's label. Nothing here measures: the numbers come
from :mod:`helpers.experiments.moe`.
"""

from __future__ import annotations

from .. import hardware
from ..experiments.moe import (DENSE, GMM, LAYER_VS_LOOP, LOOP, OURS, OURS_SORTED,
                               TARGET_TOKENS, VS_DENSE, VS_GROUPED_MM)
from . import finish
from .attention import format_targets  # noqa: F401 - the lesson prints targets the same way
from .fusion import format_rows  # noqa: F401 - and its tables

GROUPED_MM = "torch._grouped_mm"   # the faster of the weight layouts that ran
# The lesson's targets (TARGET_TOKENS, VS_GROUPED_MM, VS_DENSE, LAYER_VS_LOOP) are the
# experiment's, beside what they judge; targets() below checks a record against them.


def shape_label(rec, key: str) -> str:
    s = rec.results["config"]["shapes"][key]
    return f"E={s['experts']} top-{s['top_k']}, H={s['hidden']} I={s['width']}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def entries(rec, part: str, shape: str | None = None) -> list[dict]:
    """The record's ``part`` ("experts" or "layer") entries, of one shape if given, by tokens."""
    out = [e for e in rec.results[part] if "error" not in e and shape in (None, e["shape"])]
    return sorted(out, key=lambda e: (e["shape"], e["tokens"]))


def version(entry: dict, name: str) -> dict:
    """``name``'s row of an entry; :data:`GROUPED_MM` is the fastest layout that ran."""
    if name == GROUPED_MM:
        ran = [v for v in entry["versions"] if v["name"] in GMM.values() and "ms" in v]
        return min(ran, key=lambda v: v["ms"]) if ran else {"name": GROUPED_MM}
    return next((v for v in entry["versions"] if v["name"] == name), {"name": name})


def ms(entry: dict, name: str) -> float | None:
    return version(entry, name).get("ms")


def ratio(entry: dict, other: str, ours: str = OURS) -> float | None:
    """How many times faster ``ours`` ran than ``other`` (its time over ours)."""
    a, b = ms(entry, ours), ms(entry, other)
    return b / a if a and b else None


def token_axis(ax, tokens) -> None:
    """A log2 axis ticked at the measured token counts."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(tokens))
    ax.set_xticks(ticks, [_k(t) for t in ticks])
    ax.minorticks_off()


def _or(value, missing="n/a"):
    return missing if value is None else value


# --------------------------------------------------------------------------------------
# The experts alone.
# --------------------------------------------------------------------------------------

EXPERT_COLUMNS = ((OURS, "ours"), (OURS_SORTED, "ours sorted"), (GROUPED_MM, "_grouped_mm"),
                  (DENSE, "dense"), (LOOP, "loop"))


def experts_rows(rec, shape: str | None = None) -> list[dict]:
    """One line per (shape, tokens): each version's TFLOP/s and ours' speed ratios."""
    out = []
    for e in entries(rec, "experts", shape):
        line = {"shape": shape_label(rec, e["shape"]).split(",")[0], "tokens": e["tokens"]}
        for name, short in EXPERT_COLUMNS:
            line[f"{short} TFLOP/s"] = _or(version(e, name).get("tflops"))
        for other, short in ((GROUPED_MM, "_grouped_mm"), (DENSE, "dense"), (LOOP, "loop")):
            line[f"vs {short}"] = _or(ratio(e, other), "-")
        out.append(line)
    return out


def plot_experts(rec, shape: str, ax=None):
    """TFLOP/s of every version against the token count, at one shape."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    es = entries(rec, "experts", shape)
    for j, (name, _) in enumerate(EXPERT_COLUMNS):
        pts = [(e["tokens"], version(e, name)["tflops"]) for e in es
               if "tflops" in version(e, name)]
        label = name if name != GROUPED_MM else f"{GROUPED_MM} (faster layout)"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^vD"[j],
                lw=2.5 if name == OURS else 1.2, color=f"C{j}",
                label=label if pts else f"{label}: unavailable")
    dtype = rec.results["config"]["dtype"]
    try:
        peak = hardware.lookup(rec.gpu).peak(dtype)
        ax.axhline(peak, color="0.3", ls=":", lw=1, label=f"dense {dtype} peak: {peak:,.0f} TFLOP/s")
    except (KeyError, ValueError):
        pass
    token_axis(ax, [e["tokens"] for e in es])
    ax.set_ylim(bottom=0)
    return finish(ax, title=f"MoE experts alone, {shape_label(rec, shape)}, {dtype}",
                  xlabel="tokens (each routed to top-k experts)",
                  ylabel="TFLOP/s (6 x copies x H x I FLOP)", source=rec.label)


def plot_experts_grid(rec):
    """:func:`plot_experts` for both shapes, side by side."""
    import matplotlib.pyplot as plt

    shapes = list(rec.results["config"]["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 4.8), squeeze=False)
    for ax, key in zip(axes[0], shapes):
        plot_experts(rec, key, ax=ax)
    fig.tight_layout(w_pad=3)
    return fig


# --------------------------------------------------------------------------------------
# The whole layer, and where its time goes.
# --------------------------------------------------------------------------------------


def layer_rows(rec) -> list[dict]:
    """One line per (shape, tokens): the layer's time, ours and the loop's, and the ratio."""
    return [{"shape": shape_label(rec, e["shape"]).split(",")[0], "tokens": e["tokens"],
             "ours ms": _or(ms(e, OURS)), "loop ms": _or(ms(e, LOOP)),
             "speed-up": _or(ratio(e, LOOP), "-")} for e in entries(rec, "layer")]


def plot_layer(rec, ax=None):
    """The layer's speed-up over the per-expert loop against the token count, per shape."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    for j, key in enumerate(rec.results["config"]["shapes"]):
        pts = [(e["tokens"], ratio(e, LOOP)) for e in entries(rec, "layer", key)]
        pts = [p for p in pts if p[1] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os"[j % 2], color=f"C{j}",
                label=f"{shape_label(rec, key)}: goal >= {LAYER_VS_LOOP.get(key, 1):g}x")
    ax.axhline(1.0, color="0.3", ls=":", lw=1, label="as fast as the loop")
    token_axis(ax, [e["tokens"] for e in entries(rec, "layer")])
    ax.set_ylim(bottom=0)
    return finish(ax, title="Whole MoE layer: moe_forward vs moe_loop",
                  xlabel="tokens", ylabel="speed-up over the loop (x)", source=rec.label)


def _profile(rec, shape: str) -> dict:
    return rec.results["profile"][shape]


def stage_times_us(rec, shape: str) -> tuple[list[tuple[str, float]], str]:
    """Each stage's time per forward (us), and where it comes from: each stage timed alone
    (medians, as the layer is timed; they add up to about the layer's time), or, for a
    record without those, the GPU time the profiler gave each stage's range."""
    stages = _profile(rec, shape)["stages"]
    if all("ms" in s for s in stages):
        return [(s["stage"], 1e3 * s["ms"]) for s in stages], "each stage timed alone"
    return [(s["stage"], s.get("cuda_us", 0.0)) for s in stages], "torch.profiler"


def stage_rows(rec, shape: str) -> list[dict]:
    """Ours, stage by stage: its time alone, its share, and what the profiler saw in the
    stage's range: the GPU time of the kernels attributed to it ("-": none attributed),
    and the host time.

    The shares come from each stage timed alone, not from the profiler: on the H100 record
    (torch 2.11 with Triton 3.6) the profiler attributes no Triton launch to its stage's
    ``record_function`` range, so the grouped stages and the combine read "-" there and
    their kernels appear only in the kernel table (:func:`format_profile`)."""
    times, _ = stage_times_us(rec, shape)
    total = sum(t for _, t in times) or 1.0
    by = {s["stage"]: s for s in _profile(rec, shape)["stages"]}
    return [{"stage": name, "alone us": us, "share %": 100 * us / total,
             "profiler GPU us": by[name].get("cuda_us") or "-",
             "profiler host us": _or(by[name].get("cpu_us"))} for name, us in times]


def _kernel_rows(table: dict) -> list[dict]:
    total = table["total_us"] or 1.0
    return [{"kernel": r["name"] if len(r["name"]) <= 60 else r["name"][:57] + "...",
             "calls": r["calls"], "CUDA us": r["cuda_us"], "share %": 100 * r["cuda_us"] / total}
            for r in table["kernels"]]


def format_profile(rec, shape: str) -> str:
    """Ours stage by stage, then the kernels of ours and of the loop, one forward each."""
    p = _profile(rec, shape)
    if "error" in p:
        return f"profile of {shape_label(rec, shape)}: {p['error']}"
    times, how = stage_times_us(rec, shape)
    layer = next((ms(e, OURS) for e in entries(rec, "layer", shape)
                  if e["tokens"] == p["tokens"]), None)
    total = f"{sum(t for _, t in times):,.0f} us in all" + (
        f"; the layer, timed whole: {1e3 * layer:,.0f} us" if layer else "")
    out = [f"One forward, {shape_label(rec, shape)}, {p['tokens']:,} tokens ({rec.label})",
           f"ours, stage by stage ({how}: {total}):\n" + format_rows(stage_rows(rec, shape))]
    for name in (OURS, LOOP):
        q = p[name]
        if "error" in q or not q.get("kernels"):
            out.append(f"{name}: {q.get('error', 'no GPU kernels recorded')}")
            continue
        out.append(f"{name}: {q['launches']:,.0f} launches of {q['kernel_count']} kernels, "
                   f"{q['total_us']:,.0f} us of GPU time; the longest:\n"
                   + format_rows(_kernel_rows(q)))
    return "\n\n".join(out)


def plot_stages(rec, ax=None):
    """Each stage's share of ours' time (:func:`stage_times_us`), one bar per shape."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    shapes = [k for k in rec.results["config"]["shapes"] if "error" not in _profile(rec, k)]
    hows = set()
    for i, key in enumerate(shapes):
        times, how = stage_times_us(rec, key)
        hows.add(how)
        total, left = sum(t for _, t in times) or 1.0, 0.0
        for j, (stage, us) in enumerate(times):
            share = 100 * us / total
            ax.barh(i, share, left=left, color=f"C{j}", label=stage if i == 0 else None)
            if share > 6:
                ax.text(left + share / 2, i, f"{share:.0f}%", ha="center", va="center", fontsize=8)
            left += share
    ax.set_yticks(range(len(shapes)))
    ax.set_yticklabels([f"{shape_label(rec, k)}\n{_profile(rec, k)['tokens']:,} tokens"
                        for k in shapes], fontsize=8)
    ax.set_xlim(0, 100)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return finish(ax, title=f"Where one MoE forward spends its time ({', '.join(hows)})",
                  xlabel="share of the layer's time (%)", ylabel="shape", source=rec.label,
                  legend=False)


# --------------------------------------------------------------------------------------
# Load imbalance and capacity.
# --------------------------------------------------------------------------------------


def _imbalance(rec) -> dict:
    return rec.results["imbalance"]


def level_ms(level: dict, name: str) -> float | None:
    return next((v.get("ms") for v in level["versions"] if v["name"] == name), None)


def imbalance_rows(rec) -> list[dict]:
    """One line per skew strength: the busiest expert's load, idle experts, padding, the
    time of ours and of the loop, and each capacity factor's dropped copies."""
    im = _imbalance(rec)
    out = []
    for lv in im["levels"]:
        line = {"strength": lv["strength"], "max/mean": lv["max_over_mean"],
                "idle experts": lv["idle_experts"], "padding rows": lv["padding_rows"],
                "padding %": 100 * lv["padding_rows"] / im["copies"],
                "ours ms": _or(level_ms(lv, OURS)), "loop ms": _or(level_ms(lv, LOOP))}
        for c in lv["capacity"]:
            line[f"dropped @{c['factor']:g}"] = c["dropped"]
        out.append(line)
    return out


def capacity_rows(rec) -> list[dict]:
    """One line per (strength, capacity factor): the cap, copies dropped, ours' time."""
    im = _imbalance(rec)
    return [{"strength": lv["strength"], "factor": c["factor"], "capacity": c["capacity"],
             "dropped": c["dropped"], "dropped %": 100 * c["dropped"] / im["copies"],
             "ours ms": _or(c.get("ms")), "no cap ms": _or(level_ms(lv, OURS))}
            for lv in im["levels"] for c in lv["capacity"]]


def plot_imbalance(rec):
    """Three panels: tokens per expert (sorted) at each strength; ours and the loop against
    the strength; the copies each capacity factor drops."""
    import matplotlib.pyplot as plt

    im = _imbalance(rec)
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.6))
    mean = im["copies"] / len(im["levels"][0]["counts"])
    for j, lv in enumerate(im["levels"]):
        counts = sorted(lv["counts"], reverse=True)
        a.plot(range(1, len(counts) + 1), counts, color=f"C{j}",
               label=f"s = {lv['strength']:g}: max/mean {lv['max_over_mean']:.1f}")
    a.axhline(mean, color="0.3", ls=":", lw=1, label=f"mean: {mean:,.0f} rows")
    a.set_yscale("log")
    shape = shape_label(rec, im["shape"])
    finish(a, title=f"Tokens per expert, {shape}, {im['tokens']:,} tokens",
           xlabel="expert, busiest first", ylabel="rows (token copies)", source=rec.label)
    s = [lv["strength"] for lv in im["levels"]]
    for j, name in enumerate((OURS, LOOP)):
        pts = [(x, level_ms(lv, name)) for x, lv in zip(s, im["levels"])]
        pts = [p for p in pts if p[1] is not None]
        b.plot([p[0] for p in pts], [p[1] for p in pts], marker="os"[j], label=name)
    b.set_ylim(bottom=0)
    finish(b, title=f"The experts' time as {im['hot']} experts get favoured",
           xlabel=f"skew strength s (logit bias of the {im['hot']} hot experts)",
           ylabel="time (ms)", source=rec.label)
    for j, f in enumerate(im["capacity_factors"]):
        pts = [(lv["strength"], 100 * cap["dropped"] / im["copies"]) for lv in im["levels"]
               for cap in lv["capacity"] if cap["factor"] == f]
        c.plot([p[0] for p in pts], [p[1] for p in pts], marker="o^s"[j % 3],
               label=f"capacity factor {f:g}")
    c.set_ylim(bottom=0)
    finish(c, title="Copies dropped by an expert capacity",
           xlabel="skew strength s", ylabel="dropped copies (% of all)", source=rec.label)
    fig.tight_layout(w_pad=2)
    return fig


# --------------------------------------------------------------------------------------
# Correctness and targets.
# --------------------------------------------------------------------------------------


def check_rows(rec) -> list[dict]:
    """Every version's max error against the fp32 loop on the same routing, and the verdict."""
    out = []
    for c in rec.results["checks"]:
        if "error" in c:
            out.append({"shape": "?", "part": "all", "version": "-", "max error": "-",
                        "within tolerance": c["error"][:60]})
            continue
        for part in ("experts", "layer"):
            for r in c[part]:
                out.append({"shape": shape_label(rec, c["shape"]).split(",")[0], "part": part,
                            "version": r["name"], "max error": _or(r.get("max_error"), "-"),
                            "within tolerance": r["ok"] if "ok" in r else r["error"][:60]})
    return out


def targets(rec) -> list[dict]:
    """The lesson's performance targets at their token counts (:data:`TARGET_TOKENS`), each
    with the measured ratio and a verdict (a ratio the record lacks counts as not met)."""
    rows = []

    def add(name, value, goal):
        rows.append({"target": name, "measured": value, "goal": goal, "unit": "x",
                     "at_most": False, "met": value is not None and value >= goal})

    def held(part):
        return [e for e in entries(rec, part) if e["tokens"] == TARGET_TOKENS.get(e["shape"])]

    for e in held("experts"):
        k, at = e["shape"], f"E={rec.results['config']['shapes'][e['shape']]['experts']}"
        add(f"experts vs _grouped_mm, {at}, {_k(e['tokens'])} tokens",
            ratio(e, GROUPED_MM), VS_GROUPED_MM[k])
        add(f"experts vs dense, {at}, {_k(e['tokens'])} tokens", ratio(e, DENSE), VS_DENSE)
    for e in held("layer"):
        at = f"E={rec.results['config']['shapes'][e['shape']]['experts']}"
        add(f"layer vs loop, {at}, {_k(e['tokens'])} tokens", ratio(e, LOOP),
            LAYER_VS_LOOP[e["shape"]])
    return rows


# --------------------------------------------------------------------------------------
# The trainable layer (experiment moe_training): forward + backward.
# --------------------------------------------------------------------------------------


def training_rows(rec) -> list[dict]:
    """One line per shape and token count: our forward, our forward + backward, the
    baseline's, and the ratio."""
    from ..experiments import moe_training as mt

    rows = []
    for e in rec.results["timings"]:
        ours, base = mt.version(e, mt.OURS), mt.fastest_baseline(e)
        s = rec.results["config"]["shapes"][e["shape"]]
        rows.append({"experts": f"E={s['experts']}", "tokens": f"{e['tokens']:,}",
                     "ours fwd ms": ours["forward"]["ms"] if ours else "failed",
                     "ours fwd+bwd ms": ours["step"]["ms"] if ours else "failed",
                     "_grouped_mm fwd+bwd ms": base["step"]["ms"] if base else "did not run",
                     "ours TFLOP/s": ours["step_tflops"] if ours else "-",
                     "speed-up": mt.speedup(e) or "-"})
    return rows


def training_targets(rec) -> list[dict]:
    """Forward + backward against ``torch._grouped_mm``'s autograd at the token count each
    target holds at, with a verdict (a ratio the record lacks counts as not met)."""
    from ..experiments import moe_training as mt

    rows = []
    for e in rec.results["timings"]:
        if e["tokens"] != rec.results["config"]["target_tokens"][e["shape"]]:
            continue
        value, goal = mt.speedup(e), mt.VS_GROUPED_MM[e["shape"]]
        s = rec.results["config"]["shapes"][e["shape"]]
        rows.append({"target": f"fwd+bwd vs _grouped_mm autograd, E={s['experts']}, "
                               f"{_k(e['tokens'])} tokens",
                     "measured": value, "goal": goal, "unit": "x", "at_most": False,
                     "met": value is not None and value >= goal})
    return rows


GEMM_KERNELS = ("gemm", "cutlass", "weight_grad", "gather_tma")    # the grouped GEMMs' names


def training_split(rec) -> list[dict]:
    """Where each version's forward + backward spends its GPU time, at each shape's target
    token count (``torch.profiler``, one step): the grouped GEMMs' kernels, and every other
    kernel (gathers, SwiGLU, combine, casts, sorts, the router's small matmul). Empty for a
    record whose versions did not run the same GEMMs (:func:`training_caveat`)."""
    if training_caveat(rec):
        return []
    rows = []
    for shape, p in rec.results["profile"].items():
        experts = rec.results["config"]["shapes"][shape]["experts"]
        for name, table in p.items():
            if not isinstance(table, dict) or "kernels" not in table:
                continue
            gemm = sum(k["cuda_us"] for k in table["kernels"]
                       if any(g in k["name"].lower() for g in GEMM_KERNELS))
            rows.append({"experts": f"E={experts}", "tokens": f"{p['tokens']:,}",
                         "version": name, "GEMM kernels us": gemm,
                         "other kernels us": table["total_us"] - gemm,
                         "launches": table["launches"]})
    return rows


def training_caveat(rec) -> str:
    """What a record taken before the layer's input required grad did not compare alike."""
    if rec.results["config"].get("x_requires_grad"):
        return ""
    return ("In this record x did not require grad: the baseline's autograd skipped the dx "
            "GEMM (a third of the backward's FLOPs) and ours ran it, so its times and kernel "
            "split do not compare alike.")
