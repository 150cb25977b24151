"""Assignment 09, FP8 by design: its graded parts and ``check_*`` calls.

Lesson 09 quantises with scales ``amax / 448`` and lets the learner watch what each
granularity costs in accuracy. Here the learner designs instead: the shape and the bytes of
a scale tensor for any granularity, the cheapest granularity that keeps a tensor the grader
draws within an error budget, and a quantisation kernel the course does not ship, with the
**power-of-two scales** of the OCP microscaling formats and DeepSeek-V3.1 (an 8-bit
exponent, no mantissa: multiplying by one is exact, and one byte stores it): for each
1 x 128 group, ``scale = 2^(floor(log2(amax)) - 8)``, so the group's largest value lands in
[256, 512) and what passes e4m3's 448 must saturate; a group of zeros takes scale 1.

Every expected value is computed here from the grader's own draws (the inputs come from
the grader's seed, unknown to the notebook); nothing is stored to be matched.

Parts (27 points; 18 graded in CPU mode, the last 9 on a GPU):

=====  ============================================================  ======
1a     ``scale_shape_for(shape, granularity)`` on drawn shapes             3
1b     ``scale_overhead(shape, granularity)``: scale bytes / FP8 bytes     2
1c     ``pick_granularity(x, budget)``: the fewest scale bytes within      5
       the budget, on tensors with outliers the grader draws
2a     ``quantize_1x128`` is the spec: power-of-two scales per 1 x 128     6
       group (1 for zeros), values rounded to nearest and saturated
2b     its kernel never reads or writes outside its tensors               2
3a     at least 80% of a copy's bandwidth, 8192 x 8192 bf16 (GPU)         3
3b     into the course's block-scaled matmul: within the error of the     3
       course's own quantisation, and no slower (GPU)
3c     ``pick_promotion``: the least promotion of a long FP8 sum that     3
       stays within an error budget, on matmuls the grader draws and
       measures (GPU; :mod:`.fp8_promotion`)
=====  ============================================================  ======
"""

from __future__ import annotations

import torch

from ...feedback import target
from .. import harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function
from .fp8_granularity import (_collect_overhead, _collect_pick, _collect_shapes,
                              _judge_overhead, _judge_pick, _judge_shapes)
from .fp8_promotion import _collect_promotion, _judge_promotion
# The assignment's notebook imports these from here, beside its checks.
from .fp8_granularity import GRANULARITIES, drawn_tensor  # noqa: F401
from .fp8_promotion import drawn_operands  # noqa: F401

E4M3_MAX = 448.0
E4M3_EMAX = 8                    # 448 = 1.75 x 2^8
GROUP = 128
QUANTIZE_OF_COPY = 0.8           # part 3a
ERROR_SLACK, TIME_SLACK = 1.25, 1.15   # part 3b, against the course's quantisation


# ------------------------------------------------------------------------------------
# The spec of part 2, in PyTorch: the judge's reference.
# ------------------------------------------------------------------------------------

