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
3a     >= 1.5x faster than the eager PyTorch version (GPU)              3
3b     within 20 % of the predicted time (GPU)                          2
=====  ==========================================================  ======
"""

from __future__ import annotations


import torch

from .. import runtime
from ..feedback import Feedback, check_number, not_implemented
from ..kernels import rmsnorm as rk
from . import bounds
from .battery import Battery
from .gpu import gpu_lock
from .registry import (Assignment, Part, answer, caller_namespace, is_not_implemented,
                       run_checks)

M, N = 4096, 8192
BF16 = torch.bfloat16
EPS = rk.EPS
TOLERANCE = 0.02                 # relative, for every napkin-math number
SPEEDUP_GOAL = 1.5               # part 3a: measured speed-up over the eager version
TIME_SLACK = 1.2                 # part 3b: measured time <= 1.2 x predicted

S = rk.element_size(BF16)
MN = M * N
EAGER_BYTES = rk.bytes_moved("eager", M, N, BF16)
FUSED_BYTES = rk.bytes_moved("fused", M, N, BF16)
PREDICTED_SPEEDUP = EAGER_BYTES / FUSED_BYTES


def reference_copy_gbps() -> tuple[float, str]:
    """The copy bandwidth of the course's reference GPU, from the committed probe record."""
    from .. import records

    rec = records.load("probes")
    return rec.results["copy"]["gbps"], rec.label


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9) * 1e3


# ------------------------------------------------------------------------------------
# Part 1: napkin math.
# ------------------------------------------------------------------------------------

_EAGER_OPS = rk.eager_kernels(M, N, BF16)


def _eager(ns):
    conversions = sum(r + w for op, r, w in _EAGER_OPS if ".to(" in op)
    return check_number(
        "1a bytes of the eager version", answer(ns, "eager_bytes"), EAGER_BYTES, rel=TOLERANCE,
        unit="bytes", mistakes=[
            (28 * MN, "you count the fp32 copies at 2 bytes per element: after "
                      "h.to(torch.float32) every intermediate is fp32, 4 bytes"),
            (sum(r for _, r, _ in _EAGER_OPS), "you count only what the kernels read: each "
                                               "also writes its output back to DRAM"),
            (sum(w for _, _, w in _EAGER_OPS), "you count only what the kernels write: each "
                                               "also reads its inputs from DRAM"),
            (EAGER_BYTES - conversions, "you skip the two .to() conversions: each is a kernel "
                                        "that reads the whole tensor and writes a copy"),
            (rk.bytes_moved("torch", M, N, BF16), "you count add + F.rms_norm (PyTorch's "
                                                  "fused norm), not the eager version shown"),
            (EAGER_BYTES / 1e9, "you give gigabytes; the answer is in bytes"),
            (8 * EAGER_BYTES, "you count bits, not bytes")],
        hint="nine kernels: for each, the bytes of every tensor it reads plus every tensor it "
             "writes (bf16: 2 bytes, fp32: 4; the row statistics are M values, the weight N).")


def _fused(ns):
    return check_number(
        "1b bytes of the fused kernel", answer(ns, "fused_bytes"), FUSED_BYTES, rel=TOLERANCE,
        unit="bytes", mistakes=[
            (3 * MN * S, "you forget to write h: the fused kernel must still store the new "
                         "residual stream, the next block adds to it"),
            (2 * MN * S, "you count x and y only: residual is read and h written as well"),
            (5 * MN * S, "you read h back: in the fused kernel h stays in registers between "
                         "its store and the norm"),
            (4 * MN * 4, "you count 4 bytes per element: the tensors are bf16, 2 bytes"),
            (FUSED_BYTES / 1e9, "you give gigabytes; the answer is in bytes")],
        hint="read x and residual, write h and y (M x N bf16 each), read the weight once.")


def _speedup(ns):
    return check_number(
        "1c predicted speed-up", answer(ns, "predicted_speedup"), PREDICTED_SPEEDUP,
        rel=TOLERANCE, unit="x", mistakes=[
            (1 / PREDICTED_SPEEDUP, "you divide fused bytes by eager bytes: the speed-up is "
                                    "the eager time over the fused time"),
            (28 / 8, "that is the ratio with the fp32 copies counted at 2 bytes")],
        hint="both versions are memory-bound, so their times are in the ratio of their bytes.")


