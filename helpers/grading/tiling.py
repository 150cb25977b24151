"""Assignment 04, a tiled matmul: its graded parts and the ``check_*`` calls of the notebook.

Every expected value comes from the course's napkin math (:mod:`helpers.kernels.matmul`)
and its reference product; none is typed in.

Parts (15 points; 12 graded in CPU mode, the last 3 on a GPU):

=====  ==========================================================  ======
1a-1b  napkin math for one tile: intensity, SRAM with 4 stages        2
2a     ``matmul`` launches the notebook's kernel and matches the      4
       reference on awkward shapes (fp16 and fp32)
2b     ... on transposed and sliced inputs (strides)                  2
2c     its kernel never reads or writes outside A, B and C            2
2d     it accumulates in fp32 (errors in units of the last place)     2
3      >= 70 % of torch.matmul (cuBLAS) at 4096^3 fp16 (GPU)          3
=====  ==========================================================  ======

The kernel is tested with the learner's own block sizes (read from the launch): the shapes
are chosen around them, so that there are partial tiles on every edge whatever the blocks.
"""

from __future__ import annotations

import contextlib
import math

import torch

from .. import runtime
from ..feedback import Feedback, check_number, not_implemented
from ..kernels import matmul as mm
from . import bounds
from .battery import Battery
from .gpu import gpu_lock
from .registry import (Assignment, Part, answer, caller_namespace, is_not_implemented,
                       run_checks)

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32

# Part 1: one tile of 64 x 128 outputs, BLOCK_K = 32, bf16, 4 pipeline stages.
TILE = (64, 128, 32)
TILE_DTYPE = BF16
TILE_STAGES = 4
INTENSITY = mm.tile_intensity(*TILE, TILE_DTYPE)
SRAM = mm.sram_bytes(*TILE, TILE_DTYPE, TILE_STAGES)

# Part 2.
DTYPES = (FP16, FP32)
# (atol, rtol) for randn inputs with K up to ~100, scaled by sqrt(K / 100) (|C| grows so).
# fp16: one rounding of an fp32 sum; fp32: TF32 on a GPU's tensor cores.
TOLERANCES = {FP16: (2e-2, 2e-3), BF16: (1e-1, 1.6e-2), FP32: (5e-2, 1e-2)}
ACC_ULP_LIMIT = 1.0          # fp32 accumulation stays within ~0.5 ulp of the exact product
WRONG_ULP = 64.0             # beyond this the kernel is wrong, not imprecise
DEFAULT_BLOCK = 32           # if the launch says nothing about the blocks

# Part 3.
SPEED_N = 4096
SPEED_GOAL = 0.70


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------
# Part 1: napkin math for one tile.
# ------------------------------------------------------------------------------------


def _intensity(ns):
    bm, bn, bk = TILE
    s = TILE_DTYPE.itemsize
    return check_number(
        "1a tile intensity", answer(ns, "tile_intensity"), INTENSITY, rel=0.02,
        unit="FLOP/byte", mistakes=[
            (INTENSITY / 2, "you count one FLOP per multiply-add (it is two), or 4 bytes per "
                            "element (bf16 is 2)"),
            (2 * bm * bn * bk / (bm * bk * s), "you count the A tile's bytes only: the B tile "
                                               "is loaded too"),
            (2 * bm * bn * bk / (bn * bk * s), "you count the B tile's bytes only: the A tile "
                                               "is loaded too"),
            (1 / INTENSITY, "you divide bytes by FLOPs: intensity is FLOPs per byte"),
            (INTENSITY / 8, "you count bits, not bytes")],
        hint="per K step: 2 x BLOCK_M x BLOCK_N x BLOCK_K FLOPs for (BLOCK_M + BLOCK_N) x "
             "BLOCK_K loaded values of 2 bytes.")


def _sram(ns):
    bm, bn, bk = TILE
    s = TILE_DTYPE.itemsize
    stage = (bm * bk + bk * bn) * s
    return check_number(
        "1b SRAM per program", answer(ns, "tile_sram_bytes"), SRAM, rel=0.02, unit="bytes",
        mistakes=[
            (stage, "you count one stage: each of the 4 stages has its own A and B tiles"),
            (SRAM + bm * bn * 4, "you add the fp32 accumulator: it lives in registers, not "
                                 "shared memory"),
            (TILE_STAGES * bm * bn * s, "you count a tile of C: the stages hold tiles of A "
                                        "and B"),
            (2 * SRAM, "you use 4 bytes per element: bf16 is 2"),
            (8 * SRAM, "you count bits, not bytes"),
            (SRAM / 1024, "you give KiB; the answer is in bytes")],
        hint="stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x 2 bytes.")


