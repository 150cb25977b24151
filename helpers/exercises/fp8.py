"""Checks for the FP8 lesson's predictions: a format's largest value and its spacing, what a
scale tensor costs, the bytes a fresh amax adds, which scaling survives outliers, which
operands show the tensor cores' short accumulator, and how much faster FP8 ran than bf16.

Expected values come from the formats themselves (:mod:`helpers.kernels.fp8.formats`,
torch's ``finfo``), the granularity's group shape, a table a cell computed or the ``fp8``
record, never from a typed-in number. A prediction is checked before the cell that prints
the answer, so a wrong one gets the classic slip it matches, or a direction, never the
expected value; a right one gets the numbers behind it."""

from __future__ import annotations

from ..feedback import Feedback, _number, _read_number, _scale_slip, choice_word
from ..kernels import fp8

SCALINGS = ("tensor", "row", "block")


def _close(value: float, expected: float, rel: float) -> bool:
    """Within ``rel`` of ``expected`` (relative to the expected value, not the larger)."""
    return abs(value - expected) <= rel * abs(expected)


def predicted_number(part: str, got, expected: float, *, rel: float = 1e-6, unit: str = "",
                     mistakes=(), hint: str = "", why: str = "") -> Feedback:
    """A predicted number: right within ``rel``; else the slip of ``mistakes`` it matches
    (``(value, description)`` pairs), or too high / too low, never the expected value.
    ``why`` is said only to a right answer."""
    u = f" {unit}" if unit else ""
    value = _read_number(part, got, unit)
    if isinstance(value, Feedback):
        return value
    if _close(value, expected, rel):
        return Feedback(part, True, f"{_number(value)}{u} is right. {why}".strip())
    for wrong, description in mistakes:
        if not _close(wrong, expected, rel) and _close(value, wrong, rel):
            return Feedback(part, False, f"{_number(value)}{u} is what you get if {description}")
    way = "too high" if value > expected else "too low"
    text = f"{_number(value)}{u} is {way} (the tolerance is {rel:.3g} relative)."
    text += _scale_slip(lambda v: _close(v, expected, rel), value)
    if hint:
        text += f" Hint: {hint}"
    return Feedback(part, False, text)


def predicted_choice(part: str, got, expected: str, options: tuple[str, ...],
                     slips: dict[str, str], why: str = "") -> Feedback:
    """One of ``options``: a wrong one gets its slip from ``slips`` (never the expected
    option); a right one gets ``why``."""
    if got is None or got is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {options}",
                        status="not implemented")
    answer = choice_word(got)
    if answer not in options:
        return Feedback(part, False, f"answer with one of {options}, got {got!r}")
    if answer == expected:
        return Feedback(part, True, f"{answer!r} is right. {why}".strip())
    return Feedback(part, False, f"{answer!r} is not it: {slips.get(answer, 'look again')}")


# --------------------------------------------------------------------------------------
# The formats and their scales.
# --------------------------------------------------------------------------------------


def check_largest(answer, fmt: str = "e4m3") -> Feedback:
    """Prediction: the largest finite value of ``fmt``."""
    f = fp8.format_of(fmt)
    bias = 2 ** (f.exponent_bits - 1) - 1
    largest_mantissa = 2 - 2.0 ** -f.mantissa_bits
    if f.name == "e4m3":        # the slip: the top exponent kept for inf and NaN
        slip = (2.0 ** bias * largest_mantissa, "the top exponent is kept for inf and NaN, as "
                "in IEEE formats (and e5m2); e4m3fn keeps it for numbers and gives up only "
                "S.1111.111 to NaN")
    else:                       # the slip: the top exponent counted as a number's
        slip = (2.0 ** (bias + 1) * largest_mantissa, "you counted the top exponent as a "
                "number's: in e5m2, as in IEEE formats, it holds inf and NaN")
    return predicted_number(
        f"largest {f.name}", answer, f.max, mistakes=[slip],
        hint=f"{f.exponent_bits} exponent bits with bias 2^{f.exponent_bits - 1} - 1, and "
             f"{f.mantissa_bits} mantissa bits")


