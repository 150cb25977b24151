"""Assignment 05, fuse residual add + LayerNorm: its graded parts and ``check_*`` calls.

Lesson 05 fused residual add + RMSNorm (a Llama block's norm) and ships that kernel. This
assignment asks for the norm of GPT-2, BERT, ViT and Whisper, LayerNorm, which the course
does not write: the row is centred before it is scaled, and shifted by a bias after. The
learner counts the bytes of its eager version (here, :func:`residual_layernorm_eager`),
designs the fused kernel (the program layout, the block, how the statistics are kept
exact) and, on a GPU, beats PyTorch's own fused LayerNorm after the add.

Every expected number comes from the answer key (``keys_fusion``: the eager version traced
on meta tensors, the committed probe record's copy bandwidth), sealed in a release.

Parts (20 points; 15 graded in CPU mode, the last 5 on a GPU):

=====  ==========================================================  ======
1a-1d  napkin math at 4096 x 8192 bf16: bytes of the eager version,    8
       bytes of the fused kernel, predicted speed-up, predicted time
2a     ``residual_layernorm`` launches the notebook's Triton kernel    5
       and matches the reference on awkward shapes, three dtypes and
       rows that trip the usual designs
2b     its kernel never reads or writes outside its tensors             2
3a     >= 1.35x faster than add + ``F.layer_norm`` (GPU)                3
3b     within 20 % of the predicted time (GPU)                          2
=====  ==========================================================  ======
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F

from ...feedback import graded_number, target
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function

M, N = 4096, 8192
BF16 = torch.bfloat16
EPS = 1e-5                       # F.layer_norm's default
TOLERANCE = 0.02                 # relative, for every napkin-math number
# Part 3a: the speed-up over add + F.layer_norm, PyTorch's own fused LayerNorm after the
# add, timed side by side. The bytes alone predict 1.25x (10 MN bytes against 8 MN: the add
# writes h and the norm reads it back), were both at the same fraction of the copy
# bandwidth; but PyTorch's LayerNorm kernel runs well below it on these rows (about 60 % on
# an H100), so a fused kernel near the copy bandwidth does better: the solution's kernel
# measured 1.57x on an H100 (98 % of the copy bandwidth; bash tests/gpu/device.sh pytest
# tests/test_grading_05.py). The goal passes a fused kernel at 85 % of the copy bandwidth
# and fails the add and the norm as two kernels even at full bandwidth (1.25x);
# tests/test_grading_05.py checks it against the bytes, and on a GPU that the solution
# passes.
SPEEDUP_GOAL = 1.35
TIME_SLACK = 1.2                 # part 3b: measured time <= 1.2 x predicted

# ------------------------------------------------------------------------------------
# The three versions the notebook compares: eager, PyTorch's, and the exact reference.
# ------------------------------------------------------------------------------------

def residual_layernorm_eager(x, residual, weight, bias, eps=EPS):
    """Residual add + LayerNorm written op by op, as a reference implementation does:
    statistics in fp32, the result rounded to the input dtype, then scaled and shifted."""
    h = x + residual
    hf = h.to(torch.float32)
    mean = hf.mean(-1, keepdim=True)
    centred = hf - mean
    variance = centred.pow(2).mean(-1, keepdim=True)
    normed = centred * torch.rsqrt(variance + eps)
    return h, normed.to(x.dtype) * weight + bias


def residual_layernorm_torch(x, residual, weight, bias, eps=EPS):
    """The add, then PyTorch's own fused LayerNorm kernel (two kernels)."""
    h = x + residual
    return h, F.layer_norm(h, (h.shape[-1],), weight, bias, eps)


def residual_layernorm_reference(x, residual, weight, bias, eps=EPS):
    """The exact answer: h rounded to the input dtype, as a kernel stores it; y from that h
    in float64, rounded once."""
    h = x + residual
    return h, layernorm_of(h, weight, bias, eps)


def layernorm_of(h, weight, bias, eps=EPS):
    """y of a stored ``h`` (its dtype's), in float64, rounded once to that dtype."""
    hd = h.double()
    mean = hd.mean(-1, keepdim=True)
    variance = (hd - mean).pow(2).mean(-1, keepdim=True)
    y = (hd - mean) * torch.rsqrt(variance + eps) * weight.double() + bias.double()
    return y.to(h.dtype)


TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2.0**-10, 3 * 2.0**-10),
              torch.bfloat16: (2.0**-7, 3 * 2.0**-7)}
FAR_TOLERANCE = 1e-3             # rows far from zero (see ResidualLayerNorm.compare)


# ------------------------------------------------------------------------------------
# Part 1: napkin math.
# ------------------------------------------------------------------------------------

# The answers: formulas in keys_fusion (instructor), sealed in a student release.
KEY = answers.LazyKey("05_fusion", "helpers.grading.assignments.keys_fusion")
# A graded number: (part, title, points, the notebook's name, unit, hint) -> Part.
_number = partial(harness.number_part, KEY)


def reference_copy_gbps() -> tuple[float, str]:
    """The copy bandwidth of the course's reference GPU, from the committed probe record."""
    from ... import records

    rec = records.load("probes")
    return rec.results["copy"]["gbps"], rec.label


def _predicted(ns):
    """Part 1d: its hint reads the copy bandwidth from the probe record, when judged."""
    gbps, label = reference_copy_gbps()
    return graded_number(
        "1d predicted time", answer(ns, "predicted_ms"), KEY["1d"], unit="ms",
        hint=f"fused bytes / copy bandwidth ({gbps:,.0f} GB/s in the probe record, {label}).")


def trace_after_1a(eager_bytes) -> str:
    """Every kernel the eager version launches at M x N bf16, with the bytes each reads and
    writes (``helpers.launches.trace`` on meta tensors), beside ``eager_bytes``; only once
    that answer is right (part 1a), since the trace's total is the answer. Skipped while
    grading, as the checks are: it shows, it judges nothing (and loading the key costs a
    trace, in every notebook graded)."""
    if os.environ.get("COURSE_GRADING") == "1":
        return "trace skipped: the grader runs this notebook and checks part 1a itself"
    try:
        right = KEY["1a"].matches(float(eager_bytes))
    except (TypeError, ValueError):
        right = False
    if not right:
        return ("The trace opens once part 1a is right (check_napkin_math above): it lists "
                "every kernel's bytes, so it would give the answer away.")
    from ...launches import trace

    x = torch.empty(M, N, device="meta", dtype=BF16)
    w = torch.empty(N, device="meta", dtype=BF16)
    calls = trace(residual_layernorm_eager, x, x, w, w)
    return f"{calls}\n\nyour eager_bytes: {eager_bytes:,}, traced: {calls.bytes:,}"


# ------------------------------------------------------------------------------------
# Part 2: the fused kernel, on awkward shapes, in three dtypes, on rows that trip designs.
# ------------------------------------------------------------------------------------

# (rows, cols): one element; odd widths; a power of two; just past one; past 4096.
SHAPES = ((1, 1), (3, 7), (5, 1000), (4, 1024), (2, 1025), (3, 4097), (6, 1))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
COMPILED_SHAPES = ((1024, N, BF16), (4097, 1000, torch.float32), (7, 12289, torch.float16))
# Rows every LayerNorm must survive:
# * "constant row": h the same value everywhere, so its variance is 0 and y is the bias
#   (eps inside the square root keeps 0 / 0 away);
# * "far from zero": h = 1000 + noise, so E[h^2] - E[h]^2 cancels almost every digit of
#   fp32 (the variance must come from centred values); bf16 cannot hold such a row's noise
#   (8 bits of mantissa), so only fp32 and fp16 draw it;
# * "one huge value": its square overflows fp16 unless the statistics are kept in fp32.
EDGE_ROWS = ("constant row", "far from zero", "one huge value")
DTYPE_OF = {harness.dtype_name(d): d for d in DTYPES}


