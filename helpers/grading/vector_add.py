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

from .. import hardware, roofline, runtime
from ..feedback import Feedback, check_choice, check_number, needs_gpu, not_implemented
from ..kernels import vector_add as va
from . import bounds
from .battery import Battery
from .gpu import gpu_lock
from .registry import (Assignment, Part, answer, caller_namespace, is_not_implemented,
                       run_checks)

GPU = hardware.GPUS["H100-SXM"]
COMPUTE_ROOF = "fp32"          # elementwise arithmetic: CUDA cores
N = 10**9
FP16, FP32 = torch.float16, torch.float32
PASS_FRACTION = 0.80           # part 4: achieved / table peak bandwidth at BIG_N
BIG_N = 2**28
TOLERANCE = 0.02               # relative, for every napkin-math number


def _ms(nbytes: float) -> float:
    """Time to move ``nbytes`` at the table's bandwidth, in milliseconds."""
    return nbytes / (GPU.hbm_bandwidth_gbs * 1e9) * 1e3


# The right answers, and the classic wrong ones, from the course's own functions.
FLOPS = va.flops(N)
BYTES = va.bytes_moved(N, FP16)
INTENSITY = FLOPS / BYTES
BOUND = roofline.bound(INTENSITY, GPU, COMPUTE_ROOF)
MIN_TIME_MS = roofline.predicted_time_ms(FLOPS, BYTES, GPU, COMPUTE_ROOF)
RIDGE = GPU.ridge_point(COMPUTE_ROOF)
FP32_INTENSITY = va.intensity(N, FP32)
INPLACE_INTENSITY = va.intensity(N, FP16)          # A += B: still read A, read B, write A
THREE_INPUT_INTENSITY = va.intensity(N, FP16, n_inputs=3)


def fma_chain_intensity(k: int, *, write: bool = True) -> float:
    """fp32 ``D = A + B`` then ``k`` FMAs per element in registers: FLOPs per byte."""
    nbytes = va.bytes_moved(1, FP32) - (0 if write else va.element_size(FP32))
    return va.flops(1, fmas_per_element=k) / nbytes


def _smallest_k(ridge: float, flops_per_fma: int = 2, write: bool = True) -> int:
    bytes_per_element = va.bytes_moved(1, FP32) - (0 if write else va.element_size(FP32))
    return math.ceil((ridge * bytes_per_element - 1) / flops_per_fma)


FMA_K = _smallest_k(RIDGE)
VARIANTS = ("fp16", "fp32", "in-place", "three inputs", "fma chain")
COULD_CROSS = {"fma chain"}


# ------------------------------------------------------------------------------------
# Part 1: napkin math for C = A + B, 10^9 fp16 elements, on the table's H100 SXM.
# ------------------------------------------------------------------------------------


def _flops(ns):
    return check_number("1a FLOPs", answer(ns, "add_flops"), FLOPS, rel=TOLERANCE,
                        unit="FLOP", mistakes=[
                            (2 * FLOPS, "you count 2 FLOPs per element: an addition is one "
                                        "FLOP (a fused multiply-add is the one that counts two)"),
                            (3 * FLOPS, "you count a FLOP per value moved: there is one "
                                        "addition per element of C")],
                        hint="one addition per element of C.")


def _bytes(ns):
    e = va.element_size(FP16)
    return check_number("1b bytes moved", answer(ns, "add_bytes"), BYTES, rel=TOLERANCE,
                        unit="bytes", mistakes=[
                            (2 * N * e, "you forget the write of C: C crosses the bus too, "
                                        "on its way back to DRAM"),
                            (8 * BYTES, "you count bits, not bytes (an fp16 value is 2 bytes)"),
                            (va.bytes_moved(N, FP32), "you use 4 bytes per element: that is "
                                                      "fp32; fp16 is 2 bytes"),
                            (N * e, "you count one array only: A and B are read, C written"),
                            (BYTES / 1e9, "you give gigabytes; the answer is in bytes"),
                            (BYTES / 2**30, "you give GiB; the answer is in bytes")],
                        hint="read A, read B, write C, each N elements of 2 bytes.")


def _intensity(ns):
    return check_number("1c intensity", answer(ns, "add_intensity"), INTENSITY, rel=TOLERANCE,
                        unit="FLOP/byte", mistakes=[
                            (FLOPS / (2 * N * 2), "you forget the write of C (1 FLOP per "
                                                  "4 bytes instead of 6)"),
                            (1 / INTENSITY, "you divide bytes by FLOPs: intensity is FLOPs "
                                            "per byte"),
                            (INTENSITY / 8, "you count bits, not bytes"),
                            (FP32_INTENSITY, "you use 4 bytes per element (fp32)")],
                        hint="FLOPs divided by bytes moved.")