def check_relative_step(answer, fmt: str = "e4m3") -> Feedback:
    """Prediction: the gap between 1 and the next larger ``fmt`` value."""
    f = fp8.format_of(fmt)
    return predicted_number(f"{f.name} step after 1", answer, f.relative_spacing,
                            mistakes=[(f.relative_spacing / 2,
                                       "you gave the worst rounding error, half a step"),
                                      (1 + f.relative_spacing,
                                       "you gave the next value, not the gap to it")],
                            hint="how many values does the mantissa have between 1 and 2?")


def check_scale_bytes(answer, shape, granularity: str) -> Feedback:
    """Prediction: the bytes of fp32 scales that ``granularity`` adds to a ``shape`` tensor."""
    count = 1
    for n in fp8.scale_shape(granularity, shape):
        count *= n
    gm, gk = fp8.group_shape(granularity, shape)
    return predicted_number(f"scale bytes, {granularity} of {tuple(shape)}", answer, 4 * count,
                            unit="B", mistakes=[(count, "you counted the scales, not their bytes "
                                                        "(each is an fp32 number)"),
                                                (4 * shape[0] * shape[1] / (gm * gk),
                                                 "the edges' partial groups need a scale too")],
                            hint="one scale per group, partial groups at the edges included")


def amax_bytes(shape, delayed: bool = False, in_bytes: int = 2) -> int:
    """DRAM bytes of quantising a ``shape`` tensor (``in_bytes`` per value) to FP8 with one
    scale: read it for the amax, read it again to divide, write one byte a value; a delayed
    scale (last step's amax) skips the first read. The scale's own 4 bytes aside."""
    n = shape[0] * shape[1]
    return (1 if delayed else 2) * in_bytes * n + n


def check_amax_bytes(answer, shape) -> Feedback:
    """Prediction: the bytes a per-tensor quantisation of a bf16 ``shape`` tensor moves with
    a fresh amax."""
    n = shape[0] * shape[1]
    return predicted_number(
        f"bytes of a per-tensor quantisation of bf16 {tuple(shape)}", answer, amax_bytes(shape),
        unit="B", rel=0.01,
        mistakes=[(amax_bytes(shape, delayed=True), "you read x once: the scale needs the "
                   "amax of the whole tensor before the first value can be divided, so a fresh "
                   "scale reads x a second time (one read is the delayed scale's count)"),
                  (2 * 2 * n + 2 * n, "the output took 2 bytes a value: FP8 is one byte"),
                  (2 * 2 * n, "you counted the two reads of x and forgot the write of q")],
        hint="reads of x (2 bytes a value) and the write of q (1 byte a value)")


# --------------------------------------------------------------------------------------
# Accuracy: which scaling survives outlier channels.
# --------------------------------------------------------------------------------------


def most_accurate(table: list[dict]) -> str:
    """The scaling (per tensor, per row, block) with the smallest error at the table's
    largest outliers (:func:`helpers.experiments.fp8.accuracy_table`'s rows)."""
    worst = max(table, key=lambda r: r["outlier_scale"])
    return min(SCALINGS, key=lambda s: worst["errors"][s])


def check_most_accurate(answer, table: list[dict]) -> Feedback:
    """Prediction: at the largest outliers, which scaling gives the most accurate product?
    ``"tensor"``, ``"row"`` or ``"block"``."""
    worst = max(table, key=lambda r: r["outlier_scale"])
    errs = ", ".join(f"{s} {worst['errors'][s]:.3g}" for s in SCALINGS)
    slips = {
        "row": "a row of x is a token, and an outlier channel is a column: it sits in every "
               "token's row, so every row's amax is still the outlier's, as with one scale for "
               "the whole tensor",
        "tensor": "one scale for the whole tensor is set by its largest value: the outliers "
                  "push every other value toward FP8's zero band",
        "block": "a 1 x 128 block that holds an outlier channel loses its other values as the "
                 "whole tensor does; count how many blocks the outlier channels can spoil",
    }
    return predicted_choice(f"most accurate at {worst['outlier_scale']:g}x outliers", answer,
                            most_accurate(table), SCALINGS, slips,
                            f"Relative errors at {worst['outlier_scale']:g}x: {errs}.")


