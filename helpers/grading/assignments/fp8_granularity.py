"""Assignment 09, part 1: what scales cost, and the cheapest granularity within an error
budget, each judged on shapes and tensors the grader draws from its seed.

* ``scale_shape_for(shape, granularity)`` and ``scale_overhead(shape, granularity)``: one
  scale per group, partial groups at the edges included; the scales' fp32 bytes over the
  FP8 tensor's bytes.
* ``pick_granularity(x, budget)``: among the granularities whose quantisation (lesson 09's,
  ``amax / 448`` per group, round to nearest e4m3) keeps ``||q * s - x|| / ||x||`` within
  the budget, the one with the fewest scales (a tie: the smaller error). Which is cheapest
  depends on the shape. The budgets are drawn clear of every granularity's error (5%), so
  a learner's own quantisation in any precision gets the same answer.
"""

from __future__ import annotations

import math
import random

import torch

from ...feedback import Feedback, not_implemented
from ..registry import SEED, MissingAnswer, call_on_draws

GRANULARITIES = ("tensor", "row", "1x128", "128x128")
GROUP = 128
SCALE_BYTES = 4                  # fp32 scales
DRAWS = 12


# ------------------------------------------------------------------------------------
# Part 1: functions of shapes and tensors, judged on the grader's draws.
# ------------------------------------------------------------------------------------

def _shape_draws(seed: int) -> list[tuple[tuple[int, int], str]]:
    """Shapes from one row to LLM sizes, on and off the 128 grid, each granularity."""
    rng = random.Random(seed)
    out = [((rng.randint(1, 9000), rng.randint(1, 20000)), g) for g in GRANULARITIES
           for _ in range(2)]
    edges = [((1, 1), "128x128"), ((128, 128), "1x128"), ((129, 257), "128x128"),
             ((4096, 128 * rng.randint(1, 64)), "1x128")]
    return out + edges