def _bound(ns):
    got = answer(ns, "add_bound")
    return check_choice("1d bound", got, BOUND, ("memory", "compute"),
                        why=f"{INTENSITY:.3g} FLOP/byte is far left of the ridge point, "
                            f"{RIDGE:.0f} FLOP/byte ({COMPUTE_ROOF} peak "
                            f"{GPU.peak(COMPUTE_ROOF):g} TFLOP/s over "
                            f"{GPU.hbm_bandwidth_gbs:,.0f} GB/s).")


def _min_time(ns):
    compute_ms = FLOPS / (GPU.peak(COMPUTE_ROOF) * 1e12) * 1e3
    return check_number("1e minimum time", answer(ns, "add_min_time_ms"), MIN_TIME_MS,
                        rel=TOLERANCE, unit="ms", mistakes=[
                            (_ms(2 * N * 2), "you forget the write of C"),
                            (MIN_TIME_MS / 1e3, "you give seconds; the answer is in "
                                                "milliseconds"),
                            (MIN_TIME_MS * 1e3, "you give microseconds; the answer is in "
                                                "milliseconds"),
                            (compute_ms, "you take the compute time; a memory-bound kernel "
                                         "waits for memory, so the memory time is the bound"),
                            (BYTES / 3e12 * 1e3, "you use 3 TB/s; the table says "
                                                 f"{GPU.hbm_bandwidth_gbs:,.0f} GB/s"),
                            (BYTES / (GPU.hbm_bandwidth_gbs * 2**30) * 1e3,
                             "you take GB/s as GiB/s (2^30 bytes); GB/s is 10^9 bytes/s"),
                            (8 * MIN_TIME_MS, "you count bits, not bytes")],
                        hint=f"bytes / bandwidth ({GPU.hbm_bandwidth_gbs:,.0f} GB/s = "
                             f"{GPU.hbm_bandwidth_gbs:g} x 10^9 bytes/s), in ms.")


# ------------------------------------------------------------------------------------
# Part 2: variants that change the intensity.
# ------------------------------------------------------------------------------------


def _fp32(ns):
    return check_number("2a fp32 intensity", answer(ns, "fp32_intensity"), FP32_INTENSITY,
                        rel=TOLERANCE, unit="FLOP/byte", mistakes=[
                            (INTENSITY, "that is fp16: an fp32 value is 4 bytes"),
                            (va.flops(N) / (2 * N * 4), "you forget the write of C")])


def _inplace(ns):
    return check_number("2b in-place intensity", answer(ns, "inplace_intensity"),
                        INPLACE_INTENSITY, rel=TOLERANCE, unit="FLOP/byte", mistakes=[
                            (FLOPS / (2 * N * 2), "in place still writes A back: read A, "
                                                  "read B, write A is three trips per element; "
                                                  "in-place saves a buffer, not traffic")])


def _three(ns):
    return check_number("2c three-input intensity", answer(ns, "three_input_intensity"),
                        THREE_INPUT_INTENSITY, rel=TOLERANCE, unit="FLOP/byte", mistakes=[
                            (N / (4 * N * 2), "A + B + C is two additions per element"),
                            (2 * N / (3 * N * 2), "you forget the write of the result"),
                            (INTENSITY, "a third input adds a FLOP and a read")])


def _fma(ns):
    tensor_ridge = GPU.ridge_point("fp16")
    return check_number("2d FMAs to cross the ridge", answer(ns, "fma_chain_k"), FMA_K,
                        rel=0.005, unit="FMAs per element", mistakes=[
                            (_smallest_k(RIDGE, flops_per_fma=1), "you count an FMA as one "
                                                                  "FLOP: it is a multiply and "
                                                                  "an add, two FLOPs"),
                            (_smallest_k(tensor_ridge), "you use the fp16 tensor-core ridge "
                                                        f"({tensor_ridge:.0f} FLOP/byte); "
                                                        "elementwise FMAs run on the CUDA "
                                                        f"cores, whose ridge is {RIDGE:.0f}"),
                            (_smallest_k(RIDGE, write=False), "you forget the write of D")],
                        hint=f"(1 + 2k) FLOPs per 12 bytes must reach {RIDGE:.0f} FLOP/byte.")


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
    if chosen == COULD_CROSS:
        return Feedback(part, True, "only the FMA chain can: every other variant has a fixed, "
                        "tiny intensity whatever N is")
    wrong = sorted(chosen - COULD_CROSS)
    missed = sorted(COULD_CROSS - chosen)
    text = []
    if wrong:
        text.append(f"{wrong} cannot: their FLOPs and bytes both grow with N, so the intensity "
                    f"stays below 1 FLOP/byte for any N, far from the ridge at {RIDGE:.0f}")
    if missed:
        text.append(f"{missed} can: each FMA adds 2 FLOPs and no bytes, so enough of them "
                    "cross the ridge")
    return Feedback(part, False, "; ".join(text))