def _predicted(ns):
    from .. import hardware, records

    gbps, label = reference_copy_gbps()
    expected = _ms(FUSED_BYTES, gbps)
    table = hardware.lookup(records.load("probes").gpu).hbm_bandwidth_gbs   # its datasheet
    return check_number(
        "1d predicted time", answer(ns, "predicted_ms"), expected, rel=TOLERANCE, unit="ms",
        mistakes=[
            (_ms(FUSED_BYTES, table), f"you use the datasheet's {table:,.0f} GB/s; the "
                                      f"prediction uses the measured copy bandwidth, "
                                      f"{gbps:,.0f} GB/s"),
            (expected / 1e3, "you give seconds; the answer is in milliseconds"),
            (expected * 1e3, "you give microseconds; the answer is in milliseconds"),
            (_ms(EAGER_BYTES, gbps), "that is the eager version's time; predict the fused "
                                     "kernel's"),
            (FUSED_BYTES / (gbps * 2**30) * 1e3, "you take GB/s as GiB/s; GB/s is 10^9 bytes/s")],
        hint=f"fused bytes / copy bandwidth ({gbps:,.0f} GB/s in the probe record, {label}).")


# ------------------------------------------------------------------------------------
# Part 2: the fused kernel, on awkward shapes, in three dtypes, bounds-checked.
# ------------------------------------------------------------------------------------

# (rows, cols): one element; odd widths; a power of two; just past one (half the block
# masked); a width past 4096 with a ragged block.
SHAPES = ((1, 1), (3, 7), (5, 1000), (4, 1024), (2, 1025), (3, 4097))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
COMPILED_SHAPES = ((M, N, BF16), (4097, 1000, torch.float32), (7, 12289, torch.float16))


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _inputs(rows, cols, dtype, seed, device=None):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(rows, cols, generator=g)
    r = torch.randn(rows, cols, generator=g)
    w = 1 + 0.1 * torch.randn(cols, generator=g)
    device = device or runtime.device()
    return tuple(t.to(dtype).to(device) for t in (x, r, w))


class _Trial:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
        self.problem: str | None = None
        self.not_implemented = False
        self.raised = False
        self.own_launches = 0
        self.violations: list = []

    @property
    def where(self) -> str:
        return f"shape {self.shape[0]}x{self.shape[1]}, {_name(self.dtype)}"


def _diagnose_y(got, want, h, w) -> str:
    """A hint for a wrong y: the usual slips leave a signature."""
    g, t = got.float(), want.float()
    if torch.isnan(g).any():
        return ("y has NaN: a masked-off lane loaded without other=0.0 entered the sum of "
                "squares, or the output has elements no program wrote")
    ratio = (g.norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-30))
    if t.shape[-1] > 1 and (ratio - ratio.mean()).abs().max() < 1e-2 * ratio.mean() \
            and abs(ratio.mean().item() - 1) > 1e-2:
        return (f"every row of y is {ratio.mean().item():.3g} times the reference: the mean of "
                "h^2 must divide by n_cols (not BLOCK_SIZE), then add eps, then take rsqrt")
    unweighted = h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + EPS)
    weighted = not torch.allclose(w.float(), torch.ones_like(w.float()))
    if weighted and torch.allclose(g, unweighted, atol=0.05, rtol=0.05):
        return "y matches the norm without the weight: multiply by weight[col]"
    return "compare y = h * rsqrt(mean(h^2) + eps) * weight, row by row, in fp32"


def _compare(trial, out, x, r, w, x0, r0, w0, own) -> None:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        trial.problem = (f"residual_rmsnorm returned {type(out).__name__} {out!r:.40}; expected "
                         "the pair (h, y)")
        return
    h, y = out
    want_h, want_y = rk.residual_rmsnorm_reference(x0, r0, w0, EPS)
    for name, got, want in (("h", h, want_h), ("y", y, want_y)):
        if not isinstance(got, torch.Tensor):
            trial.problem = f"{name} is {type(got).__name__}, not a torch.Tensor"
            return
        if tuple(got.shape) != tuple(want.shape):
            trial.problem = f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            return
        if got.dtype != want.dtype:
            trial.problem = (f"{name} is {_name(got.dtype)} for {_name(want.dtype)} inputs: "
                             "allocate outputs with torch.empty_like(x)")
            return
        if got.device != x.device:
            trial.problem = f"{name} is on {got.device}, the inputs on {x.device}"
            return
    if not (torch.equal(x, x0) and torch.equal(r, r0) and torch.equal(w, w0)):
        trial.problem = "changed its inputs: x, residual and weight are only read"
        return
    atol, rtol = rk.TOLERANCES[trial.dtype]
    for name, got, want in (("h", h, want_h), ("y", y, want_y)):
        err = (got.float() - want.float()).abs()
        bad = ~(err <= atol + rtol * want.float().abs())
        if bad.any():
            i = tuple(bad.nonzero()[0].tolist())
            first = (f"{int(bad.sum())} of {want.numel()} elements of {name} are off; first at "
                     f"{list(i)}: expected {want[i].item():.4g}, got {got[i].item():.4g} "
                     f"(tolerance {atol:.2g} + {rtol:.2g} x |expected|)")
            hint = ("h must be x + residual, rounded to the input dtype" if name == "h"
                    else _diagnose_y(y, want_y, h, w0))
            trial.problem = f"{first}. {hint}"
            return
    for name, got in (("h", h), ("y", y)):
        if not any(got.data_ptr() in launch.tensor_ptrs for launch in own):
            trial.problem = (f"returned a {name} your kernel was not given: both outputs must be "
                             "written by your kernel, not computed some other way")
            return