class ResidualLayerNorm(harness.KernelTask):
    function = "residual_layernorm"
    call = "residual_layernorm(x, residual, weight, bias)"
    outputs = ("h", "y")
    inputs_named = ("x", "residual", "weight", "bias")
    mask_hint = ("The row is shorter than the block: mask the lanes past n_cols on every "
                 "tl.load and tl.store (the weight's and the bias's too)")

    @staticmethod
    def case(shape, dtype, rows="randn", compiled=False):
        name = harness.dtype_name(dtype)
        label = f"shape {shape[0]}x{shape[1]}, {name}" + ("" if rows == "randn" else f", {rows}")
        return harness.Case(label, {"shape": list(shape), "dtype": name, "rows": rows}, 0,
                            compiled)

    def first(self):
        return self.case(SHAPES[2], torch.float32)

    def cases(self, blocks):
        out = [self.case(shape, dtype) for dtype in DTYPES for shape in SHAPES]
        return out + [self.case((4, 1000), dtype, rows) for dtype in DTYPES
                      for rows in EDGE_ROWS
                      if not (rows == "far from zero" and dtype == torch.bfloat16)]

    def compiled_cases(self, blocks):
        return [self.case((rows, cols), dtype, compiled=True)
                for rows, cols, dtype in COMPILED_SHAPES]

    def inputs(self, case, device):
        rows, cols = case.params["shape"]
        dtype = DTYPE_OF[case.params["dtype"]]
        g = harness.generator(case.seed)
        x = 0.5 + 2 * torch.randn(rows, cols, generator=g)    # rows off centre, as in models
        r = torch.randn(rows, cols, generator=g)
        w = 1 + 0.1 * torch.randn(cols, generator=g)
        b = 0.5 * torch.randn(cols, generator=g)
        if case.params["rows"] == "constant row":
            x[::2], r[::2] = 1.5, 1.5                    # h = 3 exactly, in every dtype
        elif case.params["rows"] == "far from zero":
            x[::2] = 1000.0 + (x[::2] - r[::2]) / 4
        elif case.params["rows"] == "one huge value":
            x[::2], r[::2] = 0.0, 0.0
            # fp16: 1000^2 overflows fp16 (max 65504); bf16 and fp32 share fp32's range.
            x[::2, cols // 3] = 1000.0 if dtype == torch.float16 else 1e15
        return tuple(t.to(dtype).to(device) for t in (x, r, w, b))

    def reference(self, case, inputs):
        return residual_layernorm_reference(*inputs, EPS)

    def compare(self, case, got, want, inputs, blocks):
        x, r, w, b = inputs
        atol, rtol = TOLERANCES[DTYPE_OF[case.params["dtype"]]]
        if case.params["rows"] == "far from zero":
            # The mean of values near 1000 carries fp32's rounding of their sum (about 1e-4
            # of the row's spread, however it is summed in a tree): the two-pass variance is
            # within 1e-3; mean(h^2) - mean(h)^2 misses by 2e-2 or more.
            atol, rtol = max(atol, FAR_TOLERANCE), max(rtol, FAR_TOLERANCE)
        # y is judged as the norm of the h the kernel stored: an h one rounding away from
        # torch's (Triton's interpreter truncates fp32 to bf16, torch rounds) moves a row's
        # mean, which the bias does not hide where y is near 0.
        want = (want[0], layernorm_of(got[0], w, b))
        for name, g, t in zip(self.outputs, got, want):
            bad = harness.close_hint(g, t, atol, rtol)
            if bad is None:
                continue
            count, i = bad
            first = (f"{count} of {t.numel()} elements of {name} are off; first at {list(i)}: "
                     f"expected {harness.finite_or_nan(t[i].float().item())}, got "
                     f"{harness.finite_or_nan(g[i].float().item())} (tolerance {atol:.2g} + "
                     f"{rtol:.2g} x |expected|)")
            if name == "h":
                hint = "h must be x + residual, rounded to the input dtype"
            elif case.params["rows"] != "randn":
                hint = _edge_hint(case.params["rows"])
            else:
                hint = _diagnose_y(got[1], got[0], w, b)
            return f"{first}. {hint}"
        return None

    def summary(self, cases):
        shapes = ", ".join(f"{a}x{b}" for a, b in SHAPES)
        return (f"{shapes} in {', '.join(harness.dtype_name(d) for d in DTYPES)}, with "
                "constant rows, rows far from zero and rows of one huge value")


TASK = ResidualLayerNorm()


def _edge_hint(rows: str) -> str:
    if rows == "constant row":
        return ("wrong only where h is constant along the row: its variance is 0 and y must "
                "be the bias there, so eps belongs inside the square root and nothing may "
                "divide by the row's spread")
    if rows == "far from zero":
        return ("wrong only on rows whose values sit far from zero with a small spread: the "
                "variance lost its digits there. Computing it as mean(h^2) - mean(h)^2 "
                "subtracts two nearly equal numbers; compute it from the centred values")
    return ("wrong only on a row holding one huge value: its square overflows fp16, so "
            "convert h to fp32 before the statistics")


def _layernorm(h, eps=EPS, unbiased=False, centred=True):
    hf = h.double()
    mean = hf.mean(-1, keepdim=True) if centred else torch.zeros_like(hf[..., :1])
    n = hf.shape[-1]
    variance = (hf - mean).pow(2).sum(-1, keepdim=True) / (n - 1 if unbiased else n)
    return (hf - mean) * torch.rsqrt(variance + eps)


def _diagnose_y(got, h, w, b) -> str:
    """A hint for a wrong y: the usual slips leave a signature (named, never a value).

    A slip is named when ``got`` is far nearer to what that slip computes than to the right
    answer (a quarter of the distance): small errors of other kinds are not blamed on it."""
    g = got.double()
    wd, bd = w.double(), b.double()
    normed = _layernorm(h)
    right = normed * wd + bd
    rms = _layernorm(h, centred=False)
    slips = {
        "y matches the norm without the bias: add bias[col] after the scale": normed * wd,
        "y matches the norm without the weight: multiply by weight[col]": normed + bd,
        "y matches the norm without the weight and the bias: scale, then shift": normed,
        "y matches RMSNorm (the row scaled by its root mean square): LayerNorm subtracts the "
        "row's mean first, and its variance is that of the centred row": rms * wd + bd,
        "y matches RMSNorm without the bias (the row scaled by its root mean square): "
        "LayerNorm subtracts the row's mean first, and shifts by the bias last": rms * wd,
    }
    centred = h.double() - h.double().mean(-1, keepdim=True)
    variance = centred.pow(2).mean(-1, keepdim=True)
    slips["eps belongs inside the square root: rsqrt(variance + eps)"] = \
        centred * (torch.rsqrt(variance) + EPS) * wd + bd
    if h.shape[-1] > 2:
        slips["y uses the variance with n_cols - 1: LayerNorm divides the sum of squared "
              "deviations by n_cols"] = _layernorm(h, unbiased=True) * wd + bd
    if not torch.isnan(g).any():
        off = (g - right).abs().max()
        hint, dist = min(((k, torch.nan_to_num((g - v).abs().max(), nan=float("inf")))
                          for k, v in slips.items()), key=lambda kv: float(kv[1]))
        if dist < 0.25 * off:
            return hint
    if h.shape[-1] == 1:
        return ("a row of one element has variance 0, so y is the bias there: the variance "
                "divides by n_cols (not n_cols - 1), and eps belongs inside the square root")
    if torch.isnan(g).any():
        return ("y has NaN: a masked-off lane entered the statistics (load it as 0 and keep "
                "it out of the centred values), or the output has elements no program wrote")
    scale = (g - bd) / wd
    ratio = scale.norm(dim=-1) / normed.norm(dim=-1).clamp_min(1e-30)
    if h.shape[-1] > 1 and (ratio - ratio.mean()).abs().max() < 1e-2 * ratio.mean() \
            and abs(ratio.mean().item() - 1) > 1e-2:
        return (f"every row is {ratio.mean().item():.3g} times the reference before the "
                "shift: the mean and the variance divide by n_cols (not the block size)")
    return ("compare y = (h - mean) * rsqrt(variance + eps) * weight + bias, row by row, in "
            "fp32, with mean and variance over the row's n_cols values")


def _collect_kernel(ns, seed):
    return harness.collect(TASK, ns, seed)


def _kernel_correct(raw):
    v = harness.verdict_of(TASK, raw)
    return v.correctness("2a residual_layernorm is right",
                         f"h and y match the reference on {TASK.summary(v.watched)}")


def _kernel_in_bounds(raw):
    return harness.verdict_of(TASK, raw).in_bounds("2b the kernel stays in bounds")


# ------------------------------------------------------------------------------------
# Part 3 (GPU): timed at 4096 x 8192 bf16, beside add + F.layer_norm and the eager version.
# ------------------------------------------------------------------------------------

def _collect_timings(ns, seed) -> dict:
    """In the collection process: time ``residual_layernorm`` beside PyTorch's (GPU)."""
    from ... import bench

    fn = answer(ns, "residual_layernorm")
    x, r, w, b = TASK.inputs(ResidualLayerNorm.case((M, N), BF16).seeded(seed), "cuda")
    with gpu_lock():
        copy = bench.measure_copy_bandwidth()
        fn(x, r, w, b)
        yours = bench.time_ms(lambda: fn(x, r, w, b))
        pytorch = bench.time_ms(lambda: residual_layernorm_torch(x, r, w, b))
        norm_only = bench.time_ms(lambda: F.layer_norm(x, (N,), w, b, EPS))
        eager = bench.time_ms(lambda: residual_layernorm_eager(x, r, w, b))
    h, y = fn(x, r, w, b)
    # The bytes the fused kernel must move: its inputs and outputs, each once.
    moved = sum(t.numel() * t.element_size() for t in (x, r, w, b, h, y))
    return {"yours": yours, "torch": pytorch, "norm_only": norm_only, "eager": eager,
            "copy_gbps": copy["gbps"], "bytes": moved, "gpu": torch.cuda.get_device_name()}


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9) * 1e3