# ------------------------------------------------------------------------------------
# Part 3: the kernel and its launcher, on awkward sizes, in fp16 and fp32.
# ------------------------------------------------------------------------------------

DTYPES = (FP16, FP32)
BASE_SIZES = (1, 3, 127, 128, 129, 1023, 1024, 1025, 4097, 100_003)   # 100003 is prime
TOLERANCES = {FP16: (1e-3, 1e-3), FP32: (1e-6, 1e-6)}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class _Trial:
    """One call ``vector_add(a, b)`` on one size and dtype, and what it did."""

    def __init__(self, n: int, dtype):
        self.n, self.dtype = n, dtype
        self.problem: str | None = None      # the first thing wrong, in words
        self.not_implemented = False
        self.raised = False
        self.own_launches = 0
        self.other_kernels: list[str] = []
        self.violations: list = []
        self.block: int | None = None

    @property
    def where(self) -> str:
        return f"n={self.n}, {_dtype_name(self.dtype)}"


def _inputs(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g).to(dtype).to(runtime.device())
    b = torch.randn(n, generator=g).to(dtype).to(runtime.device())
    return a, b


def _block_of(launch) -> int | None:
    values = launch.constexprs
    for name, v in values.items():
        if "BLOCK" in name.upper():
            return v
    powers = [v for v in values.values() if v > 1 and v & (v - 1) == 0]
    return max(powers) if powers else None


def _compare(trial: _Trial, got, a, b, a0, b0, own) -> None:
    """Fill ``trial.problem`` with what is wrong about ``got``, if anything."""
    n, dtype = trial.n, trial.dtype
    if not isinstance(got, torch.Tensor):
        trial.problem = (f"vector_add returned {type(got).__name__} {got!r:.40}, expected a "
                         "torch.Tensor (return C)")
        return
    if tuple(got.shape) != (n,):
        trial.problem = (f"returned shape {tuple(got.shape)}, expected ({n},): C has one "
                         "element per element of A")
        return
    if got.dtype != dtype:
        trial.problem = (f"returned {_dtype_name(got.dtype)} for {_dtype_name(dtype)} inputs: "
                         "C must have the inputs' dtype (allocate it with torch.empty_like(a))")
        return
    if got.device != a.device:
        trial.problem = f"returned a tensor on {got.device}, the inputs are on {a.device}"
        return
    if not (torch.equal(a, a0) and torch.equal(b, b0)):
        trial.problem = "changed its inputs: A and B must be read, never written"
        return
    want = a0.float() + b0.float()
    got32 = got.float()
    atol, rtol = TOLERANCES[dtype]
    bad = ~torch.isclose(got32, want.to(dtype).float(), atol=atol, rtol=rtol)
    if bad.any():
        idx = bad.nonzero().flatten().tolist()
        i = idx[0]
        value = got32[i].item()
        block = trial.block
        tail = block and n % block and min(idx) >= n // block * block
        first = (f"{len(idx)} of {n} elements differ from a + b; first at index {i}: "
                 f"expected {want[i].item():.4g}, got {value:.4g}")
        if math.isnan(value):
            hint = ("NaN means an element nobody wrote (torch.empty holds leftovers) or one "
                    "computed from a masked-off load")
        else:
            hint = ""
        if tail:
            hint = (f"{hint + '. ' if hint else ''}Only the last, partial block (indices "
                    f"{n // block * block} to {n - 1}) is wrong: the grid needs "
                    f"triton.cdiv(n, BLOCK_SIZE) programs, one more than n // BLOCK_SIZE, so "
                    "that a program covers it")
        elif not hint:
            hint = ("check the offsets (pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)) and that "
                    "the tensor you return is the one the kernel wrote")
        trial.problem = f"{first}. {hint}"
        return
    if not any(got.data_ptr() in launch.tensor_ptrs for launch in own):
        trial.problem = ("returned a tensor your kernel was not given: C must be the output "
                         "your kernel writes, not computed some other way")


