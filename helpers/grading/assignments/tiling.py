"""Assignment 04, a tiled linear layer designed for the H100: its graded parts and
``check_*`` calls.

The kernel is ``linear(x, weight, bias)``, ``x @ weight.T + bias`` with ``weight`` stored as
``nn.Linear`` keeps it, (out, in): a tiled product the course does not ship (lesson 04's
kernels take B as K x N and add nothing). Every expected value comes from the course's
napkin math (:mod:`keys_tiling` and :mod:`helpers.intensity`), a float reference and the
learner's kernel compiled for the H100 (:mod:`helpers.compiled`); none is typed in.

Parts (27 points; 23 graded in CPU mode, 4 on a GPU):

=====  ==========================================================  ======
1a-1b  napkin math for one tile: intensity, SRAM with 5 stages        2
2a     ``linear`` launches the notebook's kernel and matches the      4
       reference on awkward shapes and edge inputs (fp16 and fp32)
2b     ... on transposed and sliced inputs (strides)                  2
2c     its kernel never reads or writes outside x, W, bias and Y      2
2d     it accumulates in fp32 (errors in units of the last place)     2
3a-3b  the learner's H100 tile (``H100_CONFIG``): its intensity and   2
       SRAM per program, the SRAM also against the compiled kernel
3c     the kernel ``linear`` launches, compiled for sm_90 with that    2
       choice, fits one program's shared memory (227 KiB)
3d     ... its registers do not spill and a program fits an SM        2
4      >= 65 % of F.linear (cuBLAS) at a large fp16 shape (GPU)       4
5a-5b  waves and the setting to launch, from the recorded sweep, on   5
       shapes the grader draws (:mod:`.tiling_waves`)
=====  ==========================================================  ======

The kernel is tested with the learner's own block sizes (read from the launch): the shapes
are chosen around them, so that there are partial tiles on every edge whatever the blocks.
Part 3 needs no GPU: Triton compiles for the H100 on any machine, and the compiled kernel
says how much shared memory and how many registers a program takes.
"""

from __future__ import annotations

import math

import torch

from ...feedback import Feedback, graded_number, not_implemented
from ...kernels import matmul as mm
from . import tiling_waves as waves
from .. import answers, harness
from ..registry import Assignment, Part, answer, check_function
from .tiling_design import (collect_fit, collect_speed, design_intensity, design_sram, fits,
                            registers, speed)

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32

# Part 2.
DTYPES = (FP16, FP32)
# (atol, rtol) for randn inputs with K up to ~100, scaled by sqrt(K / 100) (|C| grows so).
# fp16: one rounding of an fp32 sum; fp32: TF32 on a GPU's tensor cores.
TOLERANCES = {FP16: (2e-2, 2e-3), BF16: (1e-1, 1.6e-2), FP32: (5e-2, 1e-2)}
ACC_ULP_LIMIT = 1.0          # fp32 accumulation stays within ~0.5 ulp of the exact product
WRONG_ULP = 64.0             # beyond this the kernel is wrong, not imprecise
DEFAULT_BLOCK = 32           # if the launch says nothing about the blocks

# Part 1: napkin math for one tile.


# The answers: formulas in keys_tiling (instructor), sealed in a student release.
KEY = answers.load_key("04_tiling", "helpers.grading.assignments.keys_tiling")


def _intensity(ns):
    return graded_number(
        "1a tile intensity", answer(ns, "tile_intensity"), KEY["1a"], unit="FLOP/byte",
        hint="per K step: 2 x BLOCK_M x BLOCK_N x BLOCK_K FLOPs for (BLOCK_M + BLOCK_N) x "
             "BLOCK_K loaded values of 2 bytes.")


def _sram(ns):
    return graded_number(
        "1b SRAM per program", answer(ns, "tile_sram_bytes"), KEY["1b"], unit="bytes",
        hint="stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x 2 bytes.")


# Part 2: the kernel and its launcher.