def _one_trial(fn, namespace, shape, dtype, seed, log, device=None) -> _Trial:
    trial = _Trial(shape, dtype)
    x, r, w = _inputs(*shape, dtype, seed, device)
    x0, r0, w0 = x.clone(), r.clone(), w.clone()
    start = len(log.launches)
    out = None
    try:
        out = fn(x, r, w)
        if x.is_cuda:
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the learner's error, reported
        trial.not_implemented = is_not_implemented(err)
        trial.raised = True
        detail = str(err).strip().splitlines()
        trial.problem = (f"residual_rmsnorm(x, residual, weight) raised {type(err).__name__}"
                         + (f": {detail[-1][:300]}" if detail else ""))
    new = log.launches[start:]
    own = [launch for launch in new if launch.defined_in(namespace)]
    trial.own_launches = len(own)
    for launch in own:
        trial.violations += launch.violations
    if trial.problem is None and not own:
        others = sorted({f"{launch.module}.{launch.name}" for launch in new})
        trial.problem = (
            f"residual_rmsnorm launched {', '.join(others)}, not a kernel defined in your "
            "notebook: write and launch your own @triton.jit kernel" if others else
            "residual_rmsnorm launched no Triton kernel: it computed the result some other way "
            "(torch?). Launch your @triton.jit kernel with kernel[grid](...)")
    if trial.problem is None:
        _compare(trial, out, x, r, w, x0, r0, w0, own)
    return trial


class _Battery(Battery):
    """Every trial of one ``residual_rmsnorm``; parts 2a, 3a and 3b share it."""

    def tested(self) -> str:
        shapes = ", ".join(f"{a}x{b}" for a, b in SHAPES)
        return f"{shapes} in {', '.join(_name(d) for d in DTYPES)}"


_memo: list = []


def _battery(namespace) -> _Battery:
    fn = answer(namespace, "residual_rmsnorm", callable_=True)
    key = (fn, tuple(id(k) for k in bounds.notebook_kernels(namespace).values()))
    for k, result in _memo:
        if k[0] is key[0] and k[1] == key[1]:
            return result
    trials = []
    with bounds.interpreted(namespace), bounds.watch(guard=True) as log:
        first = _one_trial(fn, namespace, SHAPES[2], torch.float32, 0, log)
        trials.append(first)
        if not first.not_implemented:
            for dtype in DTYPES:
                for i, shape in enumerate(SHAPES):
                    if (shape, dtype) != (SHAPES[2], torch.float32):
                        trials.append(_one_trial(fn, namespace, shape, dtype, 100 + i, log))
    battery = _Battery(trials)
    if runtime.is_gpu() and not battery.failed and not battery.violations:
        battery.compiled_problem = _compiled_run(fn, namespace)
    _memo[:] = [(key, battery)]
    return battery


def _compiled_run(fn, namespace) -> str | None:
    """GPU mode: the same checks with the kernel compiled, on large shapes."""
    with bounds.watch(guard=False) as log:
        for i, (rows, cols, dtype) in enumerate(COMPILED_SHAPES):
            try:
                trial = _one_trial(fn, namespace, (rows, cols), dtype, 500 + i, log, "cuda")
            except Exception as err:  # noqa: BLE001
                return f"compiled on the GPU, {rows}x{cols}: {type(err).__name__}: {err}"
            if trial.problem:
                return f"compiled on the GPU, {trial.where}: {trial.problem}"
    return None


def _kernel_correct(ns):
    part = "2a residual_rmsnorm is right"
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
    return Feedback(part, True, f"h and y match the reference on {battery.tested()}")


def _kernel_in_bounds(ns):
    part = "2b the kernel stays in bounds"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if not battery.ran_own_kernel:
        return Feedback(part, False, f"no kernel of yours ran, so nothing to check: "
                        f"{battery.trials[0].problem}")
    if battery.violations:
        t, v = battery.violations[0]
        return Feedback(part, False, f"at {t.where}, {v.describe()}. The row is shorter than "
                        "BLOCK_SIZE: mask = cols < n_cols, on every tl.load and tl.store "
                        "(the weight's too)")
    if battery.crashed:
        t = battery.crashed[0]
        return Feedback(part, False, f"could not be checked: at {t.where}, {t.problem}; a call "
                        "that fails never shows all the loads and stores it would make")
    return Feedback(part, True, f"every load and store stayed inside x, residual, weight, h and "
                    f"y on {battery.tested()}")