def _one_trial(fn, namespace, n, dtype, seed, log, block) -> _Trial:
    trial = _Trial(n, dtype)
    trial.block = block
    a, b = _inputs(n, dtype, seed)
    a0, b0 = a.clone(), b.clone()
    start = len(log.launches)
    try:
        got = fn(a, b)
        if runtime.is_gpu():
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the learner's error, reported
        trial.not_implemented = is_not_implemented(err)
        trial.raised = True
        detail = str(err).strip().splitlines()
        trial.problem = (f"vector_add(a, b) raised {type(err).__name__}"
                         + (f": {detail[-1][:300]}" if detail else ""))
        got = None
    new = log.launches[start:]
    own = [launch for launch in new if launch.defined_in(namespace)]
    trial.own_launches = len(own)
    trial.other_kernels = sorted({f"{launch.module}.{launch.name}" for launch in new
                                  if not launch.defined_in(namespace)})
    for launch in own:
        trial.violations += launch.violations
        trial.block = trial.block or _block_of(launch)
    if trial.problem is None and not own:
        if trial.other_kernels:
            trial.problem = (f"vector_add launched {', '.join(trial.other_kernels)}, not a "
                             "kernel defined in your notebook: write and launch your own "
                             "@triton.jit kernel")
        else:
            trial.problem = ("vector_add launched no Triton kernel: it computed C some other "
                             "way (torch?). Launch your @triton.jit kernel with "
                             "kernel[grid](...)")
    if trial.problem is None:
        _compare(trial, got, a, b, a0, b0, own)
    return trial


class _Battery(Battery):
    """Every trial of one ``vector_add``; parts 3a, 3b and 4 share it."""


_memo: list = []   # [(key, battery)]: 3a, 3b and 4 run right after one another


def _battery(namespace) -> _Battery:
    fn = answer(namespace, "vector_add", callable_=True)
    key = (fn, tuple(id(k) for k in bounds.notebook_kernels(namespace).values()))
    for k, result in _memo:
        if k[0] is key[0] and k[1] == key[1]:
            return result
    trials = []
    with bounds.interpreted(namespace), bounds.watch(guard=True) as log:
        first = _one_trial(fn, namespace, 3, FP16, 0, log, None)
        trials.append(first)
        block = first.block
        sizes = sorted(set(BASE_SIZES) | ({block - 1, block, block + 1, 2 * block + 1}
                                          if block else set()) - {0})
        if not first.not_implemented:
            for dtype in DTYPES:
                for i, n in enumerate(sizes):
                    if (n, dtype) != (3, FP16):
                        trials.append(_one_trial(fn, namespace, n, dtype, 1000 + i, log, block))
    battery = _Battery(trials)
    if runtime.is_gpu() and not battery.failed and not battery.violations:
        battery.compiled_problem = _compiled_run(fn, namespace, block)
    _memo[:] = [(key, battery)]
    return battery


def _compiled_run(fn, namespace, block) -> str | None:
    """GPU mode: the same checks with the kernel compiled (the interpreter is lenient)."""
    with bounds.watch(guard=False) as log:
        for dtype in DTYPES:
            for i, n in enumerate(sorted({(block or 1024) + 1, 1_000_003, 2**22})):
                try:
                    trial = _one_trial(fn, namespace, n, dtype, 5000 + i, log, block)
                except Exception as err:  # noqa: BLE001
                    return f"compiled on the GPU, n={n}: {type(err).__name__}: {err}"
                if trial.problem:
                    return f"compiled on the GPU, {trial.where}: {trial.problem}"
    return None


def _tested(battery) -> str:
    sizes = sorted({t.n for t in battery.trials})
    dtypes = sorted({_dtype_name(t.dtype) for t in battery.trials})
    return f"n = {', '.join(map(str, sizes))} in {' and '.join(dtypes)}"


def _kernel_correct(ns):
    part = "3a vector_add is exact"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    failed = battery.failed
    if failed:
        t = failed[0]
        more = f" ({len(failed)} of {len(battery.trials)} calls failed)" if len(failed) > 1 else ""
        return Feedback(part, False, f"{t.where}: {t.problem}{more}")
    if battery.compiled_problem:
        return Feedback(part, False, battery.compiled_problem)
    block = next((t.block for t in battery.trials if t.block), None)
    return Feedback(part, True, f"matches a + b on {_tested(battery)}"
                    + (f" (BLOCK_SIZE {block})" if block else ""))