# ------------------------------------------------------------------------------------
# Part 2: the kernel and its launcher.
# ------------------------------------------------------------------------------------


def _blocks_of(launch) -> tuple[int, int, int] | None:
    c = {k.upper(): v for k, v in launch.constexprs.items()}
    got = tuple(c.get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    return got if all(isinstance(v, int) and v > 0 for v in got) else None


def shapes_for(blocks) -> list[tuple[int, int, int]]:
    """(M, N, K) around the blocks: partial tiles on every edge, K shorter than a block."""
    bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
    return [(bm + 1, bn - 1, bk + 3), (2 * bm + 3, bn + 5, 2 * bk + 7), (bm, bn, bk),
            (1, 1, 1), (5, 2 * bn + 1, 3)]


class _Trial:
    def __init__(self, what: str, shape, dtype):
        self.what, self.shape, self.dtype = what, shape, dtype
        self.problem: str | None = None
        self.not_implemented = False
        self.raised = False
        self.own_launches = 0
        self.other_kernels: list[str] = []
        self.violations: list = []
        self.blocks = None
        self.result = None
        self.worst_ulp: float | None = None

    @property
    def where(self) -> str:
        M, N, K = self.shape
        return f"{self.what} M={M}, N={N}, K={K}, {_name(self.dtype)}"


def _random(M, N, K, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).to(device)
    b = torch.randn(K, N, generator=g).to(dtype).to(device)
    return a, b


def _layouts(kind, M, N, K, dtype, seed, device):
    """A and B as the trial wants them: contiguous, or views with unusual strides."""
    if kind == "contiguous":
        return _random(M, N, K, dtype, seed, device)
    g = torch.Generator().manual_seed(seed)
    if kind == "A transposed, B every other column":
        at = torch.randn(K, M, generator=g).to(dtype).to(device)
        wide = torch.randn(K, 2 * N, generator=g).to(dtype).to(device)
        return at.t(), wide[:, ::2]
    if kind == "B transposed":
        a = torch.randn(M, K, generator=g).to(dtype).to(device)
        bt = torch.randn(N, K, generator=g).to(dtype).to(device)
        return a, bt.t()
    raise ValueError(kind)


def _hint(got, want, a, b, blocks) -> str:
    """What a wrong C's pattern of errors says about the kernel."""
    M, K = a.shape
    N = b.shape[1]
    bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
    g, w = got.float(), want.float()
    if torch.isnan(g).any():
        return ("C holds NaN: an element no program wrote (torch.empty keeps leftovers; is the "
                "grid triton.cdiv(M, BLOCK_M) x triton.cdiv(N, BLOCK_N)?) or a masked load "
                "without other=0.0")
    atol, rtol = TOLERANCES[want.dtype]
    bad = ~torch.isclose(g, w, atol=atol * 4, rtol=rtol * 4)
    rows = bad.any(dim=1).nonzero().flatten()
    cols = bad.any(dim=0).nonzero().flatten()
    full_m, full_n = M // bm * bm, N // bn * bn
    # A partial tile is to blame only if the full tiles before it came out right.
    if len(rows) and full_m and rows.min() >= full_m and M % bm:
        return (f"only rows {full_m} and up are wrong, the last partial row of tiles: mask the "
                "rows with offs_m < M on the load of A and on the store, and launch "
                "triton.cdiv(M, BLOCK_M) rows of programs")
    if len(cols) and full_n and cols.min() >= full_n and N % bn:
        return (f"only columns {full_n} and up are wrong, the last partial column of tiles: "
                "mask the columns with offs_n < N on the load of B and on the store")
    kk = K // bk * bk
    if K % bk and kk:
        truncated = (a[:, :kk].float() @ b[:kk].float()).to(want.dtype).float()
        if torch.allclose(g, truncated, atol=atol, rtol=rtol):
            return (f"C equals the product over the first {kk} of K={K} only: the last, partial "
                    "K step is missing (loop over range(0, K, BLOCK_K) and mask offs_k < K - k)")
    return ("wrong almost everywhere: check the K loop. Each step must load A[offs_m, k + "
            "offs_k] and B[k + offs_k, offs_n], through the strides (a_ptr + offs_m * "
            "stride_am + offs_k * stride_ak, ...), mask offs_k < K - k, and advance the "
            "pointers by BLOCK_K * stride_ak and BLOCK_K * stride_bk")


def _compare(trial, got, a, b, a0, b0, own) -> None:
    M, N, K = trial.shape
    if not isinstance(got, torch.Tensor):
        trial.problem = f"matmul returned {type(got).__name__} {got!r:.40}, expected a tensor C"
        return
    if tuple(got.shape) != (M, N):
        trial.problem = f"returned shape {tuple(got.shape)}, expected ({M}, {N}): C is M x N"
        return
    if got.dtype != a.dtype:
        trial.problem = (f"returned {_name(got.dtype)} for {_name(a.dtype)} inputs: C must have "
                         "the inputs' dtype (convert the fp32 accumulator at the store)")
        return
    if got.device != a.device:
        trial.problem = f"returned a tensor on {got.device}, the inputs are on {a.device}"
        return
    if not (torch.equal(a, a0) and torch.equal(b, b0)):
        trial.problem = "changed its inputs: A and B must only be read"
        return
    want = mm.matmul_reference(a0, b0)
    atol, rtol = TOLERANCES[trial.dtype]
    scale = max(1.0, math.sqrt(K / 100))
    err = (got.float() - want.float()).abs()
    bad = ~(err <= atol * scale + rtol * want.float().abs())
    if bad.any():
        i, j = (int(x) for x in bad.nonzero()[0])
        trial.problem = (f"{int(bad.sum())} of {M * N} elements of C are off; first C[{i}, {j}]: "
                         f"expected {want[i, j].item():.4g}, got {got[i, j].item():.4g}. "
                         + _hint(got, want, a0, b0, trial.blocks))
        return
    if not any(got.data_ptr() in launch.tensor_ptrs for launch in own):
        trial.problem = ("returned a tensor your kernel was not given: C must be the output "
                         "your kernel writes, not computed some other way")


def _one_trial(fn, namespace, what, shape, dtype, seed, log, blocks, device=None,
               inputs=None, compare=True) -> _Trial:
    trial = _Trial(what, shape, dtype)
    trial.blocks = blocks
    device = device or runtime.device()
    M, N, K = shape
    a, b = inputs if inputs is not None else _layouts(what, M, N, K, dtype, seed, device)
    a0, b0 = a.clone(), b.clone()
    start = len(log.launches)
    got = None
    try:
        got = fn(a, b)
        if a.is_cuda:
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the learner's error, reported
        trial.not_implemented = is_not_implemented(err)
        trial.raised = True
        detail = str(err).strip().splitlines()
        trial.problem = (f"matmul(a, b) raised {type(err).__name__}"
                         + (f": {detail[-1][:300]}" if detail else ""))
    new = log.launches[start:]
    own = [launch for launch in new if launch.defined_in(namespace)]
    trial.own_launches = len(own)
    trial.other_kernels = sorted({f"{launch.module}.{launch.name}" for launch in new
                                  if not launch.defined_in(namespace)})
    for launch in own:
        trial.violations += launch.violations
        trial.blocks = trial.blocks or _blocks_of(launch)
    if trial.problem is None and not own:
        trial.problem = (
            f"matmul launched {', '.join(trial.other_kernels)}, not a kernel defined in your "
            "notebook: write and launch your own @triton.jit kernel" if trial.other_kernels
            else "matmul launched no Triton kernel: it computed C some other way "
                 "(torch.matmul?). Launch your @triton.jit kernel with kernel[grid](...)")
    trial.result = got
    if trial.problem is None and compare:
        _compare(trial, got, a, b, a0, b0, own)
    return trial


class _Battery(Battery):
    """Every call of one ``matmul``: parts 2a-2d and 3 share it."""

    def __init__(self):
        self.plain: list[_Trial] = []
        self.strided: list[_Trial] = []
        self.accumulation: _Trial | None = None
        self.compiled_problem: str | None = None
        self.blocks = None
        self.unguarded: str | None = None     # why loads and stores were not watched

    @property
    def trials(self):
        return self.plain + self.strided + ([self.accumulation] if self.accumulation else [])

    @property
    def correct(self) -> bool:
        return not any(t.problem for t in self.trials) and not self.compiled_problem

    def tested(self, trials) -> str:
        shapes = sorted({t.shape for t in trials})
        dtypes = sorted({_name(t.dtype) for t in trials})
        return (f"{', '.join('x'.join(map(str, s)) for s in shapes)} (M x N x K) in "
                f"{' and '.join(dtypes)}")


def _accumulation_trial(fn, namespace, log, blocks, device=None) -> _Trial:
    """All-positive fp16 inputs and a long K: an fp16 running sum drifts, fp32 does not."""
    bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
    M, N, K = min(bm, 32), min(bn, 32), max(512, 16 * bk)
    g = torch.Generator().manual_seed(44)
    device = device or runtime.device()
    a = torch.rand(M, K, generator=g).to(FP16).to(device)
    b = torch.rand(K, N, generator=g).to(FP16).to(device)
    trial = _one_trial(fn, namespace, "all-positive inputs,", (M, N, K), FP16, 0, log, blocks,
                       device, inputs=(a, b), compare=False)
    got = trial.result
    if trial.problem is None and not (isinstance(got, torch.Tensor) and got.shape == (M, N)
                                      and got.dtype == FP16):
        trial.problem = "matmul did not return an fp16 M x N tensor for fp16 inputs"
    if trial.problem is None:
        trial.worst_ulp = mm.ulp_error(got, a.double() @ b.double()).max().item()
    return trial


_memo: list = []


def _battery(namespace) -> _Battery:
    fn = answer(namespace, "matmul", callable_=True)
    key = (fn, tuple(id(k) for k in bounds.notebook_kernels(namespace).values()))
    for k, result in _memo:
        if k[0] is key[0] and k[1] == key[1]:
            return result
    battery = _Battery()
    battery.unguarded = _unguarded_reason()
    if battery.unguarded:   # GPU mode, the interpreter unusable: the trials run compiled
        watching = contextlib.ExitStack()
        log = watching.enter_context(bounds.watch(guard=False))
    else:
        watching = contextlib.ExitStack()
        watching.enter_context(bounds.interpreted(namespace))
        log = watching.enter_context(bounds.watch(guard=True))
    with watching:
        first = _one_trial(fn, namespace, "contiguous", (3, 5, 7), FP16, 0, log, None)
        battery.plain.append(first)
        battery.blocks = first.blocks
        if not first.not_implemented:
            for dtype in DTYPES:
                for i, shape in enumerate(shapes_for(battery.blocks)):
                    battery.plain.append(_one_trial(fn, namespace, "contiguous", shape, dtype,
                                                    100 + i, log, battery.blocks))
            bm, bn, bk = battery.blocks or (DEFAULT_BLOCK,) * 3
            for i, kind in enumerate(("A transposed, B every other column", "B transposed")):
                battery.strided.append(_one_trial(fn, namespace, kind, (bm + 3, bn + 1, bk + 5),
                                                  FP16, 200 + i, log, battery.blocks))
            battery.accumulation = _accumulation_trial(fn, namespace, log, battery.blocks)
    if runtime.is_gpu() and battery.correct and not battery.violations:
        battery.compiled_problem = _compiled_run(fn, namespace, battery.blocks)
    _memo[:] = [(key, battery)]
    return battery


def _unguarded_reason() -> str | None:
    """Why this GPU machine cannot watch the kernel's loads and stores, or ``None``.

    The watch runs the kernel in Triton's interpreter. Triton < 3.7's interpreter stops on
    any kernel with a loop under NumPy >= 2.4 (see :func:`helpers.runtime.check_versions`);
    the course's pinned versions do not have that problem, a hand-made environment may.
    """
    if not runtime.is_gpu():
        return None
    import numpy
    import triton

    version = runtime._version_tuple
    if version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 4):
        return (f"this machine's Triton {triton.__version__} interpreter cannot run kernels "
                f"with loops under NumPy {numpy.__version__}, so loads and stores could not "
                "be watched here (the other parts ran compiled). Grade with the course's "
                "environment (./course env: Triton 3.7.1) or in CPU mode")
    return None


