"""Assignment 03, part 1d: the smallest vector add that reaches a share of a GPU's bandwidth,
by lesson 02's model, on GPUs the grader draws.

Lesson 02's model of a memory-bound kernel: its time is its bytes over the bandwidth plus
the launch floor. A small add spends most of that time in the floor. The learner inverts the
model: ``smallest_add(fraction, itemsize, bandwidth_gbs, floor_us)``, the fewest elements per
vector for which ``C = A + B`` moves its bytes at ``fraction`` of ``bandwidth_gbs`` or more.
The judge checks the property on draws from the grader's seed (the answer reaches the
fraction, one element fewer does not) with the model run forward; no inverse is written here.
"""

from __future__ import annotations

import math
import random

from ...feedback import Feedback, not_implemented
from ..registry import SEED, MissingAnswer, call_on_draws

NAME = "smallest_add"
DRAWS = 10
VECTORS = 3                  # A and B read, C written
ITEMSIZES = (1, 2, 4, 8)     # fp8, fp16/bf16, fp32, fp64
SLACK = 1e-9                 # float rounding at the boundary


def draws(seed: int) -> list[tuple[float, int, float, float]]:
    """``(fraction, itemsize, bandwidth_gbs, floor_us)``: GPUs from a laptop's to past a
    B200's, floors of 1-20 µs, fractions of 5-99 %; and two edges, a fraction one element
    reaches and one that needs hundreds of millions."""
    rng = random.Random(seed)
    out = [(round(rng.uniform(0.05, 0.99), 3), rng.choice(ITEMSIZES),
            round(rng.uniform(200, 9000), 1), round(rng.uniform(1, 20), 2))
           for _ in range(DRAWS - 2)]
    return out + [(1e-6, rng.choice(ITEMSIZES), 3350.0, 2.5), (0.999, 2, 8000.0, 20.0)]


def reached(n: float, itemsize: int, bandwidth_gbs: float, floor_us: float) -> float:
    """The share of ``bandwidth_gbs`` an add of ``n`` elements a vector reaches: lesson 02's
    model, forward (its bytes over bytes / bandwidth + floor, over the bandwidth)."""
    nbytes = VECTORS * n * itemsize
    return nbytes / (nbytes + bandwidth_gbs * 1e9 * floor_us * 1e-6)


def _plain(v):
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return v
    try:
        as_float = float(v)
    except (TypeError, ValueError, OverflowError):
        return repr(v)[:60]
    return as_float


def collect(ns, seed) -> dict:
    """In the learner's process: the function on the draws of ``seed``, as plain data."""
    return call_on_draws(ns, NAME, draws(seed), _plain)


def _slip(n: float, fraction, itemsize, bandwidth_gbs, floor_us) -> str:
    """What an answer off the mark says, in words that give no value away."""
    def hits(m):
        return reached(m, itemsize, bandwidth_gbs, floor_us) >= fraction * (1 - SLACK) and (
            m <= 1 or reached(m - 1, itemsize, bandwidth_gbs, floor_us) < fraction)
    scaled = {VECTORS * itemsize: "elements, not bytes: your answer is in bytes",
              1 / (VECTORS * itemsize): "elements, not bytes: you divided the bytes twice",
              VECTORS / 2: "the write of C crosses the bus too: count all three vectors",
              1e3: "mind the units: GB/s is 10^9 bytes a second, µs 10^-6 s",
              1e-3: "mind the units: GB/s is 10^9 bytes a second, µs 10^-6 s"}
    for factor, words in scaled.items():
        m = n / factor
        if m >= 1 and any(hits(c) for c in (math.floor(m), math.ceil(m))):
            return words
    share = reached(n, itemsize, bandwidth_gbs, floor_us)
    if share < fraction * (1 - SLACK):
        return (f"the model gives {share:.1%} of the bandwidth there, short of "
                f"{fraction:.4g}: more elements are needed")
    return (f"one element fewer already reaches {fraction:.4g} of the bandwidth: the answer is "
            "the smallest count that does")


def judge(part):
    """The judge of 1d: every draw of the grader's seed answered by the smallest count."""
    def verdict(raw) -> Feedback:
        if raw.get("not_implemented"):
            return not_implemented(part)
        if raw.get("missing"):
            raise MissingAnswer(raw["missing"])
        values = raw.get("values") or {}
        for i, (fraction, itemsize, bw, floor) in enumerate(draws(raw.get(SEED, 0))):
            got = values.get(i, values.get(str(i)))
            call = f"{NAME}({fraction:g}, {itemsize}, {bw:g}, {floor:g})"
            if isinstance(got, str) and got.startswith("raised"):
                return Feedback(part, False, f"{call} {got}")
            if not isinstance(got, (int, float)):
                return Feedback(part, False, f"{call} returned {got!r:.60}: the answer is a "
                                "whole number of elements")
            if not math.isfinite(got) or got != int(got) or got < 1:
                return Feedback(part, False, f"{call} returned {got!r:.60}: the answer is a "
                                "whole number of elements, at least 1 (round up: a fraction "
                                "of an element is not an element)")
            n = int(got)
            if reached(n, itemsize, bw, floor) >= fraction * (1 - SLACK) and (
                    n == 1 or reached(n - 1, itemsize, bw, floor) < fraction * (1 + SLACK)):
                continue
            return Feedback(part, False, f"{call}: {_slip(n, fraction, itemsize, bw, floor)}")
        return Feedback(part, True, f"the smallest add on each of {DRAWS} GPUs, floors and "
                        "shares of the grader's drawing")
    return verdict
