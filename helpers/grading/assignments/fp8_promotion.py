"""Assignment 09, part 3c (GPU): how often a long FP8 sum must be promoted into fp32.

Lesson 09 measured that Hopper's FP8 tensor cores sum into an accumulator of fewer bits
than fp32, so a long sum over K drifts (most on all-positive operands, whose sum only
grows), and that ``promote_every=P`` of :func:`helpers.kernels.fp8.scaled_matmul` fixes it
by adding the tensor cores' partial sum into fp32 every ``P`` values of K, at some speed.
``pick_promotion(a, b, a_scale, b_scale, budget)`` returns the cheapest ``P`` of
:data:`PROMOTIONS` (the least promotion: 0, never, is the fastest, then 128, 64, 32) whose
product ``scaled_matmul(a, b, a_scale, b_scale, "tensor", out_dtype=torch.float32,
promote_every=P)`` is within ``budget`` of ``scaled_matmul_reference`` (the float64
product of the dequantised operands), in relative error ``||C - C64|| / ||C64||``.

The grader draws the matmuls from its seed (:func:`promotion_draws`: K from 1,024 to
65,536, M = N small, operands all positive or of mixed signs) and, in the collection,
measures every ``P``'s error itself on the GPU before the learner's function runs. Each
budget sits between two of those errors at least :data:`SEPARATE` apart (their geometric
mean) or well above them all (:func:`budget_for`), so no error lies near it and a learner
who measures the same thing gets the same answer. The judge makes the expected answer
from the error table alone (:func:`cheapest_within`, a pure function).

In the interpreter (CPU mode) every sum is exact fp32 and every ``P`` gives the same
error, so the part is graded on a GPU only.
"""

from __future__ import annotations

import itertools
import math
import random

import torch

from ... import runtime
from ...feedback import Feedback
from ..registry import SEED, call_on_draws
from .fp8_granularity import _got, _plain, _values

PROMOTIONS = (0, 128, 64, 32)    # cheapest first: the fewer promotions, the faster
SEPARATE = 1.5      # two errors closer than this are one level: no budget between them
ABOVE = 4.0         # a budget above every error: this many times the largest
E4M3_MAX = 448.0
SIDES = (256, 384, 512)          # M = N: small, so that the part is quick
K_RANGE = (1024, 65536)
# One matmul a row: its operands' signs, where its budget goes (:func:`budget_for`), and
# the range of log2(K) it is drawn from. The first reaches the K where a positive sum
# drifts far past every promoted error; "loose" asks for no promotion at all.
DRAWS = (("positive", "drift", 14, 16), ("positive", "tight", 10, 16),
         ("positive", "any", 10, 16), ("mixed", "loose", 10, 16),
         ("mixed", "drift", 13, 16), ("mixed", "any", 10, 16))


# ------------------------------------------------------------------------------------
# The draws, the grader's measurements, and the budgets: pure functions of the seed and
# of an error table.
# ------------------------------------------------------------------------------------

def promotion_draws(seed: int) -> list[dict]:
    """The grader's matmuls: ``{"shape": (M, N, K), "signs", "role", "u", "seed"}``."""
    rng = random.Random(seed)
    out = []
    for i, (signs, role, lo, hi) in enumerate(DRAWS):
        side = rng.choice(SIDES)
        K = 128 * round(2 ** rng.uniform(lo, hi) / 128)
        out.append({"shape": (side, side, min(max(K, K_RANGE[0]), K_RANGE[1])),
                    "signs": signs, "role": role, "u": rng.random(),
                    "seed": rng.randrange(2**31)})
    return out