def _blocks(constexprs: dict) -> tuple[int, int, int] | None:
    c = {k.upper(): v for k, v in (constexprs or {}).items()}
    got = tuple(c.get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    return got if all(isinstance(v, int) and v > 0 for v in got) else None


def shapes_for(blocks) -> list[tuple[int, int, int]]:
    """(M, N, K) around the blocks: partial tiles on every edge, K shorter than a block,
    a single row (M = 1, a matrix-vector product) and a single element."""
    bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
    return [(bm + 1, bn - 1, bk + 3), (2 * bm + 3, bn + 5, 2 * bk + 7), (bm, bn, bk),
            (1, 1, 1), (5, 2 * bn + 1, 3), (1, bn + 1, bk + 1)]


CONTIGUOUS = "contiguous"
STRIDED = ("x transposed, W every other row", "W transposed",
           "x and W cut from wider matrices")
ZERO_ROWS = "x with zero rows"
ACCUMULATION = "all-positive inputs,"
DTYPE_OF = {harness.dtype_name(d): d for d in (FP16, BF16, FP32)}


def exact(x, weight, bias):
    """``x @ weight.T + bias`` in float64."""
    return x.double() @ weight.double().T + bias.double()


class Linear(harness.KernelTask):
    function = "linear"
    call = "linear(x, weight, bias)"
    outputs = ("Y",)
    tensors = "x, W, bias and Y"
    inputs_named = ("x", "W", "bias")
    mask_hint = ("Mask every load and the store on all the edges they can cross: rows "
                 "(offs_m < M), columns (offs_n < N, the bias too) and the K tail "
                 "(offs_k < K - k)")

    @staticmethod
    def case(kind, shape, dtype, compiled=False):
        M, N, K = shape
        name = harness.dtype_name(dtype)
        return harness.Case(f"{kind} M={M}, N={N}, K={K}, {name}",
                            {"kind": kind, "shape": list(shape), "dtype": name}, 0, compiled)

    def first(self):
        return self.case(CONTIGUOUS, (3, 5, 7), FP16)

    def cases(self, constexprs):
        blocks = _blocks(constexprs)
        bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
        out = [self.case(CONTIGUOUS, shape, dtype)
               for dtype in DTYPES for shape in shapes_for(blocks)]
        out += [self.case(kind, (bm + 3, bn + 1, bk + 5), FP16) for kind in STRIDED]
        out.append(self.case(ZERO_ROWS, (bm + 2, bn + 2, bk + 2), FP16))
        out.append(self.accumulation(blocks))
        return out

    def accumulation(self, blocks, compiled=False):
        """All-positive fp16 inputs and a long K: an fp16 running sum drifts, fp32 does not."""
        bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
        return self.case(ACCUMULATION, (min(bm, 32), min(bn, 32), max(512, 16 * bk)), FP16,
                         compiled)

    def compiled_cases(self, constexprs):
        blocks = _blocks(constexprs)
        out = [self.case(kind, (1000 + i, 517, 999), dtype, compiled=True)
               for i, dtype in enumerate((FP16, BF16, FP32)) for kind in (CONTIGUOUS, STRIDED[0])]
        return out + [self.accumulation(blocks, compiled=True)]

    def inputs(self, case, device):
        M, N, K = case.params["shape"]
        dtype, kind = DTYPE_OF[case.params["dtype"]], case.params["kind"]
        g = harness.generator(case.seed)
        if kind == ACCUMULATION:
            x, w = torch.rand(M, K, generator=g), torch.rand(N, K, generator=g)
        elif kind == STRIDED[0]:
            x = torch.randn(K, M, generator=g).t()
            w = torch.randn(2 * N, K, generator=g)[::2]
        elif kind == STRIDED[1]:
            x, w = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g).t()
        elif kind == STRIDED[2]:     # past K, a row holds more numbers: an unmasked tail adds them
            x = torch.randn(M, K + 7, generator=g)[:, :K]
            w = torch.randn(N, K + 5, generator=g)[:, :K]
        else:
            x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
            if kind == ZERO_ROWS:        # those rows of Y are the bias alone
                x[::2] = 0.0
        bias = torch.rand(N, generator=g) if kind == ACCUMULATION else \
            torch.randn(N, generator=g)
        return tuple(t.to(dtype).to(device) for t in (x, w, bias))

    def reference(self, case, inputs):
        x, w, bias = inputs
        return ((x.float() @ w.float().T + bias.float()).to(x.dtype),)

    def compare(self, case, got, want, inputs, blocks):
        if case.params["kind"] == ACCUMULATION:
            return None          # part 2d judges it in units of the last place
        (c,), (w,) = got, want
        M, N, K = case.params["shape"]
        atol, rtol = TOLERANCES[w.dtype]
        scale = max(1.0, math.sqrt(K / 100))
        bad = harness.close_hint(c, w, atol * scale, rtol)
        if bad is None:
            return None
        count, (i, j) = bad
        return (f"{count} of {M * N} elements of Y are off; first Y[{i}, {j}]: expected "
                f"{w[i, j].item():.4g}, got {c[i, j].item():.4g}. "
                + _hint(c, w, *inputs, _blocks(blocks)))

    def summary(self, cases):
        shapes = sorted({tuple(c.params["shape"]) for c in cases})
        dtypes = sorted({c.params["dtype"] for c in cases})
        return (f"{', '.join('x'.join(map(str, s)) for s in shapes)} (M x N x K) in "
                f"{' and '.join(dtypes)}")

    loops = True      # over K: harness.loops_unwatchable says where it cannot be watched


TASK = Linear()