def _kernel_in_bounds(ns):
    part = "3b the kernel stays in bounds"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if not battery.ran_own_kernel:
        t = battery.trials[0]
        return Feedback(part, False, f"no kernel of yours ran, so nothing to check: {t.problem}")
    if battery.violations:
        t, v = battery.violations[0]
        sizes = sorted({t.n for t, _ in battery.violations})
        return Feedback(part, False, f"at {t.where}, {v.describe()}. Out-of-bounds accesses "
                        f"happened for n = {', '.join(map(str, sizes))}. Compute "
                        "mask = offsets < n_elements and pass mask=mask to every tl.load and "
                        "tl.store.")
    if battery.crashed:
        t = battery.crashed[0]
        return Feedback(part, False, f"could not be checked: at {t.where}, {t.problem}; a call "
                        "that fails never shows all the loads and stores it would make")
    return Feedback(part, True, f"every load and store stayed inside A, B and C on "
                    f"{_tested(battery)}")


# ------------------------------------------------------------------------------------
# Part 4 (GPU): achieved bandwidth at 2^28 elements, side by side with torch.add.
# ------------------------------------------------------------------------------------


def _bandwidth(ns):
    part = f"4 bandwidth at 2^{BIG_N.bit_length() - 1} elements"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if battery.failed or battery.violations or battery.compiled_problem:
        return Feedback(part, False, "needs a correct, in-bounds kernel first (parts 3a, 3b)")
    spec = hardware.current_gpu()
    if spec is None:
        fb = needs_gpu(part)
        return Feedback(part, False, f"{torch.cuda.get_device_name()} is not in the course's "
                        "GPU table, so it has no peak to compare with; " + fb.message,
                        status=fb.status)
    from ..experiments.vector_add import time_pair

    fn = answer(ns, "vector_add", callable_=True)
    lines, best = [], 0.0
    with gpu_lock():   # side by side, and alone on the GPU
        for dtype in ("fp16", "fp32"):
            try:
                row = time_pair(BIG_N, dtype, fn=fn)
            except AssertionError:
                return Feedback(part, False, f"vector_add is wrong at n=2^28, {dtype}")
            ours, ref = row["triton_gbps"], row["torch_gbps"]
            best = max(best, ours / spec.hbm_bandwidth_gbs)
            lines.append(f"{dtype} {ours:,.0f} GB/s = {ours / spec.hbm_bandwidth_gbs:.0%} of "
                         f"peak (torch.add {ref:,.0f} GB/s = {ref / spec.hbm_bandwidth_gbs:.0%})")
    text = (f"on {torch.cuda.get_device_name()} (table peak {spec.hbm_bandwidth_gbs:,.0f} "
            f"GB/s): " + "; ".join(lines))
    if best >= PASS_FRACTION:
        return Feedback(part, True, text)
    return Feedback(part, False, f"{text}. The target is {PASS_FRACTION:.0%}: check that each "
                    "program handles a block of at least 512 elements and that nothing but the "
                    "kernel runs inside vector_add (no .cpu(), no copies, no synchronize)")


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
        Part("3a", "vector_add is exact", 3, _kernel_correct, ("vector_add",), group="kernel"),
        Part("3b", "the kernel stays in bounds", 2, _kernel_in_bounds, ("vector_add",),
             group="kernel"),
        Part("4", f"bandwidth at 2^{BIG_N.bit_length() - 1} elements", 3, _bandwidth,
             ("vector_add",), gpu=True, group="kernel"),
    ),
)


def check_napkin_math(namespace: dict | None = None):
    """Part 1: ``add_flops``, ``add_bytes``, ``add_intensity``, ``add_bound``, ``add_min_time_ms``."""
    return run_checks(ASSIGNMENT, ("1a", "1b", "1c", "1d", "1e"), caller_namespace(namespace))


def check_variants(namespace: dict | None = None):
    """Part 2: ``fp32_intensity``, ``inplace_intensity``, ``three_input_intensity``,
    ``fma_chain_k``, ``could_cross``."""
    return run_checks(ASSIGNMENT, ("2a", "2b", "2c", "2d", "2e"), caller_namespace(namespace))


def check_kernel(namespace: dict | None = None):
    """Part 3: ``vector_add`` on awkward sizes, with its kernel bounds-checked."""
    _memo.clear()   # the learner may have edited the kernel since the last call
    return run_checks(ASSIGNMENT, ("3a", "3b"), caller_namespace(namespace))


def check_bandwidth(namespace: dict | None = None):
    """Part 4: achieved bandwidth at 2^28 elements (GPU mode; reported as pending on a CPU)."""
    return run_checks(ASSIGNMENT, ("4",), caller_namespace(namespace))