def drawn_operands(shape, signs: str, seed: int, device=None):
    """``(a, b, a_scale, b_scale)``: ``a`` (M, K) and ``b`` (N, K) e4m3 with one fp32 scale
    each (``amax / 448``), from normal values, their magnitudes if ``signs`` is
    ``"positive"``."""
    M, N, K = shape
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    if signs == "positive":
        x, w = x.abs(), w.abs()
    out = []
    for t in (x, w):
        scale = (t.abs().amax() / E4M3_MAX).reshape(1, 1)
        q = (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        out.append((q, scale))
    device = device or runtime.device()
    (a, a_s), (b, b_s) = out
    return a.to(device), b.to(device), a_s.to(device), b_s.to(device)


def promotion_errors(a, b, a_scale, b_scale) -> dict[int, float]:
    """Each ``P``'s relative error against the float64 product of the dequantised operands,
    measured by the course's scaled matmul (on a GPU, its tensor cores)."""
    from ...kernels import fp8

    want = fp8.scaled_matmul_reference(a, b, a_scale, b_scale, "tensor")
    norm = want.norm()
    errors = {}
    for every in PROMOTIONS:
        c = fp8.scaled_matmul(a, b, a_scale, b_scale, "tensor", out_dtype=torch.float32,
                              promote_every=every)
        errors[every] = ((c.double() - want).norm() / norm).item()
    return errors


def separable_budgets(errors: dict) -> list[float]:
    """Budgets no error is near, lowest first: the geometric mean of each two neighbouring
    errors at least :data:`SEPARATE` apart, then :data:`ABOVE` times the largest."""
    levels = sorted(errors.values())
    between = [math.sqrt(lo * hi) for lo, hi in itertools.pairwise(levels)
               if lo > 0 and hi >= SEPARATE * lo]
    return between + [ABOVE * levels[-1]]


def budget_for(errors: dict, role: str, u: float) -> float:
    """The budget of a draw: ``"tight"`` the lowest separable one, ``"drift"`` the highest
    below every error's level (just under the never-promoted drift when it stands apart),
    ``"loose"`` above them all, ``"any"`` one of them chosen by ``u`` in [0, 1)."""
    budgets = separable_budgets(errors)
    between = budgets[:-1] or budgets
    if role == "tight":
        return between[0]
    if role == "drift":
        return between[-1]
    if role == "loose":
        return budgets[-1]
    return budgets[min(int(u * len(budgets)), len(budgets) - 1)]


def cheapest_within(errors: dict, budget: float) -> int | None:
    """The expected answer: the first ``P`` of :data:`PROMOTIONS` whose error is within the
    budget (None if none is)."""
    return next((every for every in PROMOTIONS if errors[every] <= budget), None)


def promotion_mistake(got, errors: dict, budget: float, K: int) -> str | None:
    """What is wrong with answering ``got`` where ``errors`` were measured, in words that
    name the mistake and not the answer; None if ``got`` is the answer."""
    if isinstance(got, str) and got.startswith("raised"):
        return got
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got not in PROMOTIONS:
        return (f"returned {got!r:.60}: not one of (0, 32, 64, 128), the values of K the "
                "tensor cores may sum before each promotion (0: never)")
    got = int(got)
    if got == cheapest_within(errors, budget):
        return None
    if errors[got] > budget:
        if got == 0:
            return (f"returned 0 (never promote) where the sum over K = {K:,} drifts past the "
                    "budget: measure each setting's product against the float64 reference")
        return (f"promoting every {got} values of K still drifts past the budget on these "
                "operands: measure each setting's product against the float64 reference")
    return (f"promote_every={got} meets the budget, but promotes more often than needed: "
            "slower than necessary, when a cheaper setting meets it too")


# ------------------------------------------------------------------------------------
# Collecting (on the GPU, in the learner's process) and judging.
# ------------------------------------------------------------------------------------

def _collect_promotion(ns, seed) -> dict:
    """The grader's error table of every draw first, then the learner's answers."""
    calls, tables = [], []
    for draw in promotion_draws(seed):
        a, b, a_s, b_s = drawn_operands(draw["shape"], draw["signs"], draw["seed"])
        errors = promotion_errors(a, b, a_s, b_s)
        tables.append([errors[every] for every in PROMOTIONS])
        calls.append((a, b, a_s, b_s, budget_for(errors, draw["role"], draw["u"])))
    raw = call_on_draws(ns, "pick_promotion", calls, _plain)
    raw["errors"] = tables
    raw["gpu"] = torch.cuda.get_device_name() if runtime.is_gpu() else "the interpreter"
    return raw


def _judge_promotion(raw) -> Feedback:
    part = "3c pick_promotion"
    values, early = _values(raw, part)
    if early is not None:
        return early
    draws = promotion_draws(raw.get(SEED, 0))
    tables = raw.get("errors")
    if not isinstance(tables, list) or len(tables) != len(draws):
        return Feedback(part, False, "could not be checked: the grader's measurements are "
                        "missing", status="error")
    for i, (draw, row) in enumerate(zip(draws, tables)):
        errors = dict(zip(PROMOTIONS, (float(e) for e in row)))
        budget = budget_for(errors, draw["role"], draw["u"])
        if cheapest_within(errors, budget) is None:
            continue                       # never drawn so; nothing to judge against
        M, _, K = draw["shape"]
        problem = promotion_mistake(_got(values, i), errors, budget, K)
        if problem:
            call = (f"pick_promotion(<{draw['signs']} operands, M = N = {M}, K = {K:,}>, "
                    f"budget={budget:.3g})")
            return Feedback(part, False, f"{call}: {problem}")
    ks = [d["shape"][2] for d in draws]
    return Feedback(part, True, f"the cheapest promotion within budget on {len(draws)} "
                    f"matmuls of the grader's on {raw.get('gpu', 'the GPU')}: K from "
                    f"{min(ks):,} to {max(ks):,}, operands all positive and of mixed signs")