def _speed(t):
    part = "3a faster than add + F.layer_norm"
    ratio = float(t["torch"]) / float(t["yours"])
    # F.layer_norm alone moves 4 MN bytes (h in, y out): its share of the copy bandwidth
    # says how much of the win is PyTorch's kernel running below it, not the fusion.
    norm_share = _ms(4 * M * N, float(t["copy_gbps"])) / float(t.get("norm_only") or "nan")
    text = (f"on {t['gpu']} at {M}x{N} bf16: yours {t['yours']:.4f} ms, add + F.layer_norm "
            f"{t['torch']:.4f} ms: {ratio:.2f}x (the goal is {SPEEDUP_GOAL:g}x; the eager "
            f"version took {float(t['eager']):.4f} ms; F.layer_norm alone ran at "
            f"{norm_share:.0%} of the copy bandwidth)")
    return target(part, ratio >= SPEEDUP_GOAL, text,
                  "A fused kernel should read x, residual, the weight and the bias once and "
                  "write h and y once, with nothing but the launch in residual_layernorm: "
                  "count what your kernel reads per row, and try the number of warps")


def _near_prediction(t):
    part = "3b within 20% of the predicted time"
    predicted = _ms(float(t["bytes"]), float(t["copy_gbps"]))
    yours = float(t["yours"])
    text = (f"on {t['gpu']}: measured {yours:.4f} ms = {yours / predicted:.2f}x the time the "
            f"fused bytes need at the copy bandwidth measured now, {t['copy_gbps']:,.0f} GB/s "
            f"(at most {TIME_SLACK:g}x)")
    return target(part, yours <= TIME_SLACK * predicted, text,
                  "Too slow for its bytes: try another number of warps, and check that each "
                  "row is read once")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="05_fusion",
    title="Fuse residual add + LayerNorm",
    parts=(
        _number("1a", "bytes of the eager version", 3, "eager_bytes", "bytes",
                "every op of the eager version is a kernel (the .to() conversions too): for "
                "each, the bytes of every tensor it reads plus every tensor it writes."),
        _number("1b", "bytes of the fused kernel", 2, "fused_bytes", "bytes",
                "what must cross DRAM at least once, in and out, if nothing is read twice."),
        _number("1c", "predicted speed-up", 1, "predicted_speedup", "x",
                "both versions are memory-bound."),
        Part("1d", "predicted time", 2, _predicted, ("predicted_ms",)),
        Part("2a", "residual_layernorm is right", 5, _kernel_correct, ("residual_layernorm",),
             group="kernel", collect=_collect_kernel),
        Part("2b", "the kernel stays in bounds", 2, _kernel_in_bounds,
             ("residual_layernorm",), group="kernel", collect=_collect_kernel),
        Part("3a", "faster than add + F.layer_norm", 3, _speed, ("residual_layernorm",),
             gpu=True, group="speed", collect=_collect_timings, after="kernel"),
        Part("3b", "within 20% of the predicted time", 2, _near_prediction,
             ("residual_layernorm",), gpu=True, group="speed", collect=_collect_timings,
             after="kernel"),
    ),
)

check_napkin_math = check_function(ASSIGNMENT, ("1a", "1b", "1c", "1d"),
    "Part 1: ``eager_bytes``, ``fused_bytes``, ``predicted_speedup``, ``predicted_ms``.")

check_kernel = check_function(ASSIGNMENT, ("2a", "2b"),
    "Part 2: ``residual_layernorm`` on awkward shapes, dtypes and edge rows, bounds-checked.")

check_speed = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: timed against add + F.layer_norm (GPU mode; pending on a CPU).")
