"""Assignment 05, fuse residual add + RMSNorm: its graded parts and ``check_*`` calls.

Every expected value comes from the course's own napkin math
(:mod:`helpers.kernels.rmsnorm`) and the committed probe record (the copy bandwidth
measured on the course's reference GPU), never from a typed-in number.

Parts (20 points; 15 graded in CPU mode, the last 5 on a GPU):

=====  ==========================================================  ======
1a-1d  napkin math at 4096 x 8192 bf16: bytes of the eager version,    8
       bytes of the fused kernel, predicted speed-up, predicted time
2a     ``residual_rmsnorm`` launches the notebook's Triton kernel and   5
       matches the reference on awkward shapes in fp32, fp16, bf16
2b     its kernel never reads or writes outside its tensors             2
3a     >= 5x faster than the eager PyTorch version (GPU)                3
3b     within 20 % of the predicted time (GPU)                          2
=====  ==========================================================  ======
"""

from __future__ import annotations

from functools import partial

import torch

from ...feedback import graded_number, target
from ...kernels import rmsnorm as rk
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function

M, N = 4096, 8192
BF16 = torch.bfloat16
EPS = rk.EPS
TOLERANCE = 0.02                 # relative, for every napkin-math number
# Part 3a: the measured speed-up over the eager version. The bytes predict 5.25x (part 1c:
# 42 MN bytes against 8 MN); the course's own fused kernel (helpers.kernels.rmsnorm, the
# solution's kernel) beats that prediction in the committed fusion records,
# helpers/records/fusion__H100-SXM.json and fusion__H200.json. The goal sits a little below
# the lower of the two, so a correct kernel that moves its bytes once at near the copy
# bandwidth passes with room for noise, while one that moves more (reading x and residual
# twice: 12 MN bytes, 3.5x predicted) or fuses the norm but not the add (PyTorch's
# add + F.rms_norm, in the same records) does not. tests/test_grading_05.py checks the goal
# against the records.
SPEEDUP_GOAL = 5.0
TIME_SLACK = 1.2                 # part 3b: measured time <= 1.2 x predicted

# The answers: formulas in keys_fusion (instructor), sealed in a student release.
KEY = answers.load_key("05_fusion", "helpers.grading.assignments.keys_fusion")
# A graded number: (part, title, points, the notebook's name, unit, hint) -> Part.
_number = partial(harness.number_part, KEY)


def reference_copy_gbps() -> tuple[float, str]:
    """The copy bandwidth of the course's reference GPU, from the committed probe record."""
    from ... import records

    rec = records.load("probes")
    return rec.results["copy"]["gbps"], rec.label


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9) * 1e3


# ------------------------------------------------------------------------------------
# Part 1: napkin math.
# ------------------------------------------------------------------------------------

def _predicted(ns):
    """Part 1d: its hint reads the copy bandwidth from the probe record, when judged."""
    gbps, label = reference_copy_gbps()
    return graded_number(
        "1d predicted time", answer(ns, "predicted_ms"), KEY["1d"], unit="ms",
        hint=f"fused bytes / copy bandwidth ({gbps:,.0f} GB/s in the probe record, {label}).")


def trace_after_1a(eager_bytes) -> str:
    """Every kernel the eager version launches at M x N bf16, with the bytes each reads and
    writes (``helpers.launches.trace`` on meta tensors), beside ``eager_bytes``; only once
    that answer is right (part 1a), since the trace's total is the answer."""
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
    calls = trace(rk.residual_rmsnorm_eager, x, x, w)
    return f"{calls}\n\nyour eager_bytes: {eager_bytes:,}, traced: {calls.bytes:,}"


# ------------------------------------------------------------------------------------
# Part 2: the fused kernel, on awkward shapes, in three dtypes, bounds-checked.
# ------------------------------------------------------------------------------------

# (rows, cols): one element; odd widths; a power of two; just past one (half the block
# masked); a width past 4096 with a ragged block; rows of one element.
SHAPES = ((1, 1), (3, 7), (5, 1000), (4, 1024), (2, 1025), (3, 4097), (6, 1))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
COMPILED_SHAPES = ((1024, N, BF16), (4097, 1000, torch.float32), (7, 12289, torch.float16))
# Edge rows every norm must survive: a row where x = -residual (h is all zeros: without
# eps inside the rsqrt, 0 / 0), and a row of one huge value among zeros (its square
# overflows fp16 and bf16 unless the sum of squares is kept in fp32).
EDGE_ROWS = ("zero row", "one huge value")
DTYPE_OF = {harness.dtype_name(d): d for d in DTYPES}