def _compiled_run(fn, namespace, blocks) -> str | None:
    """GPU mode: the kernel compiled (the interpreter is lenient), larger odd shapes, bf16 too."""
    with bounds.watch(guard=False) as log:
        for i, dtype in enumerate((FP16, BF16, FP32)):
            for j, kind in enumerate(("contiguous", "A transposed, B every other column")):
                try:
                    trial = _one_trial(fn, namespace, kind, (1000 + i, 517, 999), dtype,
                                       500 + 10 * i + j, log, blocks, "cuda")
                except Exception as err:  # noqa: BLE001
                    return f"compiled on the GPU: {type(err).__name__}: {err}"
                if trial.problem:
                    return f"compiled on the GPU, {trial.where}: {trial.problem}"
        trial = _accumulation_trial(fn, namespace, log, blocks, "cuda")
        if trial.problem:
            return f"compiled on the GPU, {trial.where}: {trial.problem}"
        if trial.worst_ulp is not None and trial.worst_ulp > ACC_ULP_LIMIT:
            return (f"compiled on the GPU, the fp16 result is {trial.worst_ulp:.1f} ulp from the "
                    "exact product: accumulate in fp32")
    return None


def _first_failure(trials) -> tuple[_Trial, str] | None:
    failed = [t for t in trials if t.problem]
    if not failed:
        return None
    t = failed[0]
    more = f" ({len(failed)} of {len(trials)} calls failed)" if len(failed) > 1 else ""
    return t, f"{t.where}: {t.problem}{more}"


