"""The answer key of assignment 08 (a Mixture-of-Experts layer): part 3's expected padding.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). The sizes are the grader's (``PADDING_SIZES``, in
:mod:`.moe_blocks`); every value is computed here, never typed in. Parts 1, 2 and 4 grade
functions against the course's reference implementation and rules, and need no key.

A router that picks each token's ``top_k`` experts as a uniformly random set gives one
expert a copy of a token with probability ``top_k / E``, independently across tokens: its
count is Binomial(tokens, top_k / E), and its empty slots are ``(-count) mod block_m``. The
expected empty slots of the whole layout is E times one expert's expectation (linearity;
the experts' counts are dependent, their expectations add all the same).
"""

from __future__ import annotations

import math

from .moe_blocks import PADDING_SIZES

TOLERANCE = 1e-5             # exact arithmetic; a simulation of 10^6 routings is off by ~1e-3


def _probabilities(tokens: int, p: float, poisson: bool = False) -> list[float]:
    """P(count = n) for n = 0 .. tokens, in log space (no overflow at thousands of tokens)."""
    if p >= 1.0:
        return [float(n == tokens) for n in range(tokens + 1)]
    if poisson:
        mean = tokens * p
        return [math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
                for n in range(tokens + 1)]
    return [math.exp(math.lgamma(tokens + 1) - math.lgamma(n + 1) - math.lgamma(tokens - n + 1)
                     + n * math.log(p) + (tokens - n) * math.log1p(-p))
            for n in range(tokens + 1)]


def _padding(tokens, experts, top_k, block_m, rest=lambda n, b: -n % b, p=None,
             poisson=False) -> float:
    probs = _probabilities(tokens, top_k / experts if p is None else p, poisson)
    return experts * sum(q * rest(n, block_m) for n, q in enumerate(probs))


def answer_key() -> dict:
    """``{part/i: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    values = {}
    for part, sizes in PADDING_SIZES.items():
        for i, (T, E, k, bm) in enumerate(sizes):
            mean = T * k / E
            slips = [
                (_padding(T, E, k, bm, poisson=True), "you take the count to be Poisson: a "
                 "token either sends a copy to the expert or not, a finite number of times"),
                (E * (-mean % bm), "you take the padding of the average count: the padding "
                 "is not linear in the count, average the padding itself"),
                (E * (-round(mean) % bm), "you take the padding of the average count: the "
                 "padding is not linear in the count, average the padding itself"),
                (E * (bm - 1) / 2, "you assume the last block is half empty on average"),
                (_padding(T, E, k, bm, rest=lambda n, b: b - n % b), "you count a whole empty "
                 "block for an expert whose count is a multiple of block_m (or zero): it has no "
                 "empty slot"),
                (_padding(T, E, k, bm) / E, "you give one expert's padding: the layout has E "
                 "experts"),
                (_padding(T, E, k, bm, p=1 / E), "you let each token choose one expert: it "
                 "chooses top_k distinct ones"),
            ]
            value = _padding(T, E, k, bm)
            kept = []
            for wrong, why in slips:      # a slip that gives the right value is no slip here
                if not math.isclose(wrong, value, rel_tol=10 * TOLERANCE) \
                        and all(not math.isclose(wrong, w, rel_tol=10 * TOLERANCE)
                                for w, _ in kept):
                    kept.append((wrong, why))
            values[f"{part}/{i}"] = (value, TOLERANCE, kept)
    return values
