"""Checks for lesson 04 (tiling): predictions made before a table or a record prints.

Each check answers a wrong prediction with what it overlooked, never with the value, so
the learner can try again; a right one gets the value and the reason. Expected answers
come from the napkin math (:mod:`helpers.intensity`, :mod:`helpers.tile_plan`) or from
the record the notebook passes in (the ladder's rows).
"""

from __future__ import annotations

import math

from .. import dtypes, intensity, tile_plan
from ..feedback import Feedback, _read_number
from ..kernels.matmul.config import TileConfig, shared_memory_limit
from ..plots import tiling as tiling_plots


def _number(part: str, answer, unit: str) -> float | Feedback:
    """``answer`` as a finite float, or the Feedback saying why it is not one."""
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: replace the ... with your prediction "
                        f"({unit})", status="not implemented")
    if isinstance(answer, str):
        return Feedback(part, False, f"expected a number ({unit}), got {answer!r}")
    return _read_number(part, answer, unit)


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def check_tile_intensity(answer, block_m: int, block_n: int, dtype="fp16") -> Feedback:
    """Prediction: FLOPs per byte loaded of a ``block_m x block_n`` tile (any BLOCK_K)."""
    part = f"intensity of a {block_m}x{block_n} {dtypes.dtype_key(dtype)} tile"
    value = _number(part, answer, "FLOP/byte")
    if isinstance(value, Feedback):
        return value
    s = dtypes.element_size(dtype)
    expected = intensity.tile_intensity(block_m, block_n, 64, dtype)
    if _close(value, expected, 0.02):
        return Feedback(part, True, f"{expected:.3g} FLOP/byte is right: 2·{block_m}·{block_n}"
                        f" FLOPs per ({block_m} + {block_n})·{s} bytes, per unit of BLOCK_K")
    mistakes = [
        (expected / 2, "a multiply-add is 2 FLOPs"),
        (expected * s, f"count bytes, not elements: {s} per {dtypes.dtype_key(dtype)} value"),
        (1 / expected, "FLOPs go on top, bytes below"),
        (min(block_m, block_n) / s, "B/2 holds for a square tile only; this one is not square"),
        (max(block_m, block_n) / s, "B/2 holds for a square tile only; this one is not square"),
    ]
    for wrong, why in mistakes:
        if _close(value, wrong, 0.02):
            return Feedback(part, False, f"not quite: {why}")
    side = "high" if value > expected else "low"
    return Feedback(part, False, f"too {side}: per K step, 2·BLOCK_M·BLOCK_N·BLOCK_K FLOPs for "
                    "a BLOCK_M x BLOCK_K tile of A plus a BLOCK_K x BLOCK_N tile of B")


def check_max_stages(answer, gpu: str, dtype, block_m: int, block_n: int,
                     block_k: int) -> Feedback:
    """Prediction: the most pipeline stages for which the tile still fits in one
    program's shared memory on ``gpu``."""
    part = f"most stages of a {block_m}x{block_n}x{block_k} {dtypes.dtype_key(dtype)} tile"
    value = _number(part, answer, "a number of stages")
    if isinstance(value, Feedback):
        return value
    # One stage of the tile (warps change nothing here); the GPU table's per-program limit.
    tile = TileConfig(block_m, block_n, block_k, num_warps=4, num_stages=1)
    limit, stage = shared_memory_limit(gpu), tile.shared_memory_bytes(dtype)
    expected = limit // stage
    if value == expected:
        return Feedback(part, True, f"{expected} is right: {expected} x {stage / 1024:g} KiB = "
                        f"{expected * stage / 1024:g} KiB of {limit / 1024:g} KiB; one more "
                        "does not fit")
    c_tile = block_m * block_n * dtypes.element_size(dtype)
    if value == (limit - c_tile) // stage:
        return Feedback(part, False, "not quite: the C tile is not in shared memory; the "
                        "accumulator lives in registers")
    if value == limit // (block_m * block_k * 4 + block_k * block_n * 4):
        return Feedback(part, False, f"not quite: the tiles stay {dtypes.dtype_key(dtype)} in "
                        "shared memory; only the accumulator is fp32")
    if value != int(value) or value < 1:
        return Feedback(part, False, "a stage count is a whole number of at least 1")
    side = "many" if value > expected else "few"
    return Feedback(part, False, f"too {side}: one stage holds one A tile and one B tile "
                    "(BLOCK_K values deep), and a program may use the SM's shared memory "
                    "but 1 KiB")