def _plain(ns):
    part = "2a matmul is right"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    failure = _first_failure(battery.plain)
    if failure:
        return Feedback(part, False, failure[1])
    if battery.compiled_problem and not battery.compiled_problem.endswith("accumulate in fp32"):
        return Feedback(part, False, battery.compiled_problem)
    blocks = battery.blocks
    return Feedback(part, True, f"matches the reference on {battery.tested(battery.plain)}"
                    + (f" (blocks {'x'.join(map(str, blocks))})" if blocks else ""))


def _strided(ns):
    part = "2b strided inputs"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    failure = _first_failure(battery.strided)
    if failure:
        t, text = failure
        if not _first_failure(battery.plain) and "are off" in (t.problem or ""):
            text += (". Contiguous inputs work, views do not: index A and B through the strides "
                     "passed in (stride_am, stride_ak, stride_bk, stride_bn), never assume a "
                     "row is K or N elements long")
        return Feedback(part, False, text)
    return Feedback(part, True, "right on a transposed A, a B of every other column and a "
                    "transposed B")


def _in_bounds(ns):
    part = "2c the kernel stays in bounds"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if battery.unguarded:
        return Feedback(part, False, battery.unguarded, status="error")
    if not battery.ran_own_kernel:
        return Feedback(part, False, f"no kernel of yours ran, so nothing to check: "
                        f"{battery.trials[0].problem}")
    crashed = [t for t in battery.crashed if t.own_launches]
    if crashed and not battery.violations:
        return Feedback(part, False, f"your kernel stopped with an error, so its loads and "
                        f"stores could not all be watched: {crashed[0].where}: "
                        f"{crashed[0].problem}")
    if battery.violations:
        t, v = battery.violations[0]
        shapes = sorted({t.shape for t, _ in battery.violations})
        return Feedback(part, False, f"at {t.where}, {v.describe()}. Out-of-bounds accesses "
                        f"happened for (M, N, K) = {', '.join(map(str, shapes))}: mask every "
                        "load and the store on all the edges they can cross: rows (offs_m < M), "
                        "columns (offs_n < N) and the K tail (offs_k < K - k)")
    return Feedback(part, True, f"every load and store stayed inside A, B and C on "
                    f"{battery.tested(battery.trials)}")