# --------------------------------------------------------------------------------------
# The tensor cores' sum: which operands show the short accumulator.
# --------------------------------------------------------------------------------------

EXPOSES = ("mixed", "positive", "neither")


def lost_bits(rec, factor: float = 2.0) -> str:
    """The operands (``"mixed"`` or ``"positive"`` signs) whose unpromoted error grows most
    over the promoted one at the record's largest K, or ``"neither"`` when promotion cuts
    neither error by ``factor``."""
    every = rec.results["config"]["promote_every"]
    top = max(r["K"] for r in rec.results["accumulation"])
    ratio = {r["signs"]: r["errors"]["never promoted"] / r["errors"][f"promoted every {every}"]
             for r in rec.results["accumulation"] if r["K"] == top}
    best = max(ratio, key=ratio.get)
    return best if ratio[best] >= factor else "neither"


def check_lost_bits(answer, rec) -> Feedback:
    """Prediction: which operands does promotion help most at long K, ``"mixed"`` signs,
    all ``"positive"``, or ``"neither"``?"""
    every = rec.results["config"]["promote_every"]
    top = max(r["K"] for r in rec.results["accumulation"])
    why = "; ".join(f"{r['signs']} signs: never promoted {r['errors']['never promoted']:.3g}, "
                    f"promoted every {every} {r['errors'][f'promoted every {every}']:.3g}"
                    for r in rec.results["accumulation"] if r["K"] == top)
    slips = {
        "mixed": "terms of mixed signs cancel, so the running sum stays about sqrt(K) terms "
                 "large and each new term keeps most of its bits beside it",
        "positive": "in this record promotion helps the other operands more; compare the two "
                    "panels after this cell",
        "neither": "an accumulator of about 14 bits drops the low bits of every small term "
                   "added to a large sum; the promotion exists because that adds up",
    }
    return predicted_choice(f"operands that expose the accumulator at K = {top:,}", answer,
                            lost_bits(rec), EXPOSES, slips,
                            f"In the record ({rec.gpu}), at K = {top:,}: {why}.")


# --------------------------------------------------------------------------------------
# Speed: FP8 beside bf16.
# --------------------------------------------------------------------------------------


def check_fp8_speedup(answer, rec, shape) -> Feedback:
    """Prediction: how many times faster than bf16 ``torch.matmul`` did our FP8 matmul
    (per-tensor scales) run at ``shape``? Within 10%."""
    from ..hardware import lookup
    from ..plots import fp8 as plots

    value = plots.speedup(rec, shape)
    if value is None:
        return Feedback("FP8 over bf16", False, "the record lacks one of the two versions at "
                        f"{tuple(shape)}", status="error")
    gpu = lookup(rec.gpu)
    roofs = gpu.peak("fp8") / gpu.peak("bf16")
    M, N, K = shape
    return predicted_number(
        f"FP8 over bf16 at {M}x{N}x{K} (times)", answer, value, rel=0.1,
        mistakes=[(roofs, "the datasheet's two roofs set the speed: a kernel reaches a "
                          "different share of each, and the table after this cell shows which"),
                  (1 / value, "you divided FP8's time by bf16's: a speed-up is the bf16 "
                              "time over the FP8 one"),
                  (2 * roofs, "you counted the tensor cores' rate and the halved bytes both: a "
                              "large matmul is compute-bound, and only the rate counts")],
        hint="a large matmul is compute-bound: which roof does each version run under, and "
             "how close does it get?",
        why=f"Recorded on {rec.gpu}: {value:.3g}x (the datasheet roofs: {roofs:.3g}x).")
