"""Checks for the FP8 lesson's predictions: a format's largest value and its spacing, and
what a scale tensor costs. Expected values come from the formats themselves
(:mod:`helpers.kernels.fp8.formats`, torch's ``finfo``) and the granularity's group shape,
never from a typed-in number; a classic slip gets a message that names it."""

from __future__ import annotations

from ..feedback import Feedback, check_number
from ..kernels import fp8


def check_largest(answer, fmt: str = "e4m3") -> Feedback:
    """Prediction: the largest finite value of ``fmt``."""
    f = fp8.format_of(fmt)
    ieee_top = 2.0 ** (2 ** (f.exponent_bits - 1) - 1) * (2 - 2.0 ** -f.mantissa_bits)
    slip = ("the top exponent is kept for inf and NaN, as in IEEE formats (and e5m2); e4m3fn "
            "keeps it for numbers and gives up only S.1111.111 to NaN") if f.name == "e4m3" \
        else "you counted the top exponent as a number's"
    return check_number(f"largest {f.name}", answer, f.max, rel=1e-6, mistakes=[(ieee_top, slip)],
        hint=f"{f.exponent_bits} exponent bits with bias 2^{f.exponent_bits - 1} - 1, and "
             f"{f.mantissa_bits} mantissa bits")


def check_relative_step(answer, fmt: str = "e4m3") -> Feedback:
    """Prediction: the gap between 1 and the next larger ``fmt`` value."""
    f = fp8.format_of(fmt)
    return check_number(f"{f.name} step after 1", answer, f.relative_spacing, rel=1e-6,
                        mistakes=[(f.relative_spacing / 2,
                                   "you gave the worst rounding error, half a step")],
                        hint="how many values does the mantissa have between 1 and 2?")


def check_scale_bytes(answer, shape, granularity: str) -> Feedback:
    """Prediction: the bytes of fp32 scales that ``granularity`` adds to a ``shape`` tensor."""
    count = 1
    for n in fp8.scale_shape(granularity, shape):
        count *= n
    gm, gk = fp8.group_shape(granularity, shape)
    return check_number(f"scale bytes, {granularity} of {tuple(shape)}", answer, 4 * count,
                        unit="B", mistakes=[(count, "you counted the scales, not their bytes "
                                                    "(each is an fp32 number)"),
                                            (4 * shape[0] * shape[1] / (gm * gk),
                                             "the edges' partial groups need a scale too")],
                        hint="one scale per group, partial groups at the edges included")