def _fp32_accumulation(ns):
    part = "2d accumulates in fp32"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    t = battery.accumulation
    if t is None or t.problem:
        return Feedback(part, False, "needs a kernel that runs and is right on its inputs: "
                        + (t.problem if t is not None else battery.trials[0].problem or ""))
    if t.worst_ulp > WRONG_ULP:
        return Feedback(part, False, f"at {t.where} the result is up to {t.worst_ulp:,.0f} ulp "
                        "from the exact product: that is a wrong result, not a rounding one. "
                        "Make part 2a pass first")
    if t.worst_ulp > ACC_ULP_LIMIT:
        return Feedback(part, False, f"at {t.where} the result is up to {t.worst_ulp:.1f} units "
                        "in the last place (ulp) from the exact product; rounding an fp32 sum "
                        "once gives at most 0.5. Keep the running sum in fp32: acc = tl.zeros("
                        "(BLOCK_M, BLOCK_N), dtype=tl.float32), acc = tl.dot(a, b, acc), and "
                        "convert to the output dtype only at the store")
    if battery.compiled_problem and battery.compiled_problem.endswith("accumulate in fp32"):
        return Feedback(part, False, battery.compiled_problem)
    return Feedback(part, True, f"within {t.worst_ulp:.2f} ulp of the exact product at "
                    f"K={t.shape[2]} (fp32 accumulation, one rounding)")


# ------------------------------------------------------------------------------------
# Part 3 (GPU): speed at 4096^3 fp16, side by side with torch.matmul.
# ------------------------------------------------------------------------------------


