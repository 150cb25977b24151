"""Assignment 03, the roofline challenge on vector add: its graded parts and ``check_*`` calls.

Every expected value is computed from the course's own napkin math
(:mod:`helpers.kernels.vector_add`) and GPU table (:mod:`helpers.hardware`), never typed in.
The GPU of the napkin math is the table's H100 SXM. Elementwise arithmetic runs on the CUDA
cores, not on the tensor cores, so its compute roof is the table's fp32 peak (67 TFLOP/s):
the tensor-core peaks are for matrix products (``tl.dot``) only.

Parts (32 points; 26 graded in CPU mode, 6 on a GPU):

=====  ==========================================================  ======
1a-1c  napkin math for 10^9 fp16 elements: FLOPs, bytes, intensity   4
1d     the smallest add that reaches a share of a GPU's bandwidth by    3
       lesson 02's model, on GPUs the grader draws (:mod:`.vector_add_sizes`)
2a-2e  variants: fp32, in place, three inputs, an FMA chain, which   5
       could cross the ridge point
3a-3b  ``vector_add`` launches the notebook's kernel, exact on        5
       awkward sizes (fp16, fp32); its kernel stays in bounds
4      >= 85 % of the table's peak bandwidth at 2^28 elements (GPU)  3
5a-5b  a fused momentum step (w, m fp32, g fp16; two outputs): its  2
       bytes for 10^9 elements, its intensity
5c-5d  ``momentum_step`` launches the notebook's fused kernel, right  5
       on awkward sizes and special values; its kernel in bounds
5e     its GPU time at 2^22 elements by lesson 02's model (bytes /   2
       the table's bandwidth + the recorded launch floor)
5f     >= 85 % of the table's peak bandwidth at 2^28 elements (GPU)  3
=====  ==========================================================  ======

85 % is what the course's own kernel reaches in the committed records (the notebook prints
the figures from them).
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ... import hardware, records
from ...experiments.vector_add import time_pair
from ...feedback import Feedback, graded_number, needs_gpu, target
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function, finite
from . import vector_add_sizes as sizes
from . import vector_add_step as step

GPU = hardware.GPUS["H100-SXM"]
COMPUTE_ROOF = "fp32"          # elementwise arithmetic: CUDA cores
N = 10**9
FP16, FP32 = torch.float16, torch.float32
PASS_FRACTION = 0.85           # parts 4, 5f: achieved / table peak bandwidth at BIG_N
BIG_N = 2**28
TOLERANCE = 0.02               # relative, for every napkin-math number


RIDGE = GPU.ridge_point(COMPUTE_ROOF)
VARIANTS = ("fp16", "fp32", "in-place", "three inputs", "fma chain")
# The answers: formulas in keys_vector_add (instructor), sealed in a student release.
KEY = answers.load_key("03_vector_add_intensity", "helpers.grading.assignments.keys_vector_add")
# A graded number: (part, title, points, the notebook's name, unit, hint) -> Part.
_number = partial(harness.number_part, KEY)


# ------------------------------------------------------------------------------------
# Part 1: napkin math for C = A + B, 10^9 fp16 elements, on the table's H100 SXM.
# ------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------
# Part 2: variants that change the intensity.
# ------------------------------------------------------------------------------------


def _normalise(name) -> str:
    return str(name).strip().lower().replace("_", " ").replace("inplace", "in-place") \
        .replace("in place", "in-place")


def _cross(ns):
    part = "2e which could cross the ridge"
    got = answer(ns, "could_cross")
    if got is None or got is Ellipsis:
        return Feedback(part, False, f"no answer yet: a set of names from {VARIANTS}",
                        status="not implemented")
    if isinstance(got, str) or not hasattr(got, "__iter__"):
        return Feedback(part, False, f"expected a set of variant names such as "
                        f"{{'fp32', 'fma chain'}}, got {type(got).__name__} {got!r:.60}")
    chosen = {_normalise(g) for g in got}
    unknown = chosen - set(VARIANTS)
    if unknown:
        return Feedback(part, False, f"{sorted(unknown)} are not variants; use names from "
                        f"{VARIANTS}")
    can = {v for v in VARIANTS if KEY[f"2e.{v}"].matches("can")}
    if chosen == can:
        return Feedback(part, True, f"only {', '.join(sorted(can))} can: every other variant "
                        "has a fixed, tiny intensity whatever N is")
    # Naming which choices are wrong would give the answer away after one try.
    return Feedback(part, False, "not right: for each variant, compare how its FLOPs and "
                    "its bytes grow with N. A ratio that stays fixed stays where it is, whatever "
                    f"N is; the ridge is at {RIDGE:.0f} FLOP/byte")


# ------------------------------------------------------------------------------------
# Part 3: the kernel and its launcher, on awkward sizes and edge inputs, fp16 and fp32.
# ------------------------------------------------------------------------------------

DTYPES = (FP16, FP32)
BASE_SIZES = (1, 3, 127, 128, 129, 1023, 1024, 1025, 4097, 100_003)   # 100003 is prime
TOLERANCES = {FP16: (1e-3, 1e-3), FP32: (1e-6, 1e-6)}
DTYPE_OF = {harness.dtype_name(d): d for d in DTYPES}


class VectorAdd(harness.KernelTask):
    function = "vector_add"
    call = "vector_add(a, b)"
    outputs = ("C",)
    inputs_named = ("A", "B")
    mask_hint = ("Compute mask = offsets < n_elements and pass mask=mask to every tl.load and "
                 "tl.store.")
    spec = "a + b"
    dtypes = DTYPES
    edges = ("huge", "special")

    def first(self):
        return self._case(3, FP16)

    @staticmethod
    def _case(n, dtype, values="randn"):
        name = harness.dtype_name(dtype)
        label = f"n={n}, {name}" + ("" if values == "randn" else f", {values}")
        return harness.Case(label, {"n": n, "dtype": name, "values": values})

    def cases(self, blocks):
        block = _block_of(blocks)
        sizes = sorted(set(BASE_SIZES) | ({block - 1, block, block + 1, 2 * block + 1}
                                          if block else set()) - {0})
        out = [self._case(n, d) for d in self.dtypes for n in sizes]
        # Edge inputs: values at the top of each dtype's range (sums overflow to inf
        # there, in the reference too) and inf, -inf, NaN and signed zeros.
        out += [self._case(1000, d, v) for d in self.dtypes for v in self.edges]
        return out

    def compiled_cases(self, blocks):
        block = _block_of(blocks) or 1024
        return [harness.Case(f"n={n}, {harness.dtype_name(d)}",
                             {"n": n, "dtype": harness.dtype_name(d), "values": "randn"},
                             compiled=True)
                for d in self.dtypes for n in sorted({block + 1, 1_000_003, 2**22})]

    def inputs(self, case, device):
        n, dtype, values = case.params["n"], DTYPE_OF[case.params["dtype"]], case.params["values"]
        g = harness.generator(case.seed)
        if values == "huge":
            top = torch.finfo(dtype).max
            a = (torch.rand(n, generator=g) * 0.5 + 0.5) * top
            sign = torch.sign(torch.randn(n, generator=g))
            b = (torch.rand(n, generator=g) * 0.5 + 0.5) * top * sign
        elif values == "special":
            pool = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0])
            a = pool[torch.randint(0, len(pool), (n,), generator=g)]
            b = pool[torch.randint(0, len(pool), (n,), generator=g)]
        else:
            a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        return a.to(dtype).to(device), b.to(dtype).to(device)

    def reference(self, case, inputs):
        a, b = inputs
        return ((a.float() + b.float()).to(a.dtype),)

    def compare(self, case, got, want, inputs, blocks):
        (c,), (w,) = got, want
        n = case.params["n"]
        atol, rtol = TOLERANCES[w.dtype]
        bad = harness.close_hint(c, w, atol, rtol)
        if bad is None:
            return None
        count, (i,) = bad
        value = c[i].float().item()
        first = (f"{count} of {n} elements differ from {self.spec}; first at index {i}: expected "
                 f"{harness.finite_or_nan(w[i].float().item())}, got "
                 f"{harness.finite_or_nan(value)}")
        block = _block_of(blocks)
        wrong = (~torch.isclose(c.float(), w.float(), atol=atol, rtol=rtol, equal_nan=True)) \
            .nonzero().flatten()
        tail = block and n % block and int(wrong.min()) >= n // block * block
        if math.isnan(value) and not math.isnan(w[i].float().item()):
            hint = ("NaN means an element nobody wrote (torch.empty holds leftovers) or one "
                    "computed from a masked-off load")
        else:
            hint = ""
        if tail:
            hint = (f"{hint + '. ' if hint else ''}Only the last, partial block (indices "
                    f"{n // block * block} to {n - 1}) is wrong: the grid needs "
                    f"triton.cdiv(n, BLOCK_SIZE) programs, one more than n // BLOCK_SIZE, so "
                    "that a program covers it")
        elif case.params["values"] != "randn":
            hint = ("right on ordinary values, wrong on extreme ones: compute with the loaded "
                    "values as they are (no rescaling, no clamping), so inf and NaN come out as "
                    f"{self.spec} does")
        elif not hint:
            hint = self.hint(c, w, inputs)
        if not hint:
            hint = ("check the offsets (pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)) and that "
                    "the tensor you return is the one the kernel wrote")
        return f"{first}. {hint}"

    def hint(self, got, want, inputs) -> str:
        """A hint for wrong ordinary values (this op's usual slip), or ""."""
        return ""

    described = "in fp16 and fp32, with extreme values (overflow, inf, NaN)"

    def summary(self, cases):
        return f"n = {', '.join(map(str, sorted({c.params['n'] for c in cases})))} {self.described}"


TASK = VectorAdd()


def _block_of(constexprs: dict) -> int | None:
    for name, v in (constexprs or {}).items():
        if "BLOCK" in name.upper() and isinstance(v, int):
            return v
    powers = [v for v in (constexprs or {}).values()
              if isinstance(v, int) and v > 1 and v & (v - 1) == 0]
    return max(powers) if powers else None


_collect_kernel = partial(harness.collect, TASK)      # (namespace, seed) -> raw results


def _correct(task: VectorAdd, part: str):
    """The judge of a kernel part: right on every trial of ``task``."""
    def judge(raw):
        v = harness.verdict_of(task, raw)
        block = _block_of(v.blocks)
        return v.correctness(part, f"matches {task.spec} on "
                             f"{task.summary([t.case for t in v.watched])}"
                             + (f" (BLOCK_SIZE {block})" if block else ""))
    return judge


def _in_bounds(task: VectorAdd, part: str):   # every load and store of the kernel in bounds
    return lambda raw: harness.verdict_of(task, raw).in_bounds(part)


_kernel_correct = _correct(TASK, "3a vector_add is exact")
_kernel_in_bounds = _in_bounds(TASK, "3b the kernel stays in bounds")


# ------------------------------------------------------------------------------------
# Part 4 (GPU): achieved bandwidth at 2^28 elements, side by side with torch.add.
# ------------------------------------------------------------------------------------


def _collect_timed(name: str, runs: dict):
    """The collector of a bandwidth part: in the learner's process, time the notebook's
    ``name`` beside torch (GPU). ``runs``: label -> (fn -> a row of the vector_add
    experiment, which checks the result before it times anything)."""
    def collect(ns, seed):
        fn = answer(ns, name)
        spec = hardware.current_gpu()
        out = {"gpu": torch.cuda.get_device_name(),
               "peak_gbps": spec.hbm_bandwidth_gbs if spec else None, "rows": []}
        with gpu_lock():   # side by side, and alone on the GPU
            for label, run in runs.items():
                try:
                    row = run(fn)
                except AssertionError:
                    out["wrong"] = label
                    return out
                out["rows"].append({"dtype": label, "ours": row["triton_gbps"],
                                    "ref": row["torch_gbps"]})
        return out
    return collect


_collect_bandwidth = _collect_timed("vector_add", {
    dtype: (lambda fn, dtype=dtype: time_pair(BIG_N, dtype, fn=fn)) for dtype in ("fp16", "fp32")})


def _bandwidth(raw, part=f"4 bandwidth at 2^{BIG_N.bit_length() - 1} elements",
               what="vector_add", ref_name="torch.add"):
    if raw.get("wrong"):
        return Feedback(part, False, f"{what} is wrong at n=2^28, {raw['wrong']}")
    peak = raw.get("peak_gbps")
    if not finite(peak):
        fb = needs_gpu(part)
        return Feedback(part, False, f"{raw.get('gpu')} is not in the course's GPU table, so it "
                        "has no peak to compare with; " + fb.message, status=fb.status)
    lines, best = [], 0.0
    for row in raw.get("rows", []):
        ours, ref = float(row["ours"]), float(row["ref"])
        best = max(best, ours / peak)
        lines.append(f"{row['dtype']} {ours:,.0f} GB/s = {ours / peak:.0%} of peak "
                     f"({ref_name} {ref:,.0f} GB/s = {ref / peak:.0%})")
    text = f"on {raw.get('gpu')} (table peak {peak:,.0f} GB/s): " + "; ".join(lines)
    return target(part, best >= PASS_FRACTION, text,
                  f"The target is {PASS_FRACTION:.0%}: check that each program handles a block "
                  f"of at least 512 elements and that nothing but the kernel runs inside "
                  f"{what} (no .cpu(), no copies, no synchronize)")


# ------------------------------------------------------------------------------------
# Part 5: a fused momentum step (:mod:`.vector_add_step`), its bytes, time and bandwidth.
# ------------------------------------------------------------------------------------

LR, BETA = step.LR, step.BETA
_collect_step = partial(harness.collect, step.STEP)
_step_correct = _correct(step.STEP, "5c momentum_step is right")
_step_in_bounds = _in_bounds(step.STEP, "5d the fused kernel stays in bounds")

PRED_N = 2**22                 # 5e: the size of the prediction
PRED_GPU = "H100-SXM"          # the table's GPU


def _floor_us() -> float:
    """Lesson 02's launch floor on the reference GPU (its record), for the hint."""
    return records.load("roofline", PRED_GPU).results["launch_floor_us"]


def _prediction(ns):
    part = f"5e predicted time at 2^{PRED_N.bit_length() - 1} elements"
    fb = graded_number(part, answer(ns, "step_predicted_us"), KEY["5e"], unit="µs",
                       hint=f"your bytes at 2^{PRED_N.bit_length() - 1} elements over "
                            f"{GPU.hbm_bandwidth_gbs:,.0f} GB/s, plus the launch floor, "
                            f"{_floor_us():.3g} µs")
    if fb.passed:
        return Feedback(part, True, fb.message + f": lesson 02's model, within "
                        f"{KEY['5e'].rel:.0%}")
    return fb


_collect_step_bandwidth = _collect_timed("momentum_step", {
    "w, m fp32, g fp16": lambda fn: step.time_step(BIG_N, fn)})


_step_bandwidth = partial(_bandwidth, part=f"5f fused step at 2^{BIG_N.bit_length() - 1} "
                          "elements", what="momentum_step", ref_name="eager PyTorch")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="03_vector_add_intensity",
    title="The roofline challenge on vector add",
    parts=(
        _number("1a", "FLOPs", 1, "add_flops", "FLOP", "one addition per element of C."),
        _number("1b", "bytes moved", 2, "add_bytes", "bytes",
                "read A, read B, write C, each N elements of 2 bytes."),
        _number("1c", "intensity", 1, "add_intensity", "FLOP/byte",
                "FLOPs divided by bytes moved."),
        Part("1d", "the smallest add that fills the bus", 3,
             sizes.judge("1d the smallest add that fills the bus"), (sizes.NAME,),
             collect=sizes.collect),
        _number("2a", "fp32 intensity", 1, "fp32_intensity", "FLOP/byte"),
        _number("2b", "in-place intensity", 1, "inplace_intensity", "FLOP/byte"),
        _number("2c", "three-input intensity", 1, "three_input_intensity", "FLOP/byte"),
        _number("2d", "FMAs to cross the ridge", 1, "fma_chain_k", "FMAs per element",
                "an FMA is two FLOPs and moves no byte: the chain's intensity grows with k until "
                f"it reaches the CUDA-core ridge, {RIDGE:.0f} FLOP/byte."),
        Part("2e", "which could cross the ridge", 1, _cross, ("could_cross",)),
        Part("3a", "vector_add is exact", 3, _kernel_correct, ("vector_add",), group="kernel",
             collect=_collect_kernel),
        Part("3b", "the kernel stays in bounds", 2, _kernel_in_bounds, ("vector_add",),
             group="kernel", collect=_collect_kernel),
        Part("4", f"bandwidth at 2^{BIG_N.bit_length() - 1} elements", 3, _bandwidth,
             ("vector_add",), gpu=True, collect=_collect_bandwidth, after="kernel"),
        _number("5a", "bytes of the fused step", 1, "step_bytes", "bytes",
                "each tensor crosses the bus once each way it must, at its own element size."),
        _number("5b", "intensity of the fused step", 1, "step_intensity", "FLOP/byte",
                "FLOPs per element (a multiply-add is two) over bytes per element."),
        Part("5c", "momentum_step is right", 3, _step_correct, ("momentum_step",),
             group="step", collect=_collect_step),
        Part("5d", "the fused kernel stays in bounds", 2, _step_in_bounds, ("momentum_step",),
             group="step", collect=_collect_step),
        Part("5e", f"predicted time at 2^{PRED_N.bit_length() - 1} elements", 2, _prediction,
             ("step_predicted_us",)),
        Part("5f", f"fused step at 2^{BIG_N.bit_length() - 1} elements", 3, _step_bandwidth,
             ("momentum_step",), gpu=True, collect=_collect_step_bandwidth, after="step"),
    ),
)

