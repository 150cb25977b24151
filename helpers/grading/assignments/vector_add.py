"""Assignment 03, the roofline challenge on vector add: its graded parts and ``check_*`` calls.

Every expected value is computed from the course's own napkin math
(:mod:`helpers.kernels.vector_add`) and GPU table (:mod:`helpers.hardware`), never typed in.
The GPU of the napkin math is the table's H100 SXM. Elementwise arithmetic runs on the CUDA
cores, not on the tensor cores, so its compute roof is the table's fp32 peak (67 TFLOP/s):
the tensor-core peaks are for matrix products (``tl.dot``) only.

Parts (20 points; 17 graded in CPU mode, the last 3 on a GPU):

=====  ==========================================================  ======
1a-1e  napkin math for 10^9 fp16 elements: FLOPs, bytes, intensity,  7
       bound, minimum time
2a-2e  variants: fp32, in place, three inputs, an FMA chain, which   5
       could cross the ridge point
3a     ``vector_add`` launches the notebook's Triton kernel and is   3
       exact on awkward sizes (fp16 and fp32)
3b     its kernel never reads or writes outside its tensors          2
4      >= 80 % of the table's peak bandwidth at 2^28 elements (GPU)  3
=====  ==========================================================  ======
"""

from __future__ import annotations

import math

import torch

from ... import hardware
from ...feedback import Feedback, graded_choice, graded_number, needs_gpu, target
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function, finite

GPU = hardware.GPUS["H100-SXM"]
COMPUTE_ROOF = "fp32"          # elementwise arithmetic: CUDA cores
N = 10**9
FP16, FP32 = torch.float16, torch.float32
PASS_FRACTION = 0.80           # part 4: achieved / table peak bandwidth at BIG_N
BIG_N = 2**28
TOLERANCE = 0.02               # relative, for every napkin-math number


RIDGE = GPU.ridge_point(COMPUTE_ROOF)
VARIANTS = ("fp16", "fp32", "in-place", "three inputs", "fma chain")
# The answers: formulas in keys_vector_add (instructor), sealed in a student release.
KEY = answers.load_key("03_vector_add_intensity", "helpers.grading.assignments.keys_vector_add")


# ------------------------------------------------------------------------------------
# Part 1: napkin math for C = A + B, 10^9 fp16 elements, on the table's H100 SXM.
# ------------------------------------------------------------------------------------


def _flops(ns):
    return graded_number("1a FLOPs", answer(ns, "add_flops"), KEY["1a"], unit="FLOP",
                         hint="one addition per element of C.")


def _bytes(ns):
    return graded_number("1b bytes moved", answer(ns, "add_bytes"), KEY["1b"], unit="bytes",
                         hint="read A, read B, write C, each N elements of 2 bytes.")


def _intensity(ns):
    return graded_number("1c intensity", answer(ns, "add_intensity"), KEY["1c"],
                         unit="FLOP/byte", hint="FLOPs divided by bytes moved.")


def _bound(ns):
    got = answer(ns, "add_bound")
    return graded_choice("1d bound", got, KEY["1d"], ("memory", "compute"),
                        why=f"A kernel left of the ridge point waits for memory; the ridge is "
                            f"{RIDGE:.0f} FLOP/byte ({COMPUTE_ROOF} peak "
                            f"{GPU.peak(COMPUTE_ROOF):g} TFLOP/s over "
                            f"{GPU.hbm_bandwidth_gbs:,.0f} GB/s): compare the intensity of 1c "
                            "with it.")


def _min_time(ns):
    return graded_number("1e minimum time", answer(ns, "add_min_time_ms"), KEY["1e"],
                         unit="ms", hint=f"bytes / bandwidth ({GPU.hbm_bandwidth_gbs:,.0f} GB/s = "
                                        f"{GPU.hbm_bandwidth_gbs:g} x 10^9 bytes/s), in ms.")


# ------------------------------------------------------------------------------------
# Part 2: variants that change the intensity.
# ------------------------------------------------------------------------------------


def _fp32(ns):
    return graded_number("2a fp32 intensity", answer(ns, "fp32_intensity"), KEY["2a"],
                         unit="FLOP/byte")


def _inplace(ns):
    return graded_number("2b in-place intensity", answer(ns, "inplace_intensity"),
                         KEY["2b"], unit="FLOP/byte")


def _three(ns):
    return graded_number("2c three-input intensity", answer(ns, "three_input_intensity"),
                         KEY["2c"], unit="FLOP/byte")


