"""One extractor per experiment: a record -> the rows that represent it in the report.

Each reads the fields its experiment (:mod:`helpers.experiments`) writes, through
:class:`~helpers.performance.rows.Fields`, so that a record without one of them stops the
report with the record and the field named. The rows: a lesson's representative shapes
(those its targets name, or a few across its sweep), geometric means where a target is
set over a whole sweep, and every row that misses a target.
"""

from __future__ import annotations

from dataclasses import replace

from ..experiments import autotuning as autotuning_experiment
from .rows import (
    Context,
    RecordFieldError,
    Row,
    Value,
    by_peak,
    by_ratio,
    check_of,
    count,
    failure,
    geomean_of,
    rate_of,
    ratio_of,
    summary,
    timing,
    versions,
)
from .targets import TARGETS


def memory_wall(rec) -> list[Row]:
    """Lesson 01: each Triton kernel beside the PyTorch op it stands for (1 GiB fp32)."""
    ctx = Context(rec)
    rows = []
    for part in list(ctx.res["ops"]) + [ctx.res["fusion"]]:
        cmp = part["comparison"]
        op, base = cmp["title"].split(",")[0], cmp["baseline"]
        shape = " x ".join(count(n) for n in part["shape"]) + f" {part['dtype']}"
        for r in cmp["rows"]:
            if r["name"] != base:
                target = [("copy", by_peak)] if "op" in part and part["op"] == "copy" else []
                rows.append(versions(ctx, cmp, r["name"], base, f"{op}: {r['name']}", shape,
                                     "GB/s", verdicts=target))
    return rows


def vector_add(rec) -> list[Row]:
    """Lesson 03: the vector add at the largest size, each dtype, beside ``torch.add``."""
    ctx = Context(rec)
    big = ctx.res["big_n"]
    rows = []
    for r in ctx.res["sizes"].where_(n=big) or [ctx.res["sizes"].one(n=big)]:
        ours, base = Value(r["triton_gbps"], "GB/s"), Value(r["torch_gbps"], "GB/s")
        rows.append(ctx.row(f"vector add (Triton, block {r['block_size']})",
                            f"n = {count(big)} {r['dtype']}", "torch.add", ours, base,
                            ratio_of(r["triton_ms"], r["torch_ms"]),
                            verdicts=[("vector_add", by_peak)]))
    return rows


TILING_TARGETS = {4096: "matmul_4096", 8192: "matmul_8192"}   # n -> its target


def tiling(rec) -> list[Row]:
    """Lesson 04: ``matmul()`` (the ladder's last rung) beside cuBLAS where targets are set."""
    ctx = Context(rec)
    rows = []
    for dtype in ctx.res["dtypes"]:
        for n, target in TILING_TARGETS.items():
            r = ctx.res["ladder"].one(step="best", dtype=dtype, n=n)
            rows.append(ctx.row(f"matmul() ({r['config']['version']})", f"{n}^3 {dtype}",
                                "torch.matmul (cuBLAS)", Value(r["tflops"], "TFLOP/s"),
                                Value(r["cublas_tflops"], "TFLOP/s"),
                                ratio_of(r["ms"], r["cublas_ms"]), dtype, [(target, by_ratio)]))
    return rows


FUSED_SOFTMAX, ONLINE_SOFTMAX, V1_SOFTMAX = "fused Triton", "online, two passes", \
    "row in registers (v1)"
NAIVE_SOFTMAX, COMPILED_SOFTMAX = "naive (5 PyTorch ops)", "torch.compile(naive)"
COMPILED = "torch.compile(eager)"
# Lesson 05's other fusions: (record part, op, our version, baselines, targets per baseline).
FUSIONS = (
    ("bias_gelu", "bias + GELU", "fused Triton (v1, flat)", (None, COMPILED),
     {None: [("bias_gelu_vs_eager", by_ratio)]}),
    ("swiglu", "SwiGLU", "fused Triton", (None, COMPILED), {}),
    ("rmsnorm", "residual add + RMSNorm", "fused Triton", (None, "add + F.rms_norm", COMPILED),
     {None: [("rmsnorm_vs_eager", by_ratio)]}),
)