check_napkin_math = check_function(ASSIGNMENT, ("1a", "1b", "1c", "1d"),
    "Part 1: ``add_flops``, ``add_bytes``, ``add_intensity``, ``smallest_add`` on GPUs of "
    "the grader's drawing.")

check_variants = check_function(ASSIGNMENT, ("2a", "2b", "2c", "2d", "2e"),
    "Part 2: ``fp32_intensity``, ``inplace_intensity``, ``three_input_intensity``, "
    "``fma_chain_k``, ``could_cross``.")

check_kernel = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: ``vector_add`` on awkward sizes and edge inputs, its kernel bounds-checked.")

check_bandwidth = check_function(ASSIGNMENT, ("4",),
    "Part 4: achieved bandwidth at 2^28 elements (GPU mode; reported as pending on a CPU). "
    "Runs part 3's trials first: the speed of a wrong kernel is not graded.")

check_fused_napkin_math = check_function(ASSIGNMENT, ("5a", "5b"),
    "Part 5: ``step_bytes``, ``step_intensity`` of the fused momentum step.")

check_fused_kernel = check_function(ASSIGNMENT, ("5c", "5d"),
    "Part 5: ``momentum_step`` on awkward sizes and special values, its kernel bounds-checked.")

check_prediction = check_function(ASSIGNMENT, ("5e",),
    "Part 5: ``step_predicted_us``, against lesson 02's model of a memory-bound kernel.")

check_fused_bandwidth = check_function(ASSIGNMENT, ("5f",),
    "Part 5: the fused step's bandwidth at 2^28 elements (GPU mode; pending on a CPU).")
