"""Checks for lesson 03 (vector add): predictions made before the measured run prints.

Each check reads the run the notebook passes in (the committed GPU record in CPU mode, a
live measurement in GPU mode). A wrong prediction is told what it overlooked, never the
measured value, so the learner can think again before the reveal.
"""

from __future__ import annotations

import math

from .. import hardware
from ..feedback import Feedback, choice_word

FRACTION_TOLERANCE = 0.05      # absolute: within 5 percentage points of the measured fraction
TIME_TOLERANCE = 0.35          # relative: the small-vector time, within 35 %
SMALL_N = 2**16                # "small": the sizes up to this one, all latency-bound
SAME_WITHIN = 0.05             # "same": the two times within 5 % of each other
SPEEDS = ("faster", "slower", "same")


def _rows(run, dtype: str) -> list[dict]:
    rows = [r for r in run.results["sizes"] if r["dtype"] == dtype]
    if not rows:
        raise KeyError(f"the run has no {dtype} rows; it has "
                       f"{sorted({r['dtype'] for r in run.results['sizes']})}")
    return rows


def _row(run, n: int, dtype: str) -> dict:
    return next(r for r in _rows(run, dtype) if r["n"] == n)


def small_time_us(run, dtype: str = "fp16") -> tuple[float, list[dict]]:
    """The median time (µs) of one add over the run's sizes up to ``SMALL_N``, and those rows.

    A median of the latency-bound sizes, not the smallest alone: one launch that happened
    to wait (a clock ramping up, another process) does not move it."""
    rows = sorted((r for r in _rows(run, dtype) if r["n"] <= SMALL_N), key=lambda r: r["n"])
    times = sorted(r["triton_ms"] * 1e3 for r in rows)
    mid = len(times) // 2
    return (times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2), rows


def _number(answer, part: str, what: str) -> float | Feedback:
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: {what}", status="not implemented")
    try:
        value = math.nan if isinstance(answer, (bool, str)) else float(answer)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        return Feedback(part, False, f"expected a number ({what}), got {answer!r}")
    return value


def measured_fraction(run, dtype: str = "fp16", n: int | None = None) -> float:
    """The fraction of the table's peak bandwidth the run's add reached at ``n`` elements
    (default: the run's largest size)."""
    row = _row(run, run.results["big_n"] if n is None else n, dtype)
    return row["triton_gbps"] / hardware.lookup(run.gpu).hbm_bandwidth_gbs


def check_fraction_of_peak(answer, run, dtype: str = "fp16", n: int | None = None) -> Feedback:
    """Prediction: the fraction (0 to 1) of the table's peak bandwidth that the course's add
    reaches at ``n`` elements (default: the largest size of ``run``)."""
    big = run.results["big_n"]
    n = big if n is None else n
    part = f"fraction of peak, {dtype} add at 2^{n.bit_length() - 1}"
    value = _number(answer, part, "a fraction of the table's peak bandwidth, between 0 and 1")
    if isinstance(value, Feedback):
        return value
    outside = ("looks like a percentage: answer as a fraction (0.5 for 50%)" if 1 < value <= 100
               else "is not a fraction: no kernel moves more than the peak, so the answer lies "
                    "between 0 and 1" if not 0 < value <= 1 else "")
    if outside:
        return Feedback(part, False, f"{value:g} {outside}")
    frac = measured_fraction(run, dtype, n)
    if abs(value - frac) <= FRACTION_TOLERANCE:
        return Feedback(part, True, f"{value:g} is within {FRACTION_TOLERANCE:g} of the "
                        f"measured {frac:.3f}")
    if value > frac:
        why = ("no streaming kernel moves data at the datasheet rate: the plain copy printed "
               "above is the practical ceiling")
        if n < big:
            why += ("; and at this size the launch floor (lesson 02) still adds its few "
                    "microseconds to the bytes' time")
    elif n < big:
        why = ("at this size the bytes take several times the launch floor: the add streams "
               "at about the plain copy's rate, and the floor costs only a slice of the time")
    else:
        why = ("at this size a vector add streams long, contiguous blocks with wide loads: it "
               "gets about as close to the peak as the plain copy printed above")
    return Feedback(part, False, f"{value:g} is too {'high' if value > frac else 'low'}: {why}.")