def check_warps_to_avoid_spills(answer, block_m: int, block_n: int) -> Feedback:
    """Prediction: the fewest warps (a power of two) that hold a ``block_m x block_n``
    fp32 accumulator in fewer than 255 registers per thread."""
    part = f"warps for a {block_m}x{block_n} accumulator"
    value = _number(part, answer, "a number of warps")
    if isinstance(value, Feedback):
        return value
    words = block_m * block_n                      # fp32: one register each
    expected = next(w for w in tile_plan.WARP_CHOICES + (32,)
                    if words // (32 * w) < tile_plan.MAX_REGISTERS_PER_THREAD)
    if value == expected:
        return Feedback(part, True, f"{expected} is right: {words:,} fp32 values over "
                        f"{expected} x 32 threads is {words // (32 * expected)} registers each, "
                        f"under the {tile_plan.MAX_REGISTERS_PER_THREAD} limit, with room left "
                        "for addresses and loads")
    if value not in tile_plan.WARP_CHOICES + (32,):
        return Feedback(part, False, "num_warps is a power of two, from 1 to 32")
    if value < expected:
        per = words // (32 * int(value))
        return Feedback(part, False, f"too few: with {int(value)} warps each thread holds {per} "
                        f"accumulator values, one register each; a thread has at most "
                        f"{tile_plan.MAX_REGISTERS_PER_THREAD}")
    return Feedback(part, False, "that avoids spills, but fewer warps already do: a warp is "
                    "32 threads, and each holds one register per fp32 accumulator value")


def rung(ladder: list[dict], step: str, n: int, dtype: str) -> dict:
    """The ladder row of rung ``step`` at ``n``^3 in ``dtype``."""
    for r in ladder:
        if r["step"] == step and r["n"] == n and r["dtype"] == dtype:
            return r
    raise KeyError(f"no rung {step!r} at {n}^3 {dtype} in the record")


GAIN_TOLERANCE = 0.05   # absolute, on a ratio near 1: about the spread of one timing


def check_order_gain(answer, ladder: list[dict], n: int = 4096, dtype: str = "fp16") -> Feedback:
    """Prediction: v3 (grouped order, one stage) over v2 (row-major), a speed ratio."""
    part = f"v3 over v2 at {n}^3 {dtype}"
    value = _number(part, answer, "a speed ratio")
    if isinstance(value, Feedback):
        return value
    if value <= 0:
        return Feedback(part, False, "a speed ratio is positive: v3's TFLOP/s over v2's")
    ratio = rung(ladder, "v3", n, dtype)["tflops"] / rung(ladder, "v2", n, dtype)["tflops"]
    if abs(value - ratio) <= GAIN_TOLERANCE:
        return Feedback(part, True, f"{value:g} is within {GAIN_TOLERANCE} of the recorded "
                        f"{ratio:.2f}")
    if value > ratio:
        return Feedback(part, False, "too high: at this size all of B fits in L2 in either "
                        "order, so DRAM traffic hardly changes; and with one stage each program "
                        "still waits for every load, whichever cache serves it")
    return Feedback(part, False, "too low: the order changes only which tiles run together; "
                    "each program does the same work")


def check_programs_per_sm(answer, occ) -> Feedback:
    """Prediction: how many programs of a compiled kernel one SM runs at once (``occ``: a
    :class:`helpers.compiled.Occupancy`)."""
    part = "programs per SM"
    value = _number(part, answer, "a number of programs")
    if isinstance(value, Feedback):
        return value
    if value == occ.programs_per_sm:
        return Feedback(part, True, f"{occ.programs_per_sm} is right: "
                        f"{tiling_plots.occupancy_line(occ)}")
    without = {"registers": min(occ.by_shared, occ.by_warps, occ.by_blocks),
               "shared memory": min(occ.by_registers, occ.by_warps, occ.by_blocks)}
    for left, v in without.items():
        if value == v != occ.programs_per_sm:
            return Feedback(part, False, f"not quite: you left out the {left}; every limit "
                            "binds")
    side = "many" if value > occ.programs_per_sm else "few"
    return Feedback(part, False, f"too {side}: take the smallest of register file / "
                    "(registers per thread x 32 x warps), shared memory per SM / shared memory "
                    "per program, and resident warps / warps per program")
