"""Checks for lesson 00 (start here): predictions made before the answer prints.

How many programs a launch starts, the least time a large vector add can take at the
table's bandwidth, and what fraction of that bandwidth a tiny one reaches (from the
``vector_add`` record). A wrong prediction is told what it overlooked, never the value, so
the learner can try again; :func:`predicted_number` does that for lesson 01's checks too.
"""

from __future__ import annotations

import math

from .. import hardware
from ..dtypes import element_size
from ..feedback import Feedback, _read_number, _scale_slip


def predicted_number(part: str, got, expected: float, *, rel: float | None = 0.02,
                     factor: float | None = None, unit: str = "",
                     mistakes: list[tuple[float, str]] = (), high: str = "",
                     low: str = "", fraction: bool = False) -> Feedback:
    """A prediction against ``expected``, which the message never shows.

    Right when within ``rel`` (relative) or, for order-of-magnitude guesses, within
    ``factor`` times either way. A value matching one of ``mistakes`` (``(value,
    description)``) names the mistake; otherwise the message says too high or too low, and
    what a prediction on that side overlooks (``high``, ``low``). A ``fraction`` must lie
    between 0 and 1 (a percentage is named as one).
    """
    u = f" {unit}" if unit else ""
    if fraction and (got is None or got is Ellipsis):
        return Feedback(part, False, "no answer yet: set it to a fraction between 0 and 1",
                        status="not implemented")
    value = _read_number(part, got, unit)
    if isinstance(value, Feedback):
        return value
    if fraction and not 0 < value <= 1:
        what = ("looks like a percentage: answer as a fraction (0.5 for 50%)" if 1 < value <= 100
                else "is not a fraction: answer between 0 and 1")
        return Feedback(part, False, f"{value:g} {what}")

    def close(v: float, target: float) -> bool:
        if factor is not None:
            return v > 0 and target > 0 and abs(math.log(v / target)) <= math.log(factor)
        return math.isclose(v, target, rel_tol=rel or 0.0) or v == target

    shown = f"{value:,.0f}" if value == int(value) and abs(value) < 1e7 else f"{value:.4g}"
    if close(value, expected):
        return Feedback(part, True, f"{shown}{u} is right")
    for wrong, description in mistakes:
        if math.isclose(value, wrong, rel_tol=0.02 if rel is None else rel) or value == wrong:
            return Feedback(part, False, f"{shown}{u} is what you get if {description}")
    side = "high" if value > expected else "low"
    why = high if side == "high" else low
    text = f"{shown}{u} is too {side}" + (f": {why}" if why else "")
    text += "" if text.endswith(("?", ".")) else "."
    if factor is None:  # a slip of scale (bits, a unit prefix) only means something for units
        text += _scale_slip(lambda v: close(v, expected), value)
    return Feedback(part, False, text)


def check_program_count(answer, n: int, block: int) -> Feedback:
    """Prediction: how many programs does a 1-D launch over ``n`` elements start, with
    ``block`` elements per program?"""
    expected = -(-n // block)
    mistakes = [(n * block, "you multiplied: each program covers BLOCK_SIZE elements, so "
                            "divide n by it"),
                (block / n, "you divided the block by n; it is the other way round")]
    if n % block:
        mistakes.insert(0, (n // block, "you rounded down: the last, partial block needs a "
                                        "program of its own (its mask stops it at the end)"))
    return predicted_number(
        f"programs for n = {n:,}, BLOCK_SIZE = {block:,}", answer, expected, rel=0.0,
        unit="programs", mistakes=mistakes,
        high="each program handles a whole block: count the blocks that cover n",
        low="every element needs a program: count the blocks that cover n, the last one "
            "partly filled")


def check_least_time_us(answer, n: int, dtype, gpu: str = "H100-SXM") -> Feedback:
    """Prediction: the least time, in µs, of ``c = a + b`` over ``n`` elements of ``dtype``
    at the table's bandwidth for ``gpu`` (bytes moved / bandwidth; the addition is free)."""
    spec = hardware.lookup(gpu)
    s = element_size(dtype)
    bw = spec.hbm_bandwidth_gbs * 1e9
    expected = 3 * n * s / bw * 1e6
    return predicted_number(
        f"least time of a vector add of {n:,} elements on the {spec.name}", answer, expected,
        rel=0.03, unit="µs",
        mistakes=[(2 * n * s / bw * 1e6, "you counted the two reads but not the write of c"),
                  (n * s / bw * 1e6, "you counted one tensor; a, b and c all cross the bus"),
                  (3 * n / bw * 1e6, "you counted elements, not bytes"),
                  (3 * n * s * 8 / bw * 1e6, "you counted bits, not bytes")],
        high="count the bytes (two reads and one write, each element's size) and divide by "
             "the bandwidth in bytes per second",
        low="every element of a, b and c crosses between HBM and the chip once: count all "
            "three")


def check_tiny_fraction(answer, nbytes: int, ms: float, gpu: str = "H100-SXM") -> Feedback:
    """Prediction: the fraction (0 to 1) of ``gpu``'s peak bandwidth that a tiny vector add,
    measured moving ``nbytes`` in ``ms``, reached. Within a factor of 3 counts: the point is
    the order of magnitude (a launch this small costs a few µs, more or less from run to run)."""
    part = "fraction of the peak bandwidth, tiny vector add"
    spec = hardware.lookup(gpu)
    at_peak_us = nbytes / (spec.hbm_bandwidth_gbs * 1e9) * 1e6
    expected = nbytes / (ms * 1e-3) / (spec.hbm_bandwidth_gbs * 1e9)
    return predicted_number(
        part, answer, expected, rel=None, factor=3.0, fraction=True,
        high=f"at the peak its {nbytes / 1024:g} KiB would take {at_peak_us:.2g} µs, but every "
             "launch has a fixed cost of microseconds (start the programs, wait for the last), "
             "whatever its size",
        low="the fixed cost of a launch is microseconds, not milliseconds: divide the bytes by "
            "a few µs")