class ResidualRMSNorm(harness.KernelTask):
    function = "residual_rmsnorm"
    call = "residual_rmsnorm(x, residual, weight)"
    outputs = ("h", "y")
    inputs_named = ("x", "residual", "weight")
    mask_hint = ("The row is shorter than BLOCK_SIZE: mask = cols < n_cols, on every tl.load "
                 "and tl.store (the weight's too)")

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
        return out + [self.case((4, 1000), dtype, rows) for dtype in DTYPES for rows in EDGE_ROWS]

    def compiled_cases(self, blocks):
        return [self.case((rows, cols), dtype, compiled=True)
                for rows, cols, dtype in COMPILED_SHAPES]

    def inputs(self, case, device):
        rows, cols = case.params["shape"]
        dtype = DTYPE_OF[case.params["dtype"]]
        g = harness.generator(case.seed)
        x = 2 * torch.randn(rows, cols, generator=g)
        r = torch.randn(rows, cols, generator=g)
        w = 1 + 0.1 * torch.randn(cols, generator=g)
        if case.params["rows"] == "zero row":
            x[::2] = -r[::2]
        elif case.params["rows"] == "one huge value":
            x[::2], r[::2] = 0.0, 0.0
            # fp16: 1000^2 overflows fp16 (max 65504); bf16 and fp32 share fp32's range.
            x[::2, cols // 3] = 1000.0 if dtype == torch.float16 else 1e15
        return tuple(t.to(dtype).to(device) for t in (x, r, w))

    def reference(self, case, inputs):
        return rk.residual_rmsnorm_reference(*inputs, EPS)

    def compare(self, case, got, want, inputs, blocks):
        x, r, w = inputs
        atol, rtol = rk.TOLERANCES[DTYPE_OF[case.params["dtype"]]]
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
            elif case.params["shape"][1] == 1:
                hint = ("on rows of one element y = h * rsqrt(h^2 + eps) * weight, which is "
                        "+-weight only where |h| is large: eps belongs inside the square root")
            else:
                hint = _diagnose_y(got[1], want[1], got[0], w)
            return f"{first}. {hint}"
        return None

    def summary(self, cases):
        shapes = ", ".join(f"{a}x{b}" for a, b in SHAPES)
        return (f"{shapes} in {', '.join(harness.dtype_name(d) for d in DTYPES)}, with a zero "
                "row and a row of one huge value")


TASK = ResidualRMSNorm()


def _edge_hint(rows: str) -> str:
    if rows == "zero row":
        return ("wrong only where h is all zeros (x = -residual): y must be 0 there, so eps "
                "belongs inside the square root, rsqrt(mean(h^2) + eps), and nothing may divide "
                "by the row's norm")
    return ("wrong only on a row holding one huge value: its square overflows fp16 and bf16, "
            "so convert h to fp32 before squaring and summing")


def _diagnose_y(got, want, h, w) -> str:
    """A hint for a wrong y: the usual slips leave a signature."""
    g, t = got.float(), want.float()
    if torch.isnan(g).any():
        return ("y has NaN: a masked-off lane loaded without other=0.0 entered the sum of "
                "squares, or the output has elements no program wrote")
    # The weight first: its element-wise signature is the sharper one. Without it, every
    # row's norm is also off by nearly the same factor (the weight is 1 + 0.1 noise over
    # many columns), which the row test below would blame on the mean.
    unweighted = h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + EPS)
    weighted = not torch.allclose(w.float(), torch.ones_like(w.float()))
    if weighted and torch.allclose(g, unweighted, atol=0.05, rtol=0.05):
        return "y matches the norm without the weight: multiply by weight[col]"
    ratio = (g.norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-30))
    if t.shape[-1] > 1 and (ratio - ratio.mean()).abs().max() < 1e-2 * ratio.mean() \
            and abs(ratio.mean().item() - 1) > 1e-2:
        return (f"every row of y is {ratio.mean().item():.3g} times the reference: the mean of "
                "h^2 must divide by n_cols (not BLOCK_SIZE), then add eps, then take rsqrt")
    return "compare y = h * rsqrt(mean(h^2) + eps) * weight, row by row, in fp32"


def _collect_kernel(ns, seed):
    return harness.collect(TASK, ns, seed)


def _kernel_correct(raw):
    v = harness.verdict_of(TASK, raw)
    return v.correctness("2a residual_rmsnorm is right",
                         f"h and y match the reference on {TASK.summary(v.watched)}")


def _kernel_in_bounds(raw):
    return harness.verdict_of(TASK, raw).in_bounds("2b the kernel stays in bounds")