def fusion(rec) -> list[Row]:
    """Lesson 05: fused softmax (smallest, middle and largest N of each dtype, and geometric
    means over the sweep), the longest rows, and each fused chain beside eager PyTorch and
    ``torch.compile``. ``None`` as a baseline: the entry's own (eager PyTorch)."""
    ctx = Context(rec)
    res, rows = ctx.res, []
    soft = list(res["softmax"])
    ns = sorted({e["n"] for e in soft})
    for e in soft:
        if e["n"] in (ns[0], ns[len(ns) // 2], ns[-1]):
            rows.append(versions(ctx, e, FUSED_SOFTMAX, e["baseline"],
                                 f"softmax: {FUSED_SOFTMAX}", f"{e['m']} x {e['n']} {e['dtype']}",
                                 "GB/s"))
    sweep = f"M = {soft[0]['m']}, N = {ns[0]} to {ns[-1]}, {len(soft)} shapes"
    for base, target in ((soft[0]["baseline"], "softmax_vs_torch"),
                         (NAIVE_SOFTMAX, "softmax_vs_naive"), (COMPILED_SOFTMAX, "")):
        ratio = geomean_of(ratio_of(timing(e["rows"].one(name=FUSED_SOFTMAX), checked=True),
                                    timing(e["rows"].one(name=base))) for e in soft)
        rows.append(summary(ctx, f"softmax: {FUSED_SOFTMAX} (geometric mean)", sweep, base,
                            ratio, target))
    longest = max(res["softmax_long_rows"], key=lambda e: e["n"])
    for ours in (V1_SOFTMAX, ONLINE_SOFTMAX):
        rows.append(versions(ctx, longest, ours, longest["baseline"], f"softmax: {ours}",
                             f"{longest['m']} x {longest['n']} {longest['dtype']}", "GB/s"))
    copy_gbps = res["copy"]["gbps"]
    for part, op, ours, baselines, targets in FUSIONS:
        e = res[part]
        shape = " x ".join(str(n) for n in e["shape"]) + f" {e['dtype']}"
        for base in baselines:
            extra = targets.get(base, [])
            if part == "rmsnorm" and base is None:
                extra = extra + [("rmsnorm_vs_copy", lambda r: r.ours.number and
                                  r.ours.number / copy_gbps)]
            rows.append(versions(ctx, e, ours, base or e["baseline"], f"{op}: {ours}", shape,
                                 "GB/s", verdicts=extra))
    return rows


def attention(rec) -> list[Row]:
    """Lesson 06: forward and backward beside FlashAttention-2 (SDPA flash) at the target
    length, causal or not, and cuDNN there; plus every length that misses a target."""
    from ..experiments import attention as a

    ctx = Context(rec)
    dtype, d = a.TARGET_DTYPE, a.TARGET_HEAD_DIM
    tflops_at = a.FORWARD_TFLOPS[1]
    start = {"forward": a.FORWARD_VS_FLASH[1], "backward": a.BACKWARD_VS_FLASH[1]}
    ctx.res["tflops"].one(dtype=dtype, head_dim=d, seq=tflops_at)   # the target's length is there
    rows = []
    for e in ctx.res["tflops"].where_(dtype=dtype, head_dim=d):
        pass_, causal, n = e["pass"], e["causal"], e["seq"]
        check = ctx.res["checks"].one(dtype=dtype, head_dim=d, causal=causal)
        wrong = check_of(check["rows"].one(name=a.OURS), f"{pass_}_ok")
        shape = (f"B={e['batch']} H={e['heads']} N={n} d={d} {dtype}"
                 + (", causal" if causal else ""))
        targets = [(f"attention_{pass_}", by_ratio)] if n >= start[pass_] else []
        if pass_ == "forward" and not causal and n == tflops_at:
            targets.append(("attention_tflops", lambda r: r.ours.number))
        for base in (a.FLASH, a.CUDNN):
            row = versions(ctx, e, a.OURS, base, f"attention {pass_}: {a.OURS}", shape,
                           "TFLOP/s", dtype, targets if base == a.FLASH else (), wrong)
            if n == tflops_at and (base == a.FLASH or not causal) or row.missed:
                rows.append(row)
    return rows


def attention_decode(rec) -> list[Row]:
    """Lesson 06 past its grid: decoding against SDPA's default (its backend named), and
    the head dimensions that are not a power of two."""
    from ..experiments import attention as a
    from ..experiments import attention_decode as ad

    ctx = Context(rec)
    rows = []
    for e in ctx.res["decode"]:
        one = e["queries"] == 1
        targets = [("decode_vs_sdpa", by_ratio)] if one else []
        ours, sdpa = e["ours"], e["sdpa"]
        row = ctx.row(f"attention decode: {a.OURS}",
                      f"B={e['batch']} {e['queries']} quer{'y' if one else 'ies'} x "
                      f"{e['keys']:,} keys, GQA 32/8, d=128 bf16",
                      f"SDPA default ({e['sdpa_backend']})",
                      Value(e["kv_bytes"] / ours["call_ms"] / 1e6, "GB/s"),
                      Value(e["kv_bytes"] / sdpa["call_ms"] / 1e6, "GB/s"),
                      ratio_of(ours["call_ms"], sdpa["call_ms"]), "bf16", targets)
        if one and e["keys"] >= ad.DECODE_HBM[1]:
            row = replace(row, verdicts=row.verdicts + ctx.verdicts(
                ("decode_hbm", ours["hbm_fraction"])))
        rows.append(row)
    for e in ctx.res["head_dims"]:
        shape = f"d={e['head_dim']} N=4,096 bf16" + (", causal" if e["causal"] else "")
        rows.append(ctx.row(f"attention forward: {a.OURS}", shape,
                            f"SDPA default ({e['sdpa_backend']})",
                            Value(e["ours"]["tflops"], "TFLOP/s"),
                            Value(e["sdpa"]["tflops"], "TFLOP/s"),
                            ratio_of(e["ours"]["ms"], e["sdpa"]["ms"]), "bf16",
                            [("head_dims_vs_sdpa", by_ratio)]))
    return rows


TUNED = "matmul_tuned (autotuned)"
TUNED_SHOWN = ("square 4096", "square 8192", "one row", "skinny MLP")   # labels of the sweep
TUNED_SQUARE = 8192            # the size of lesson 07's 8192^3 target


def autotuning(rec) -> list[Row]:
    """Lesson 07: the tuned kernel beside ``torch.matmul`` on a few of the sweep's shapes and
    every shape below the floor, the sweep's geometric means, and the tuning cache's cost."""
    ctx = Context(rec)
    res, rows = ctx.res, []
    shapes = list(res["shapes"])
    for s in shapes:
        dims = (s["M"], s["N"], s["K"])
        target = "tuned_8192" if dims == (TUNED_SQUARE,) * 3 else "tuned_floor"
        row = ctx.row(TUNED, f"{'x'.join(map(str, dims))} {s['dtype']}",
                      "torch.matmul", Value(s["tuned_tflops"], "TFLOP/s"),
                      Value(s["torch_tflops"], "TFLOP/s"), ratio_of(s["tuned_ms"], s["torch_ms"]),
                      s["dtype"], [(target, by_ratio)])
        if s["label"] in TUNED_SHOWN or row.missed:
            rows.append(row)
    sweep = f"{len(shapes)} shapes x dtypes"
    rows.append(summary(ctx, f"{TUNED} (geometric mean)", sweep, "torch.matmul",
                        geomean_of(ratio_of(s["tuned_ms"], s["torch_ms"]) for s in shapes),
                        "tuned_geomean"))
    fixed = f"lesson 04's setting ({autotuning_experiment.describe(res['fixed'].value)})"
    rows.append(summary(ctx, f"{TUNED} (geometric mean)", sweep, fixed,
                        geomean_of(ratio_of(s["tuned_ms"], s["fixed_ms"]) for s in shapes),
                        "tuned_vs_fixed"))
    t = res["tuning_time"]
    cached, untuned = (Value(t[f"{k}_s"], "s", low=min(t[f"{k}_runs_s"]),
                             high=max(t[f"{k}_runs_s"])) for k in ("cached", "untuned"))
    rows.append(ctx.row(f"{TUNED}: a fresh process, tuning cache on disk",
                        f"every call of the sweep ({sweep}); medians of "
                        f"{len(t['cached_runs_s'])} processes, ratio: median of the pairs",
                        "a fresh process with lesson 04's setting (never tunes)", cached, untuned,
                        1 / autotuning_experiment.cached_over_untuned(t.value),
                        verdicts=[("tuning_cache",
                                   lambda r: autotuning_experiment.cached_over_untuned(
                                       t.value))]))
    return rows


DRAWN = "matmul() (tuned path), shapes drawn at record time"
# (ratio in a drawn row, baseline, layout, (part, geometric-mean target) pairs, floor target)
DRAWN_SWEEPS = (
    ("vs_cublas", "cuBLAS (torch.matmul; on padded operands where faster)", "",
     (("all", "drawn_geomean"), ("aligned", "drawn_aligned"), ("unaligned", "")), "drawn_floor"),
    ("linear_vs_f_linear", "F.linear (on padded operands where faster)", ", x @ W.T",
     (("all", "linear_geomean"), ("aligned", ""), ("unaligned", "")), "linear_floor"),
)


def matmul_shapes(rec) -> list[Row]:
    """Issue 27's sweep of drawn shapes: geometric means over all, aligned and unaligned
    rows against cuBLAS (padded where that is faster), the worst row against the floor, the
    same for ``x @ W.T`` against ``F.linear``, and the back-to-back loops."""
    ctx = Context(rec)
    res = ctx.res
    drawn = list(res["rows"])
    seed = f"seed {res['seed']}"
    out = []
    for key, baseline, layout, parts, floor in DRAWN_SWEEPS:
        for part, target in parts:
            chosen = [r for r in drawn if part == "all" or r["aligned"] == (part == "aligned")]
            if chosen:
                out.append(summary(ctx, f"{DRAWN}{layout} (geometric mean)",
                                   f"{len(chosen)} {part} shapes, {seed}", baseline,
                                   geomean_of(r[key] for r in chosen), target))
        worst = min(drawn, key=lambda r: r[key])
        below = sum(not TARGETS[floor].met(r[key]) for r in drawn)
        out.append(ctx.row(f"{DRAWN}{layout}: the slowest shape",
                           f"{worst['M']} x {worst['N']} x {worst['K']} {worst['dtype']}, "
                           f"{worst['family']} ({below} of {len(drawn)} shapes under "
                           f"{TARGETS[floor].goal:g}x)", baseline, None, None, worst[key],
                           verdicts=[(floor, by_ratio)]))
    for loop in res["back_to_back"]:
        out.append(ctx.row(f"{DRAWN}: back to back", f"{loop['M']} x {loop['N']} x "
                           f"{loop['K']} bf16, {loop['calls']} calls, no L2 flush: a call's time",
                           "torch.matmul", Value(loop["ours_us"] / 1e3, "ms"),
                           Value(loop["torch_us"] / 1e3, "ms"), loop["ours_vs_torch"],
                           verdicts=[("back_to_back", by_ratio)]))
    return out


def moe(rec) -> list[Row]:
    """Lesson 08: the experts as one grouped GEMM beside the per-expert loop,
    ``torch._grouped_mm`` (its faster weight layout) and a dense matmul of the same FLOPs at
    each shape's smallest and largest token count and the one its targets hold at
    (``experiments.moe.TARGET_TOKENS``), the whole layer beside the loop at the same; every
    token count that misses a target; a part of the experiment that
    failed, as a row that says so."""
    from ..experiments import moe as m

    ctx = Context(rec)
    res, rows = ctx.res, []
    dtype = res["config"]["dtype"]
    for part in ("checks", "experts", "layer"):
        rows += [ctx.row(f"MoE {part}", "a part that failed", "", Value(None, "TFLOP/s", "failed"),
                         None, None) for e in res[part] if "error" in e]
    for key in res["config"]["shapes"].value:
        s = res["config"]["shapes"][key]
        shape = f"{key} (E={s['experts']}, top-{s['top_k']}, H={s['hidden']}, I={s['width']})"
        checks = res["checks"].where_(shape=key)
        wrong = {part: check_of(checks[0][part].one(name=m.OURS)) if checks else ""
                 for part in ("experts", "layer")}
        found = res["experts"].where_(shape=key) or [res["experts"].one(shape=key)]
        held = m.TARGET_TOKENS.get(key)          # the token count its goals hold at
        shown = {min(e["tokens"] for e in found), max(e["tokens"] for e in found), held}
        for e in found:
            gmm = [v for v in e["versions"] if v["name"] in m.GMM.values()]
            gmm = min(gmm, key=lambda v: timing(v) or float("inf"))["name"]
            for base, target in ((m.LOOP, ""), (gmm, f"moe_vs_grouped_mm_{key}"),
                                 (m.DENSE, f"moe_vs_dense_{key}")):
                row = versions(ctx, e, m.OURS, base, f"MoE experts: {m.OURS}",
                               f"{shape}, T={e['tokens']} {dtype}", "TFLOP/s", dtype,
                               _if_set(target) if e["tokens"] == held else [],
                               wrong["experts"])
                if e["tokens"] in shown or row.missed:
                    rows.append(row)
        for e in res["layer"].where_(shape=key):
            row = versions(ctx, e, m.OURS, m.LOOP, f"MoE layer: {m.OURS}",
                           f"{shape}, T={e['tokens']} {dtype}", "TFLOP/s", dtype,
                           _if_set(f"moe_layer_{key}") if e["tokens"] == held else [],
                           wrong["layer"])
            if e["tokens"] in shown or row.missed:
                rows.append(row)
    return rows


def moe_training(rec) -> list[Row]:
    """Lesson 08's trainable layer: forward + backward beside autograd through
    ``torch._grouped_mm`` (its faster weight layout), each shape and token count; the
    targets at the token counts they hold at; ours counts as not run where its gradient
    check failed."""
    from ..experiments import moe_training as m

    ctx = Context(rec)
    res, rows = ctx.res, []
    dtype = res["config"]["dtype"]
    for e in res["timings"]:
        key = e["shape"]
        s = res["config"]["shapes"][key]
        shape = f"{key} (E={s['experts']}, top-{s['top_k']}, H={s['hidden']}, I={s['width']})"
        wrong = check_of(res["checks"][key][m.OURS])
        o, b = e["versions"].one(name=m.OURS), m.fastest_baseline(e)
        ours = Value(None, "TFLOP/s", wrong or failure(o)) if wrong or failure(o) else \
            Value(o["step_tflops"], "TFLOP/s")
        base = Value(None, "TFLOP/s", "did not run") if b is None else \
            Value(b["step_tflops"], "TFLOP/s")
        ratio = None if ours.number is None or b is None else b["step"]["ms"] / o["step"]["ms"]
        held = e["tokens"] == res["config"]["target_tokens"][key]
        # A record from before x required grad: the baseline's autograd skipped dx's GEMM.
        unlike = "" if "x_requires_grad" in res["config"] else ", x without grad (dx skipped)"
        rows.append(ctx.row("MoE layer forward + backward: " + m.OURS,
                            f"{shape}, T={e['tokens']} {dtype}",
                            (b["name"] if b else "torch._grouped_mm autograd") + unlike,
                            ours, base, ratio,
                            dtype, _if_set(f"moe_training_{key}") if held else []))
    return rows


def fp8(rec) -> list[Row]:
    """Lesson 09: per-tensor and row-wise scaled FP8 beside ``torch._scaled_mm`` and beside
    the course's bf16 matmul at every shape (drawn ones included), block scales beside our
    per-tensor kernel at the shape its target names, and the quantisation kernel beside a
    copy."""
    from ..experiments import fp8 as f

    ctx = Context(rec)
    rows = []
    ours, block = "ours, tensor scales", "ours, block scales"
    for e in ctx.res["speed"]:
        M, N, K = e["shape"]
        shape = f"{M} x {N} x {K}{' (drawn)' if e['drawn'] else ''}"
        # Where cuBLAS refuses the shape (K or N not a multiple of 16): on padded operands.
        cublas = "torch._scaled_mm, tensor scales"
        if failure(e["versions"].one(name=cublas)) and e["versions"].where_(name=f.PADDED):
            cublas = f.PADDED
        rows.append(versions(ctx, e, ours, cublas, "FP8 matmul, per-tensor scales", shape,
                             "TFLOP/s", "fp8", [("fp8_vs_scaled_mm", by_ratio)]))
        rows.append(versions(ctx, e, "ours, row scales", "torch._scaled_mm, row scales",
                             "FP8 matmul, row scales", shape, "TFLOP/s", "fp8"))
        rows.append(versions(ctx, e, ours, "course matmul, bf16", "FP8 matmul, per-tensor "
                             "scales", shape, "TFLOP/s", "fp8", [("fp8_vs_bf16", by_ratio)]))
        if tuple(e["shape"]) == f.BLOCK_VS_TENSOR[1]:
            rows.append(versions(ctx, e, block, ours, "FP8 matmul, 1x128 / 128x128 block "
                                 "scales", shape, "TFLOP/s", "fp8",
                                 [("fp8_block_vs_tensor", by_ratio)]))
    q, granularity = ctx.res["quantize"], f.QUANTIZE_OF_COPY[1]
    mine, copy = q[granularity], q["copy"]
    ratio = None if failure(mine) else copy["ms"] / mine["ms"] * mine["bytes"] / (
        2 * q["shape"][0] * q["shape"][1] * 2)
    rows.append(ctx.row(f"FP8 quantisation, {granularity} groups", " x ".join(
        map(str, q["shape"])) + " bf16 -> e4m3", "a copy (Tensor.copy_)",
        rate_of(mine, "GB/s", None if failure(mine) else mine["bytes"]), Value(copy["gbps"], "GB/s"), ratio,
        "bf16", [("fp8_quantize", by_ratio)]))
    return rows


def _if_set(target: str) -> list:
    """A ratio's target, where the course sets one (lesson 08's are per shape)."""
    return [(target, by_ratio)] if target in TARGETS else []


COALESCING = (("copy, strips of rows (coalesced)", "PyTorch y.copy_(x)"),
              ("copy, strips of columns (strided)", "PyTorch y.copy_(x)"),
              ("transpose, strips (reads coalesced, writes strided)", "PyTorch y.copy_(x.t())"),
              ("transpose, 2-D tiles (both coalesced)", "PyTorch y.copy_(x.t())"))


def memory_levels(rec) -> list[Row]:
    """Lesson 01's second experiment: the copy and transpose kernels, coalesced or strided,
    beside PyTorch's copies of the same matrix. (Its L2 read loop has no baseline.)"""
    ctx = Context(rec)
    c = ctx.res["coalescing"]
    shape = f"{c['n']} x {c['n']} {c['dtype']}"
    return [versions(ctx, c, ours, base, ours, shape, "GB/s") for ours, base in COALESCING]


TORCH_TF32, TORCH_FP32 = "torch.matmul, TF32 (allow_tf32=True)", \
    "torch.matmul, full fp32 (allow_tf32=False)"


def tf32(rec) -> list[Row]:
    """Lesson 04's second experiment: fp32 inputs. The fastest ``tl.dot`` TF32 setting beside
    ``torch.matmul`` with TF32 on, and ``tl.dot`` in true fp32 beside full-fp32 cuBLAS."""
    ctx = Context(rec)
    res, n = ctx.res, ctx.res["n"]
    tuned = res["rows"].where_(kind="triton tf32") or [res["rows"].one(kind="triton tf32")]
    fastest = min(tuned, key=lambda r: r["ms"])
    ieee = res["rows"].one(kind="triton ieee")
    return [versions(ctx, res, fastest["name"], TORCH_TF32, f"{fastest['name']} (fastest of "
                     f"{len(tuned)})", f"{n}^3 fp32 inputs", "TFLOP/s", "tf32"),
            versions(ctx, res, ieee["name"], TORCH_FP32, ieee["name"], f"{n}^3 fp32", "TFLOP/s",
                     "fp32")]


EPILOGUE = ("Triton, leaky_relu in the epilogue (1 kernel)",
            "cuBLAS, then F.leaky_relu (2 kernels)")


def fusion_more(rec) -> list[Row]:
    """Lesson 05's second experiment: a matmul with its activation fused in the epilogue
    beside cuBLAS and a separate ``F.leaky_relu``, at each size; and the fused softmax beside
    both ``torch.compile`` spellings of the five-op softmax, at the smallest and largest N."""
    from ..experiments.fusion_more import SPELLINGS

    ctx = Context(rec)
    ours, base = EPILOGUE
    rows = [versions(ctx, e, ours, base, f"matmul + leaky_relu: {ours}",
                     f"{e['n']}^3 {e['dtype']}", "TFLOP/s", e["dtype"])
            for e in ctx.res["epilogue"]]
    spellings = list(ctx.res["spellings"])
    ns = {min(e["n"] for e in spellings), max(e["n"] for e in spellings)}
    for e in (e for e in spellings if e["n"] in ns):
        shape = f"{e['m']} x {e['n']} {e['dtype']}"
        for name in SPELLINGS:
            if "error" in e["code"][name]:      # it did not compile: nothing was timed
                ours_value = rate_of(e["rows"].one(name=FUSED_SOFTMAX), "GB/s",
                                     e["compulsory_bytes"], checked=True)
                rows.append(ctx.row(f"softmax: {FUSED_SOFTMAX}", shape, name, ours_value,
                                    Value(None, "GB/s", "failed to compile"), None))
                continue
            rows.append(versions(ctx, e, FUSED_SOFTMAX, name, f"softmax: {FUSED_SOFTMAX}", shape,
                                 "GB/s", nbytes=e["compulsory_bytes"]))
    return rows


EXTRACTORS = {"memory_wall": memory_wall, "memory_levels": memory_levels,
              "vector_add": vector_add, "tiling": tiling, "tf32": tf32, "fusion": fusion,
              "fusion_more": fusion_more, "attention": attention, "autotuning": autotuning,
              "moe": moe, "attention_decode": attention_decode, "moe_training": moe_training,
              "fp8": fp8, "matmul_shapes": matmul_shapes}
# A lesson's further experiments: the topic of the lesson each belongs to.
TOPIC_OF = {"memory_levels": "memory_wall", "tf32": "tiling", "fusion_more": "fusion",
            "attention_tiles": "attention", "attention_decode": "attention",
            "moe_parallel": "moe", "moe_parallel_4gpu": "moe", "moe_training": "moe",
            "matmul_shapes": "autotuning",
            "profiles": "fusion", "tiling_ncu": "tiling", "tail_ncu": "autotuning",
            "noise": "roofline"}
# Records with no course kernel timed beside a baseline, and why.
NOT_REPORTED = {
    "roofline": "PyTorch's and cuBLAS's own ops placed on the roofline: no course kernel",
    "probes": "the copy and matmul ceilings, measured with PyTorch alone",
    "attention_tiles": "lesson 06's kernels under each tile setting: a sweep with no baseline",
    "moe_parallel": "expert parallelism across the GPUs of one machine, not one GPU's kernels",
    "moe_parallel_4gpu": "the same across 4 GPUs",
    "profiles": "torch.profiler's kernel tables of lessons 01 and 05: where a call's time goes",
    "tiling_ncu": "Nsight Compute counters of lesson 04's ladder: why each rung runs as it does",
    "tail_ncu": "Nsight Compute counters of lesson 07's tail shape: why stream-K trails cuBLAS",
    "noise": "cuBLAS's reference per dtype and its run-to-run spread, with clocks and power",
    "softmax_tuning": "assignment 07's data: every setting of the online softmax on 24 shapes",
}


def extract(rec) -> list[Row]:
    """The rows that represent ``rec`` (none for the kinds in :data:`NOT_REPORTED`)."""
    if rec.name in NOT_REPORTED:
        return []
    if rec.name not in EXTRACTORS:
        raise RecordFieldError(
            f"the report has no extractor for the {rec.name!r} record: add one to EXTRACTORS in "
            "helpers/performance/extractors.py, or list it in NOT_REPORTED with the reason")
    return EXTRACTORS[rec.name](rec)