# Random inputs at n = 4096 give |C| up to about 350: a correct fp16 kernel lands a few
# fp16 steps (0.25 each up there) from torch.matmul's differently ordered sum.
SPEED_ATOL, SPEED_RTOL = 0.5, 0.02


def measure_speed(fn, n: int = SPEED_N, dtype=FP16) -> dict:
    """Time ``fn`` and ``torch.matmul`` on the same random n x n inputs (GPU)."""
    from .. import bench

    runtime.require_gpu("timing a matmul")
    a, b = _random(n, n, n, dtype, 900, "cuda")
    with gpu_lock():
        c, want = fn(a, b).float(), torch.matmul(a, b).float()
        ok = torch.allclose(c, want, atol=SPEED_ATOL, rtol=SPEED_RTOL)
        err = (c - want).abs().max().item()
        yours = bench.time_ms(lambda: fn(a, b))
        cublas = bench.time_ms(lambda: torch.matmul(a, b))
    flops = mm.flops(n, n, n)
    return {"ok": ok, "max_abs_error": err, "yours_ms": yours, "cublas_ms": cublas, "ratio": cublas / yours,
            "yours_tflops": bench.tflops(flops, yours),
            "cublas_tflops": bench.tflops(flops, cublas),
            "gpu": torch.cuda.get_device_name()}


def _speed(ns):
    part = f"3 speed at {SPEED_N}^3 fp16"
    battery = _battery(ns)
    if battery.not_implemented:
        return not_implemented(part)
    if not battery.correct or battery.violations:
        return Feedback(part, False, "needs a correct, in-bounds kernel first (parts 2a-2d)")
    t = measure_speed(answer(ns, "matmul", callable_=True))
    if not t["ok"]:
        return Feedback(part, False, f"matmul is wrong at {SPEED_N}^3 fp16 on the GPU: up to "
                        f"{t['max_abs_error']:.3g} from torch.matmul (allowed: {SPEED_ATOL} + "
                        f"{SPEED_RTOL:.0%} of the value)")
    text = (f"on {t['gpu']}: yours {t['yours_tflops']:,.0f} TFLOP/s, torch.matmul "
            f"{t['cublas_tflops']:,.0f}: {t['ratio']:.2f}x (the goal is {SPEED_GOAL:.0%})")
    if t["ratio"] >= SPEED_GOAL:
        return Feedback(part, True, text)
    return Feedback(part, False, f"{text}. Large tiles (128 x 128 or 128 x 256, BLOCK_K 64), "
                    "num_warps=8 and num_stages=3 or 4 get there on an H100; lesson 04's "
                    "knob table shows each effect")


# ------------------------------------------------------------------------------------
# The assignment, and the calls the notebook makes.
# ------------------------------------------------------------------------------------

ASSIGNMENT = Assignment(
    name="04_tiling",
    title="A tiled matmul",
    parts=(
        Part("1a", "tile intensity", 1, _intensity, ("tile_intensity",)),
        Part("1b", "SRAM per program", 1, _sram, ("tile_sram_bytes",)),
        Part("2a", "matmul is right", 4, _plain, ("matmul",), group="kernel"),
        Part("2b", "strided inputs", 2, _strided, ("matmul",), group="kernel"),
        Part("2c", "the kernel stays in bounds", 2, _in_bounds, ("matmul",), group="kernel"),
        Part("2d", "accumulates in fp32", 2, _fp32_accumulation, ("matmul",), group="kernel"),
        Part("3", f"speed at {SPEED_N}^3 fp16", 3, _speed, ("matmul",), gpu=True,
             group="kernel"),
    ),
)


def check_napkin_math(namespace: dict | None = None):
    """Part 1: ``tile_intensity`` and ``tile_sram_bytes``."""
    return run_checks(ASSIGNMENT, ("1a", "1b"), caller_namespace(namespace))


def check_kernel(namespace: dict | None = None):
    """Part 2: ``matmul`` on awkward shapes, strided inputs, bounds and fp32 accumulation."""
    _memo.clear()   # the learner may have edited the kernel since the last call
    return run_checks(ASSIGNMENT, ("2a", "2b", "2c", "2d"), caller_namespace(namespace))


def check_speed(namespace: dict | None = None):
    """Part 3: speed against torch.matmul at 4096^3 fp16 (GPU mode; pending on a CPU)."""
    return run_checks(ASSIGNMENT, ("3",), caller_namespace(namespace))