def check_time_us(answer, run, n: int, dtype: str = "fp32") -> Feedback:
    """Prediction: the time, in microseconds, of one add of ``n`` elements: the launch floor
    and the bytes' time both count where neither dwarfs the other."""
    row = _row(run, n, dtype)
    measured = row["triton_ms"] * 1e3
    part = f"time of an {dtype} add of 2^{n.bit_length() - 1} elements"
    value = _number(answer, part, "a time in microseconds")
    if isinstance(value, Feedback):
        return value
    if abs(value - measured) <= TIME_TOLERANCE * measured:
        return Feedback(part, True, f"{value:g} µs is within {TIME_TOLERANCE:.0%} of the "
                        f"measured {measured:.3g} µs")
    if value > measured:
        why = ("too high: the bytes take a few microseconds at the table's bandwidth, and the "
               "launch a few more (lesson 02's floor)")
    else:
        bytes_us = row["bytes"] / (hardware.lookup(run.gpu).hbm_bandwidth_gbs * 1e9) * 1e6
        floor_us = small_time_us(run, dtype)[0]
        why = ("too low: that is about the bytes' time at full bandwidth alone; every launch "
               "also pays a fixed floor (lesson 02)" if abs(value - bytes_us) <= abs(value - floor_us)
               else "too low: that is about the launch floor alone; at this size the bytes "
                    "take a few microseconds more")
    return Feedback(part, False, f"{value:g} µs is off: {why}.")


def _versus_row(run, dtype: str, block_size: int | None) -> dict:
    """The run's row at its largest size: the size sweep's (the default block size), or the
    block-size sweep's row for ``block_size``."""
    if block_size is None:
        return _row(run, run.results["big_n"], dtype)
    row = next((r for r in run.results.get("blocks", [])
                if r["dtype"] == dtype and r["block_size"] == block_size), None)
    if row is None:
        raise KeyError(f"the run has no {dtype} row with BLOCK_SIZE {block_size}; its block "
                       f"sizes: {sorted({r['block_size'] for r in run.results.get('blocks', [])})}")
    return row


def versus_torch(run, dtype: str = "fp16", block_size: int | None = None) -> str:
    """``"faster"``, ``"slower"`` or ``"same"``: the run's Triton add against torch.add at
    its largest size (same: within ``SAME_WITHIN``), with the default block size or, given
    ``block_size``, that many elements per program."""
    row = _versus_row(run, dtype, block_size)
    ratio = row["torch_ms"] / row["triton_ms"]        # > 1: Triton is faster
    if abs(ratio - 1) <= SAME_WITHIN:
        return "same"
    return "faster" if ratio > 1 else "slower"


def check_versus_torch(answer, run, dtype: str = "fp16", block_size: int | None = None) -> Feedback:
    """Prediction: is the course's Triton add ``"faster"`` or ``"slower"`` than torch.add at
    the largest size, or the ``"same"`` (within 5 %)? With ``block_size``: the add launched
    with that many elements per program (a row of the run's block-size sweep)."""
    block = "" if block_size is None else f" with BLOCK_SIZE {block_size}"
    part = (f"Triton{block} against torch.add, {dtype} at "
            f"2^{run.results['big_n'].bit_length() - 1}")
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {SPEEDS}",
                        status="not implemented")
    got = choice_word(answer)
    if got not in SPEEDS:
        return Feedback(part, False, f"answer with one of {SPEEDS}, got {answer!r}")
    expected = versus_torch(run, dtype, block_size)
    if got == expected:
        if expected == "same":
            return Feedback(part, True, f"{got!r} is right: both move the same bytes through "
                            "the same memory")
        return Feedback(part, True, f"{got!r} is right: the bytes are the same, but how many "
                        "each thread keeps in flight is not")
    if expected == "same":
        why = ("both read A and B and write C once, and both are memory-bound: neither has "
               "anything left to gain but bandwidth, and both get nearly all of it")
    elif block_size is not None and expected == "slower":
        per_thread = max(1, block_size // 128)   # Triton's default: 4 warps, 128 threads
        why = ("the same bytes do not mean the same speed. With Triton's default 128 threads "
               f"per program, a block of {block_size} gives each thread {per_thread} "
               f"element{'s' if per_thread > 1 else ''} per operand: narrow loads, too few "
               "bytes in flight to keep the memory busy" if got == "same" else
               "more programs do not make the memory faster; what matters is how many bytes "
               "each thread asks for at once, and with this block each asks for little")
    else:
        why = f"the measured gap is larger than {SAME_WITHIN:.0%}: look again at block sizes"
    return Feedback(part, False, f"{got!r} is not it: {why}.")