# ------------------------------------------------------------------------------------
# Part 3 (GPU): timed at 4096 x 8192 bf16, side by side with the eager version.
# ------------------------------------------------------------------------------------

def _collect_timings(ns, seed) -> dict:
    """In the learner's process: time ``residual_rmsnorm`` beside the eager version (GPU)."""
    from ... import bench

    fn = answer(ns, "residual_rmsnorm")
    x, r, w = TASK.inputs(ResidualRMSNorm.case((M, N), BF16).seeded(seed), "cuda")
    with gpu_lock():
        copy = bench.measure_copy_bandwidth()
        fn(x, r, w)
        yours = bench.time_ms(lambda: fn(x, r, w))
        eager = bench.time_ms(lambda: rk.residual_rmsnorm_eager(x, r, w))
    h, y = fn(x, r, w)
    # The bytes the fused kernel must move: its inputs and outputs, each once.
    moved = sum(t.numel() * t.element_size() for t in (x, r, w, h, y))
    return {"yours": yours, "eager": eager, "copy_gbps": copy["gbps"], "bytes": moved,
            "gpu": torch.cuda.get_device_name()}


def _speed(t):
    part = "3a faster than eager PyTorch"
    ratio = float(t["eager"]) / float(t["yours"])
    text = (f"on {t['gpu']} at {M}x{N} bf16: yours {t['yours']:.4f} ms, the eager version "
            f"{t['eager']:.4f} ms: {ratio:.2f}x (the goal is {SPEEDUP_GOAL:g}x)")
    return target(part, ratio >= SPEEDUP_GOAL, text,
                  "The fused kernel moves about a fifth of the eager version's bytes: one "
                  "program per row, the whole row in one block, each tensor read or written "
                  "once, more warps for long rows (num_warps=16 at 8192 columns), and "
                  "nothing but the kernel launch inside residual_rmsnorm")


def _near_prediction(t):
    part = "3b within 20% of the predicted time"
    predicted = _ms(float(t["bytes"]), float(t["copy_gbps"]))
    yours = float(t["yours"])
    limit = TIME_SLACK * predicted
    text = (f"on {t['gpu']}: measured {yours:.4f} ms = {yours / predicted:.2f}x the time your "
            f"fused bytes need at the copy bandwidth measured now, {t['copy_gbps']:,.0f} GB/s "
            f"(at most {TIME_SLACK:g}x)")
    return target(part, yours <= limit, text,
                  "Too slow for its bytes: try another num_warps, and check that each row is "
                  "read once")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="05_fusion",
    title="Fuse residual add + RMSNorm",
    parts=(
        _number("1a", "bytes of the eager version", 3, "eager_bytes", "bytes",
                "nine kernels: for each, the bytes of every tensor it reads plus every tensor "
                "it writes (bf16: 2 bytes, fp32: 4; the row statistics are M values, the "
                "weight N)."),
        _number("1b", "bytes of the fused kernel", 2, "fused_bytes", "bytes",
                "read x and residual, write h and y (M x N bf16 each), read the weight once."),
        _number("1c", "predicted speed-up", 1, "predicted_speedup", "x",
                "both versions are memory-bound, so their times are in the ratio of their "
                "bytes."),
        Part("1d", "predicted time", 2, _predicted, ("predicted_ms",)),
        Part("2a", "residual_rmsnorm is right", 5, _kernel_correct, ("residual_rmsnorm",),
             group="kernel", collect=_collect_kernel),
        Part("2b", "the kernel stays in bounds", 2, _kernel_in_bounds, ("residual_rmsnorm",),
             group="kernel", collect=_collect_kernel),
        Part("3a", "faster than eager PyTorch", 3, _speed, ("residual_rmsnorm",), gpu=True,
             group="speed", collect=_collect_timings, after="kernel"),
        Part("3b", "within 20% of the predicted time", 2, _near_prediction,
             ("residual_rmsnorm",), gpu=True, group="speed", collect=_collect_timings,
             after="kernel"),
    ),
)

check_napkin_math = check_function(ASSIGNMENT, ("1a", "1b", "1c", "1d"),
    "Part 1: ``eager_bytes``, ``fused_bytes``, ``predicted_speedup``, ``predicted_ms``.")

check_kernel = check_function(ASSIGNMENT, ("2a", "2b"),
    "Part 2: ``residual_rmsnorm`` on awkward shapes, dtypes and edge rows, bounds-checked.")

check_speed = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: timed against the eager version (GPU mode; pending on a CPU).")