# ------------------------------------------------------------------------------------
# Part 3 (GPU): timed at 4096 x 8192 bf16, side by side with the eager version.
# ------------------------------------------------------------------------------------

_timing: list = []


def _timings(ns) -> dict | Feedback:
    fn = answer(ns, "residual_rmsnorm", callable_=True)
    for k, result in _timing:
        if k is fn:
            return result
    from .. import bench, hardware

    x, r, w = _inputs(M, N, BF16, 900, "cuda")
    with gpu_lock():
        copy = hardware.measure_copy_bandwidth()
        fn(x, r, w)
        yours = bench.time_ms(lambda: fn(x, r, w))
        eager = bench.time_ms(lambda: rk.residual_rmsnorm_eager(x, r, w))
    result = {"yours": yours, "eager": eager, "copy_gbps": copy["gbps"],
              "predicted": _ms(FUSED_BYTES, copy["gbps"]), "gpu": torch.cuda.get_device_name()}
    _timing[:] = [(fn, result)]
    return result


def _needs_correct_kernel(ns, part) -> Feedback | None:
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if battery.failed or battery.violations or battery.compiled_problem:
        return Feedback(part, False, "needs a correct, in-bounds kernel first (parts 2a, 2b)")
    return None


def _speed(ns):
    part = "3a faster than eager PyTorch"
    blocked = _needs_correct_kernel(ns, part)
    if blocked is not None:   # a failed Feedback is falsy: test for None
        return blocked
    t = _timings(ns)
    ratio = t["eager"] / t["yours"]
    text = (f"on {t['gpu']} at {M}x{N} bf16: yours {t['yours']:.4f} ms, the eager version "
            f"{t['eager']:.4f} ms: {ratio:.2f}x (the bytes predict {PREDICTED_SPEEDUP:.2f}x; "
            f"the goal is {SPEEDUP_GOAL:g}x)")
    return Feedback(part, ratio >= SPEEDUP_GOAL, text if ratio >= SPEEDUP_GOAL else
                    f"{text}. One program per row, the whole row in one block, nothing but "
                    "the kernel launch inside residual_rmsnorm")


def _near_prediction(ns):
    part = "3b within 20% of the predicted time"
    blocked = _needs_correct_kernel(ns, part)
    if blocked is not None:   # a failed Feedback is falsy: test for None
        return blocked
    t = _timings(ns)
    limit = TIME_SLACK * t["predicted"]
    text = (f"on {t['gpu']}: predicted {t['predicted']:.4f} ms ({FUSED_BYTES:,} bytes at the "
            f"copy bandwidth measured now, {t['copy_gbps']:,.0f} GB/s), measured "
            f"{t['yours']:.4f} ms = {t['yours'] / t['predicted']:.2f}x the prediction "
            f"(at most {TIME_SLACK:g}x)")
    return Feedback(part, t["yours"] <= limit, text if t["yours"] <= limit else
                    f"{text}. Too slow for its bytes: try another num_warps, and check that "
                    "each row is read once")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="05_fusion",
    title="Fuse residual add + RMSNorm",
    parts=(
        Part("1a", "bytes of the eager version", 3, _eager, ("eager_bytes",)),
        Part("1b", "bytes of the fused kernel", 2, _fused, ("fused_bytes",)),
        Part("1c", "predicted speed-up", 1, _speedup, ("predicted_speedup",)),
        Part("1d", "predicted time", 2, _predicted, ("predicted_ms",)),
        Part("2a", "residual_rmsnorm is right", 5, _kernel_correct, ("residual_rmsnorm",),
             group="kernel"),
        Part("2b", "the kernel stays in bounds", 2, _kernel_in_bounds, ("residual_rmsnorm",),
             group="kernel"),
        Part("3a", "faster than eager PyTorch", 3, _speed, ("residual_rmsnorm",), gpu=True,
             group="kernel"),
        Part("3b", "within 20% of the predicted time", 2, _near_prediction,
             ("residual_rmsnorm",), gpu=True, group="kernel"),
    ),
)


def check_napkin_math(namespace: dict | None = None):
    """Part 1: ``eager_bytes``, ``fused_bytes``, ``predicted_speedup``, ``predicted_ms``."""
    return run_checks(ASSIGNMENT, ("1a", "1b", "1c", "1d"), caller_namespace(namespace))


def check_kernel(namespace: dict | None = None):
    """Part 2: ``residual_rmsnorm`` on awkward shapes and dtypes, its kernel bounds-checked."""
    _memo.clear()    # the learner may have edited the kernel since the last call
    _timing.clear()
    return run_checks(ASSIGNMENT, ("2a", "2b"), caller_namespace(namespace))


def check_speed(namespace: dict | None = None):
    """Part 3: timed against the eager version (GPU mode; pending on a CPU)."""
    _timing.clear()
    return run_checks(ASSIGNMENT, ("3a", "3b"), caller_namespace(namespace))