def _fma(ns):
    return graded_number("2d FMAs to cross the ridge", answer(ns, "fma_chain_k"), KEY["2d"],
                         unit="FMAs per element",
                         hint="an FMA is two FLOPs and moves no byte: the chain's intensity "
                              f"grows with k until it reaches the CUDA-core ridge, {RIDGE:.0f} "
                              "FLOP/byte.")


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
    tensors = "A, B and C"
    inputs_named = ("A", "B")
    mask_hint = ("Compute mask = offsets < n_elements and pass mask=mask to every tl.load and "
                 "tl.store.")

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
        out = [self._case(n, d) for d in DTYPES for n in sizes]
        # Edge inputs: values at the top of each dtype's range (sums overflow to inf
        # there, in the reference too) and inf, -inf, NaN and signed zeros.
        out += [self._case(1000, d, v) for d in DTYPES for v in ("huge", "special")]
        return out

    def compiled_cases(self, blocks):
        block = _block_of(blocks) or 1024
        return [harness.Case(f"n={n}, {harness.dtype_name(d)}",
                             {"n": n, "dtype": harness.dtype_name(d), "values": "randn"},
                             compiled=True)
                for d in DTYPES for n in sorted({block + 1, 1_000_003, 2**22})]

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
        first = (f"{count} of {n} elements differ from a + b; first at index {i}: expected "
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
            hint = ("right on ordinary values, wrong on extreme ones: add the loaded values as "
                    "they are (no rescaling, no clamping), so inf and NaN come out as a + b does")
        elif not hint:
            hint = ("check the offsets (pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)) and that "
                    "the tensor you return is the one the kernel wrote")
        return f"{first}. {hint}"

    def summary(self, cases):
        sizes = sorted({c.params["n"] for c in cases})
        return (f"n = {', '.join(map(str, sizes))} in fp16 and fp32, with extreme values "
                "(overflow, inf, NaN)")


TASK = VectorAdd()


def _block_of(constexprs: dict) -> int | None:
    for name, v in (constexprs or {}).items():
        if "BLOCK" in name.upper() and isinstance(v, int):
            return v
    powers = [v for v in (constexprs or {}).values()
              if isinstance(v, int) and v > 1 and v & (v - 1) == 0]
    return max(powers) if powers else None


def _collect_kernel(ns, seed):
    return harness.collect(TASK, ns, seed)


def _kernel_correct(raw):
    part = "3a vector_add is exact"
    v = harness.verdict_of(TASK, raw)
    block = _block_of(v.blocks)
    return v.correctness(part, f"matches a + b on {TASK.summary([t.case for t in v.watched])}"
                         + (f" (BLOCK_SIZE {block})" if block else ""))


def _kernel_in_bounds(raw):
    return harness.verdict_of(TASK, raw).in_bounds("3b the kernel stays in bounds")


# ------------------------------------------------------------------------------------
# Part 4 (GPU): achieved bandwidth at 2^28 elements, side by side with torch.add.
# ------------------------------------------------------------------------------------


def _collect_bandwidth(ns, seed):
    """In the learner's process: time ``vector_add`` beside torch.add (GPU)."""
    from ...experiments.vector_add import time_pair

    fn = answer(ns, "vector_add")
    spec = hardware.current_gpu()
    out = {"gpu": torch.cuda.get_device_name(),
           "peak_gbps": spec.hbm_bandwidth_gbs if spec else None, "rows": []}
    with gpu_lock():   # side by side, and alone on the GPU
        for dtype in ("fp16", "fp32"):
            try:
                row = time_pair(BIG_N, dtype, fn=fn)
            except AssertionError:
                out["wrong"] = dtype
                return out
            out["rows"].append({"dtype": dtype, "ours": row["triton_gbps"],
                                "ref": row["torch_gbps"]})
    return out


def _bandwidth(raw):
    part = f"4 bandwidth at 2^{BIG_N.bit_length() - 1} elements"
    if raw.get("wrong"):
        return Feedback(part, False, f"vector_add is wrong at n=2^28, {raw['wrong']}")
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
                     f"(torch.add {ref:,.0f} GB/s = {ref / peak:.0%})")
    text = f"on {raw.get('gpu')} (table peak {peak:,.0f} GB/s): " + "; ".join(lines)
    return target(part, best >= PASS_FRACTION, text,
                  f"The target is {PASS_FRACTION:.0%}: check that each program handles a block "
                  "of at least 512 elements and that nothing but the kernel runs inside "
                  "vector_add (no .cpu(), no copies, no synchronize)")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="03_vector_add_intensity",
    title="The roofline challenge on vector add",
    parts=(
        Part("1a", "FLOPs", 1, _flops, ("add_flops",)),
        Part("1b", "bytes moved", 2, _bytes, ("add_bytes",)),
        Part("1c", "intensity", 1, _intensity, ("add_intensity",)),
        Part("1d", "bound", 1, _bound, ("add_bound",)),
        Part("1e", "minimum time", 2, _min_time, ("add_min_time_ms",)),
        Part("2a", "fp32 intensity", 1, _fp32, ("fp32_intensity",)),
        Part("2b", "in-place intensity", 1, _inplace, ("inplace_intensity",)),
        Part("2c", "three-input intensity", 1, _three, ("three_input_intensity",)),
        Part("2d", "FMAs to cross the ridge", 1, _fma, ("fma_chain_k",)),
        Part("2e", "which could cross the ridge", 1, _cross, ("could_cross",)),
        Part("3a", "vector_add is exact", 3, _kernel_correct, ("vector_add",), group="kernel",
             collect=_collect_kernel),
        Part("3b", "the kernel stays in bounds", 2, _kernel_in_bounds, ("vector_add",),
             group="kernel", collect=_collect_kernel),
        Part("4", f"bandwidth at 2^{BIG_N.bit_length() - 1} elements", 3, _bandwidth,
             ("vector_add",), gpu=True, collect=_collect_bandwidth, after="kernel"),
    ),
)

check_napkin_math = check_function(ASSIGNMENT, ("1a", "1b", "1c", "1d", "1e"),
    "Part 1: ``add_flops``, ``add_bytes``, ``add_intensity``, ``add_bound``, "
    "``add_min_time_ms``.")

check_variants = check_function(ASSIGNMENT, ("2a", "2b", "2c", "2d", "2e"),
    "Part 2: ``fp32_intensity``, ``inplace_intensity``, ``three_input_intensity``, "
    "``fma_chain_k``, ``could_cross``.")

check_kernel = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: ``vector_add`` on awkward sizes and edge inputs, its kernel bounds-checked.")

check_bandwidth = check_function(ASSIGNMENT, ("4",),
    "Part 4: achieved bandwidth at 2^28 elements (GPU mode; reported as pending on a CPU). "
    "Runs part 3's trials first: the speed of a wrong kernel is not graded.")