def _hint(got, want, x, weight, bias, blocks) -> str:
    """What a wrong Y's pattern of errors says about the kernel."""
    M, K = x.shape
    N = weight.shape[0]
    bm, bn, bk = blocks or (DEFAULT_BLOCK,) * 3
    g, w = got.float(), want.float()
    if torch.isnan(g).any():
        return ("Y holds NaN: an element no program wrote (torch.empty keeps leftovers; does "
                "the grid cover triton.cdiv(M, BLOCK_M) x triton.cdiv(N, BLOCK_N) tiles?) or a "
                "masked load without other=0.0")
    atol, rtol = TOLERANCES[want.dtype]
    scale = max(1.0, math.sqrt(K / 100))
    product = x.float() @ weight.float().T
    if torch.allclose(g, product, atol=atol * scale, rtol=rtol):
        return "Y is x @ W.T without the bias: add bias[n] to every row of the tile"
    if M <= N and torch.allclose(g, product + bias.float()[:M, None], atol=atol * scale,
                                 rtol=rtol):
        return "the bias goes along the output columns: bias[n] is added to column n of Y"
    a, b = x, weight.T
    bad = ~torch.isclose(g, w, atol=atol * 4, rtol=rtol * 4)
    rows = bad.any(dim=1).nonzero().flatten()
    cols = bad.any(dim=0).nonzero().flatten()
    full_m, full_n = M // bm * bm, N // bn * bn
    # A partial tile is to blame only if the full tiles before it came out right.
    if len(rows) and full_m and rows.min() >= full_m and M % bm:
        return (f"only rows {full_m} and up are wrong, the last partial row of tiles: mask the "
                "rows with offs_m < M on the load of x and on the store, and cover "
                "triton.cdiv(M, BLOCK_M) rows of tiles")
    if len(cols) and full_n and cols.min() >= full_n and N % bn:
        return (f"only columns {full_n} and up are wrong, the last partial column of tiles: "
                "mask the columns with offs_n < N on the loads of W and the bias and on the "
                "store")
    kk = K // bk * bk
    if K % bk and kk:
        truncated = (a[:, :kk].float() @ b[:kk].float() + bias.float()).to(want.dtype).float()
        if torch.allclose(g, truncated, atol=atol, rtol=rtol):
            return (f"Y equals the product over the first {kk} of K={K} only: the last, partial "
                    "K step is missing (loop over range(0, K, BLOCK_K) and mask offs_k < K - k)")
    return ("wrong almost everywhere: check the K loop. Each step must load x[offs_m, k + "
            "offs_k] and W[offs_n, k + offs_k] (W is stored out x in: its K step is "
            "stride_wk, its column step stride_wn), through the strides, mask offs_k < K - k, "
            "and advance both pointers by BLOCK_K along K")


def _collect_kernel(ns, seed):
    return harness.collect(TASK, ns, seed)


def _of(v, kinds, compiled=False):
    return [t for t in v.trials if t.case.params.get("kind") in kinds
            and t.case.compiled == compiled]


def _worst_ulp(trial) -> float:
    return mm.ulp_error(trial.rec["outputs"][0], exact(*TASK.inputs(trial.case, "cpu"))) \
        .max().item()


def _plain(raw):
    part = "2a linear is right"
    v = harness.verdict_of(TASK, raw)
    plain = _of(v, (CONTIGUOUS, ZERO_ROWS))
    fb = v.correctness(part, "", plain)
    if not fb.passed:
        return fb
    compiled = next((t for t in _of(v, (CONTIGUOUS, *STRIDED), compiled=True) if t.problem),
                    None)
    if compiled is not None:
        return Feedback(part, False, f"{compiled.where}: {compiled.problem}")
    blocks = _blocks(v.blocks)
    return Feedback(part, True, f"matches the reference on {TASK.summary([t.case for t in plain])}"
                    + (f" (blocks {'x'.join(map(str, blocks))})" if blocks else ""))


def _strided(raw):
    part = "2b strided inputs"
    v = harness.verdict_of(TASK, raw)
    if v.not_implemented:
        return not_implemented(part)
    failure = v.first_failure(_of(v, STRIDED))
    if failure:
        if not v.first_failure(_of(v, (CONTIGUOUS,))) and "are off" in failure:
            failure += (". Contiguous inputs work, views do not: index x and W through the "
                        "strides passed in (x.stride(0), x.stride(1), weight.stride(0), "
                        "weight.stride(1)), never assume a row is K elements long")
        return Feedback(part, False, failure)
    return Feedback(part, True, "right on a transposed x, a W of every other row, a "
                    "transposed W, and x and W cut from wider matrices")


def _in_bounds(raw):
    return harness.verdict_of(TASK, raw).in_bounds("2c the kernel stays in bounds")