def pow2_scales(x: torch.Tensor) -> torch.Tensor:
    """``(M, ceil(K / 128))`` fp32: ``2^(floor(log2(amax)) - 8)`` per 1 x 128 group, 1 for a
    group of zeros."""
    M, K = x.shape
    groups = -(-K // GROUP)
    pad = torch.zeros(M, groups * GROUP, dtype=torch.float32, device=x.device)
    pad[:, :K] = x.float()
    amax = pad.view(M, groups, GROUP).abs().amax(-1)
    exponent = torch.frexp(amax)[1] - 1              # floor(log2(amax)), exact
    scale = torch.ldexp(torch.ones_like(amax), exponent - E4M3_EMAX)
    return torch.where(amax > 0, scale, torch.ones_like(amax))


def quantize_1x128_reference(x: torch.Tensor):
    """``(q, scale)``: ``q = clamp(x / scale, -448, 448)`` rounded to nearest e4m3."""
    scale = pow2_scales(x)
    full = scale.repeat_interleave(GROUP, 1)[:, :x.shape[1]]
    q = (x.float() / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


# ------------------------------------------------------------------------------------
# Part 2: the quantisation kernel.
# ------------------------------------------------------------------------------------

# No rows; one value; one whole group; partial groups; just past a group.
SHAPES = ((0, 300), (1, 1), (3, 128), (5, 300), (16, 256), (7, 1000), (33, 129))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROWS = ("random", "zero groups", "saturating", "powers of two")
COMPILED_SHAPES = ((8192, 8192, torch.bfloat16), (4097, 1000, torch.float32))
DTYPE_OF = {harness.dtype_name(d): d for d in DTYPES}


class Quantize1x128(harness.KernelTask):
    function = "quantize_1x128"
    call = "quantize_1x128(x)"
    outputs = ("q", "scale")
    inputs_named = ("x",)
    mask_hint = ("A row's last group is partial when K is not a multiple of 128: mask the "
                 "lanes past K on every load and store, and the rows past M")

    @staticmethod
    def case(shape, dtype, rows="random", compiled=False):
        label = f"shape {shape[0]}x{shape[1]}, {harness.dtype_name(dtype)}" + (
            "" if rows == "random" else f", {rows}")
        return harness.Case(label, {"shape": list(shape), "dtype": harness.dtype_name(dtype),
                                    "rows": rows}, 0, compiled)

    def first(self):
        return self.case((5, 300), torch.float32)

    def cases(self, blocks):
        out = [self.case(s, d) for d in DTYPES for s in SHAPES]
        return out + [self.case((6, 400), d, r) for d in DTYPES for r in ROWS[1:]]

    def compiled_cases(self, blocks):
        return [self.case((m, k), d, compiled=True) for m, k, d in COMPILED_SHAPES]

    def inputs(self, case, device):
        M, K = case.params["shape"]
        dtype = DTYPE_OF[case.params["dtype"]]
        g = harness.generator(case.seed)
        # Rows of very different sizes, as activations have: every group its own scale.
        x = torch.randn(M, K, generator=g) * 10 ** (3 * torch.rand(M, 1, generator=g) - 1.5)
        rows = case.params["rows"]
        if rows == "zero groups":
            x[::2, :GROUP] = 0
            x[1::3] = 0
        elif rows == "saturating":
            # A group's largest value 1.9 x a power of two: 486 after the scale, past 448.
            x[:, 7] = 1.9 * 2.0 ** torch.randint(-4, 6, (M,), generator=g).float()
            x[:, GROUP + 3] = -1.99 * 2.0 ** torch.randint(-4, 6, (M,), generator=g).float()
        elif rows == "powers of two":
            x[:, 0] = 2.0 ** torch.randint(-4, 6, (M,), generator=g).float()
            x = x.clamp(-0.99 * x[:, :1], 0.99 * x[:, :1])
        return (x.to(dtype).to(device),)

    def reference(self, case, inputs):
        return quantize_1x128_reference(inputs[0])

    def compare(self, case, got, want, inputs, blocks):
        (x,) = inputs
        q, s = got
        q_ref, s_ref = want
        if torch.isnan(s).any() or (s == 0).any():
            return ("a scale is NaN or 0: a group of zeros has amax 0, and log2(0) is -inf; "
                    "give such a group the scale 1")
        if not torch.equal(s, s_ref):
            bad = (s != s_ref).nonzero()[0].tolist()
            mant = torch.frexp(s[s != s_ref])[0]
            if (mant != 0.5).any():
                hint = ("the scales must be powers of two: 2^(floor(log2(amax)) - 8), not "
                        "amax / 448")
            else:
                ratio = (s[s != s_ref] / s_ref[s != s_ref]).unique()
                hint = ("one power of two too large or too small: floor(log2(amax)) - 8 puts "
                        "the group's largest value in [256, 512)" if all(
                            r.item() in (0.5, 2.0) for r in ratio) else
                        "each scale covers one row's 128 consecutive values (1 x 128): the "
                        "amax of that group, not of a column block or of the whole row")
            return f"scale[{bad[0]}, {bad[1]}] is wrong: {hint}"
        qf, rf = q.float(), q_ref.float()
        if torch.isnan(qf).any():
            return ("q holds NaN: e4m3 has no infinity, and a value past 448 cast as it is "
                    "becomes NaN (or garbage in the interpreter): clamp x / scale to "
                    "[-448, 448] before the cast")
        if not torch.equal(qf, rf):
            i = (qf != rf).nonzero()[0].tolist()
            if qf.abs().max() > E4M3_MAX or (rf.abs() == E4M3_MAX)[qf != rf].any():
                hint = "clamp x / scale to [-448, 448] before the cast (saturation)"
            else:
                hint = ("not rounded to the nearest e4m3 value: Triton's interpreter converts "
                        "fp32 to fp8 wrongly, so round first with the handed-out "
                        "round_to_format(v, 3, 2.0 ** -6) (a GPU's conversion rounds itself)")
            return (f"q[{i[0]}, {i[1]}] is {qf[i[0], i[1]].item():g}, not the nearest e4m3 "
                    f"value of x / scale: {hint}")
        return None

    def summary(self, cases):
        return (f"{', '.join(f'{a}x{b}' for a, b in SHAPES)} in "
                f"{', '.join(harness.dtype_name(d) for d in DTYPES)}, with groups of zeros, "
                "values past 448 after the scale and exact powers of two")


TASK = Quantize1x128()


def _collect_kernel(ns, seed):
    return harness.collect(TASK, ns, seed)


def _scales_right(raw):
    v = harness.verdict_of(TASK, raw)
    return v.correctness("2a quantize_1x128 is the spec",
                         f"scales and values match the spec on {TASK.summary(v.watched)}")


def _in_bounds(raw):
    return harness.verdict_of(TASK, raw).in_bounds("2b the kernel stays in bounds")


# ------------------------------------------------------------------------------------
# Part 3 (GPU): the kernel's bandwidth, and the kernel feeding the course's matmul.
# ------------------------------------------------------------------------------------

def _collect_gpu(ns, seed) -> dict:
    from ... import bench
    from ...experiments import fp8 as experiment
    from ...kernels import fp8

    fn = answer(ns, "quantize_1x128")
    M = K = 8192
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    xo, w = experiment.inputs(4096, 4096, 8192, 1e4, seed=seed % 1000)
    with gpu_lock():
        copy = bench.time_ms(lambda: torch.empty_like(x).copy_(x))
        yours = bench.time_ms(lambda: fn(x))
        b, b_s = fp8.quantize(w, "128x128")
        mine = fn(xo)
        course = fp8.quantize(xo, "1x128")
        want = xo.double() @ w.double().T

        def error(a, a_s):
            c = fp8.scaled_matmul(a, b, a_s, b_s, "block",
                                  out_dtype=torch.float32)
            return ((c.double() - want).norm() / want.norm()).item()

        def path(quantize):
            a, a_s = quantize(xo)
            return fp8.scaled_matmul(a, b, a_s, b_s, "block")

        path_ms = bench.time_ms(lambda: path(fn))
        course_ms = bench.time_ms(lambda: path(lambda t: fp8.quantize(t, "1x128")))
    moved = x.numel() * 2 + x.numel() + 4 * M * (-(-K // GROUP))
    return {"copy_gbps": 2 * x.numel() * 2 / copy / 1e6, "yours_gbps": moved / yours / 1e6,
            "error": error(*mine), "course_error": error(*course), "path_ms": path_ms,
            "course_ms": course_ms, "gpu": torch.cuda.get_device_name()}


def _bandwidth(t):
    share = float(t["yours_gbps"]) / float(t["copy_gbps"])
    return target("3a at copy speed", share >= QUANTIZE_OF_COPY,
                  f"on {t['gpu']} at 8192 x 8192 bf16: {float(t['yours_gbps']):,.0f} GB/s of "
                  f"the bytes it must move, {share:.0%} of a copy's "
                  f"{float(t['copy_gbps']):,.0f} GB/s (the goal: {QUANTIZE_OF_COPY:.0%})",
                  "read each value once, keep the group in registers for its amax and its "
                  "cast, and give each program a few rows of groups")


def _end_to_end(t):
    err, ref = float(t["error"]), float(t["course_error"])
    ms, base = float(t["path_ms"]), float(t["course_ms"])
    ok = err <= ERROR_SLACK * ref and ms <= TIME_SLACK * base
    return target("3b into the course's matmul", ok,
                  f"on {t['gpu']}, activations with outlier channels into the course's block-"
                  f"scaled matmul: relative error {err:.3g} (the course's quantisation: "
                  f"{ref:.3g}, at most {ERROR_SLACK:g}x), quantise + matmul {ms:.3f} ms "
                  f"(the course's {base:.3f} ms, at most {TIME_SLACK:g}x)",
                  "the error: check the scales on real activations; the time: the "
                  "quantisation's share of the path")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="09_fp8",
    title="FP8 by design: scales, granularity and the quantisation kernel",
    parts=(
        Part("1a", "scale_shape_for", 3, _judge_shapes, ("scale_shape_for",),
             collect=_collect_shapes),
        Part("1b", "scale_overhead", 2, _judge_overhead, ("scale_overhead",),
             collect=_collect_overhead),
        Part("1c", "pick_granularity", 5, _judge_pick, ("pick_granularity",),
             collect=_collect_pick),
        Part("2a", "quantize_1x128 is the spec", 6, _scales_right, ("quantize_1x128",),
             group="kernel", collect=_collect_kernel),
        Part("2b", "the kernel stays in bounds", 2, _in_bounds, ("quantize_1x128",),
             group="kernel", collect=_collect_kernel),
        Part("3a", "at copy speed", 3, _bandwidth, ("quantize_1x128",), gpu=True,
             group="gpu", collect=_collect_gpu, after="kernel"),
        Part("3b", "into the course's matmul", 3, _end_to_end, ("quantize_1x128",), gpu=True,
             group="gpu", collect=_collect_gpu, after="kernel"),
        Part("3c", "pick_promotion", 3, _judge_promotion, ("pick_promotion",), gpu=True,
             collect=_collect_promotion),
    ),
)

check_scales = check_function(ASSIGNMENT, ("1a", "1b", "1c"),
    "Part 1: ``scale_shape_for``, ``scale_overhead`` and ``pick_granularity``.")

check_kernel = check_function(ASSIGNMENT, ("2a", "2b"),
    "Part 2: ``quantize_1x128`` on awkward shapes, three dtypes and edge groups, "
    "bounds-checked.")

check_gpu = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: its bandwidth and the course's matmul on its output (GPU mode; pending on a CPU).")

check_promotion = check_function(ASSIGNMENT, ("3c",),
    "Part 3c: ``pick_promotion`` on matmuls the grader draws and measures (GPU mode; pending "
    "on a CPU).")