def true_scale_shape(shape, granularity) -> tuple[int, int]:
    M, K = shape
    gm, gk = {"tensor": (M, K), "row": (1, K), "1x128": (1, GROUP),
              "128x128": (GROUP, GROUP)}[granularity]
    return (-(-M // gm), -(-K // gk))


def true_overhead(shape, granularity) -> float:
    rows, cols = true_scale_shape(shape, granularity)
    return SCALE_BYTES * rows * cols / (shape[0] * shape[1])


def _plain(v):
    if isinstance(v, (bool, str)) or v is None:
        return v if not isinstance(v, str) else v[:80]
    if isinstance(v, (tuple, list, torch.Size)):
        return [_plain(x) for x in v][:4]
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return repr(v)[:60]


def _run(ns, name, calls) -> dict:
    return call_on_draws(ns, name, calls, _plain)


def _values(raw, part):
    if raw.get("not_implemented"):
        return None, not_implemented(part)
    if raw.get("missing"):
        raise MissingAnswer(raw["missing"])
    return raw.get("values") or {}, None


def _got(values, i):
    return values.get(i, values.get(str(i)))


def _collect_shapes(ns, seed):
    return _run(ns, "scale_shape_for", _shape_draws(seed))


def _judge_shapes(raw) -> Feedback:
    part = "1a scale_shape_for"
    values, early = _values(raw, part)
    if early is not None:
        return early
    for i, (shape, g) in enumerate(_shape_draws(raw.get(SEED, 0))):
        got, want = _got(values, i), true_scale_shape(shape, g)
        call = f"scale_shape_for({shape}, {g!r})"
        if isinstance(got, str) and got.startswith("raised"):
            return Feedback(part, False, f"{call} {got}")
        if not isinstance(got, list) or len(got) != 2:
            return Feedback(part, False, f"{call} returned {got!r:.60}: give (rows, columns)")
        if tuple(int(v) for v in got if isinstance(v, (int, float))) == want:
            continue
        gm, gk = {"tensor": shape, "row": (1, shape[1]), "1x128": (1, GROUP),
                  "128x128": (GROUP, GROUP)}[g]
        floor = (shape[0] // gm, shape[1] // gk)
        hint = ("a partial group at the edge needs its own scale too: round the count of "
                "groups up" if tuple(got) == floor else
                "one scale per group: how many groups fit down the rows, and along a row?")
        return Feedback(part, False, f"{call}: wrong. {hint}")
    return Feedback(part, True, f"the scale tensor's shape on {DRAWS} shapes of the grader's")


def _collect_overhead(ns, seed):
    return _run(ns, "scale_overhead", _shape_draws(seed))


def _judge_overhead(raw) -> Feedback:
    part = "1b scale_overhead"
    values, early = _values(raw, part)
    if early is not None:
        return early
    for i, (shape, g) in enumerate(_shape_draws(raw.get(SEED, 0))):
        got, want = _got(values, i), true_overhead(shape, g)
        call = f"scale_overhead({shape}, {g!r})"
        if isinstance(got, str):
            return Feedback(part, False, f"{call} {got}")
        if not isinstance(got, float) or not math.isfinite(got):
            return Feedback(part, False, f"{call} returned {got!r:.60}: a fraction")
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        for factor, words in ((1 / SCALE_BYTES, "a scale is an fp32 number: 4 bytes, not 1"),
                              (SCALE_BYTES, "an FP8 value is 1 byte; a scale 4"),
                              (2, "the FP8 tensor holds 1 byte a value, not 2 (bf16's)")):
            if math.isclose(got, want * factor, rel_tol=1e-6):
                return Feedback(part, False, f"{call}: {words}")
        return Feedback(part, False, f"{call}: wrong: the scales' bytes over the FP8 tensor's")
    return Feedback(part, True, f"the scales' cost on {DRAWS} shapes of the grader's")


# Part 1c: tensors with outliers of the kinds real activations have.
KINDS = ("calm", "outlier channels", "outlier tokens", "one spike", "zero rows")


def _tensor_draws(seed: int) -> list[tuple[str, tuple[int, int], float]]:
    rng = random.Random(seed)
    kinds = list(KINDS) + [rng.choice(KINDS[1:3])]
    return [(k, (rng.choice((128, 200, 384)), rng.choice((256, 512, 700))),
             10 ** rng.uniform(2, 5)) for k in kinds]


def drawn_tensor(kind: str, shape, size: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    M, K = shape
    if kind == "outlier channels":
        x[:, torch.randperm(K, generator=g)[:3]] *= size
    elif kind == "outlier tokens":
        x[torch.randperm(M, generator=g)[:2]] *= size
    elif kind == "one spike":
        x[int(torch.randint(M, (1,), generator=g)), int(torch.randint(K, (1,), generator=g))] = size
    elif kind == "zero rows":
        x[::3] = 0
    return x


def quantization_error(x: torch.Tensor, granularity: str) -> float:
    """``||dequantised - x|| / ||x||`` of e4m3 with ``amax / 448`` scales (lesson 09's)."""
    from ...kernels import fp8

    q, s = fp8.quantize_reference(x, granularity)
    back = fp8.dequantize(q, s, granularity)
    return ((back - x.double()).norm() / x.double().norm()).item()


def _budget_and_answer(x, seed) -> tuple[float, str, dict]:
    """A budget no granularity's error sits within 5% of, and the cheapest that meets it."""
    errors = {g: quantization_error(x, g) for g in GRANULARITIES}
    cost = {g: math.prod(true_scale_shape(tuple(x.shape), g)) for g in GRANULARITIES}
    levels = sorted(set(round(e, 12) for e in errors.values()))
    rng = random.Random(seed)
    for _ in range(50):
        lo = rng.choice(levels)
        budget = lo * (1.05 + rng.random() * 0.5)
        if all(abs(budget - e) > 0.05 * e for e in errors.values()):
            break
    ok = [g for g in GRANULARITIES if errors[g] <= budget]
    best = min(ok, key=lambda g: (cost[g], errors[g]))
    return budget, best, errors


def _collect_pick(ns, seed):
    calls = []
    for i, (kind, shape, size) in enumerate(_tensor_draws(seed)):
        x = drawn_tensor(kind, shape, size, seed + i)
        calls.append((x, _budget_and_answer(x, seed + i)[0]))
    return _run(ns, "pick_granularity", calls)


def _judge_pick(raw) -> Feedback:
    part = "1c pick_granularity"
    values, early = _values(raw, part)
    if early is not None:
        return early
    seed = raw.get(SEED, 0)
    for i, (kind, shape, size) in enumerate(_tensor_draws(seed)):
        x = drawn_tensor(kind, shape, size, seed + i)
        budget, best, errors = _budget_and_answer(x, seed + i)
        got = _got(values, i)
        call = f"pick_granularity(<{kind}, {shape[0]} x {shape[1]}>, budget={budget:.4g})"
        if isinstance(got, str) and got.startswith("raised"):
            return Feedback(part, False, f"{call} {got}")
        if got not in GRANULARITIES:
            return Feedback(part, False, f"{call} returned {got!r:.60}: one of {GRANULARITIES}")
        if got == best:
            continue
        cost = {g: math.prod(true_scale_shape(shape, g)) for g in GRANULARITIES}
        if errors[got] > budget:
            return Feedback(part, False, f"{call}: {got!r} misses the budget on this tensor "
                            "(quantise with amax / 448 per group, round to nearest e4m3, and "
                            "compare ||dequantised - x|| / ||x||)")
        if cost[got] > cost[best]:
            return Feedback(part, False, f"{call}: {got!r} meets the budget, but another "
                            "granularity does too with fewer scales (count them for this "
                            "shape: the order is not the same for every shape)")
        return Feedback(part, False, f"{call}: a tie in scale bytes goes to the smaller error")
    return Feedback(part, True, f"the cheapest granularity within budget on "
                    f"{len(_tensor_draws(seed))} tensors of the grader's ({', '.join(KINDS)})")