def _fp32_accumulation(raw):
    part = "2d accumulates in fp32"
    v = harness.verdict_of(TASK, raw)
    if v.not_implemented:
        return not_implemented(part)
    trials = _of(v, (ACCUMULATION,)) + _of(v, (ACCUMULATION,), compiled=True)
    if not trials:
        return Feedback(part, False, "needs a kernel that runs and is right on its inputs: "
                        + (v.first_failure() or ""))
    for t in trials:
        if t.problem:
            return Feedback(part, False, "needs a kernel that runs and is right on its inputs: "
                            f"{t.where}: {t.problem}")
        worst = _worst_ulp(t)
        x, w, bias = TASK.inputs(t.case, "cpu")
        if worst > ACC_ULP_LIMIT and mm.ulp_error(t.rec["outputs"][0], exact(
                x, w, torch.zeros_like(bias))).max().item() <= ACC_ULP_LIMIT:
            return Feedback(part, False, f"at {t.where} the result is a wrong result, not a "
                            "rounding one: it is x @ W.T without the bias. Make part 2a pass "
                            "first")
        if worst > WRONG_ULP:
            return Feedback(part, False, f"at {t.where} the result is up to {worst:,.0f} ulp "
                            "from the exact product: that is a wrong result, not a rounding "
                            "one. Make part 2a pass first")
        if worst > ACC_ULP_LIMIT:
            return Feedback(part, False, f"at {t.where} the result is up to {worst:.1f} units "
                            "in the last place (ulp) from the exact product; rounding an fp32 "
                            "sum once gives at most 0.5. Keep the running sum in fp32: acc = "
                            "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), acc = tl.dot(x, w, "
                            "acc), add the bias to it, and convert to the output dtype only at "
                            "the store")
    t = trials[0]
    return Feedback(part, True, f"within {_worst_ulp(t):.2f} ulp of the exact product at "
                    f"K={t.case.params['shape'][2]} (fp32 accumulation, one rounding)")


# The assignment, and the calls the notebook makes.

_FIT_NAMES = ("H100_CONFIG", "linear", "h100_intensity", "h100_sram_bytes")

ASSIGNMENT = Assignment(
    name="04_tiling",
    title="A tiled linear layer designed for the H100",
    parts=(
        Part("1a", "tile intensity", 1, _intensity, ("tile_intensity",)),
        Part("1b", "SRAM per program", 1, _sram, ("tile_sram_bytes",)),
        Part("2a", "linear is right", 4, _plain, ("linear",), group="kernel",
             collect=_collect_kernel),
        Part("2b", "strided inputs", 2, _strided, ("linear",), group="kernel",
             collect=_collect_kernel),
        Part("2c", "the kernel stays in bounds", 2, _in_bounds, ("linear",), group="kernel",
             collect=_collect_kernel),
        Part("2d", "accumulates in fp32", 2, _fp32_accumulation, ("linear",), group="kernel",
             collect=_collect_kernel),
        Part("3a", "intensity of your H100 tile", 1, design_intensity, _FIT_NAMES,
             group="fit", collect=collect_fit),
        Part("3b", "SRAM per program of your H100 tile", 1, design_sram, _FIT_NAMES,
             group="fit", collect=collect_fit),
        Part("3c", "fits the H100's shared memory", 2, fits, _FIT_NAMES, group="fit",
             collect=collect_fit),
        Part("3d", "registers without spills", 2, registers, _FIT_NAMES, group="fit",
             collect=collect_fit),
        Part("4", "speed at a large fp16 shape", 4, speed, ("linear",), gpu=True,
             collect=collect_speed, after="kernel"),
        Part("5a", "waves of a setting", 2, waves.judge_waves, (waves.WAVES,),
             group="waves", collect=waves.collect),
        Part("5b", "the setting to launch", 3, waves.judge_choice, (waves.CHOOSE,),
             group="waves", collect=waves.collect),
    ),
)

check_napkin_math = check_function(ASSIGNMENT, ("1a", "1b"),
    "Part 1: ``tile_intensity`` and ``tile_sram_bytes``.")

check_kernel = check_function(ASSIGNMENT, ("2a", "2b", "2c", "2d"),
    "Part 2: ``linear`` on awkward shapes, strided inputs, bounds and fp32 accumulation.")

check_fit = check_function(ASSIGNMENT, ("3a", "3b", "3c", "3d"),
    "Part 3: ``H100_CONFIG``, your numbers for it, and your kernel compiled for the H100.")

check_speed = check_function(ASSIGNMENT, ("4",),
    "Part 4: speed against F.linear at a large fp16 shape (GPU mode; pending on a CPU).")

check_waves = check_function(ASSIGNMENT, ("5a", "5b"),
    "Part 5: ``waves`` and ``choose_setting`` on shapes the grader draws.")
