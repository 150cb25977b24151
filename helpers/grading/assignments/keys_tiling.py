"""The answer key of assignment 04 (a tiled matmul): every graded number, from the formulas.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). Every value comes from the course's napkin math
(:mod:`helpers.intensity`), never typed in.
"""

from __future__ import annotations

import torch

from ... import intensity

# Part 1: one tile of 64 x 128 outputs, BLOCK_K = 32, bf16, 5 pipeline stages.
TILE = (64, 128, 32)
TILE_DTYPE = torch.bfloat16
TILE_STAGES = 5
INTENSITY = intensity.tile_intensity(*TILE, TILE_DTYPE)
SRAM = intensity.sram_bytes(*TILE, TILE_DTYPE, TILE_STAGES)


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    values = {}
    bm, bn, bk = TILE
    s = TILE_DTYPE.itemsize
    values["1a"] = (INTENSITY, 0.02, [
            (INTENSITY / 2, "you count one FLOP per multiply-add (it is two), or 4 bytes per "
                            "element (bf16 is 2)"),
            (2 * bm * bn * bk / (bm * bk * s), "you count the A tile's bytes only: the B tile "
                                               "is loaded too"),
            (2 * bm * bn * bk / (bn * bk * s), "you count the B tile's bytes only: the A tile "
                                               "is loaded too"),
            (1 / INTENSITY, "you divide bytes by FLOPs: intensity is FLOPs per byte"),
            (INTENSITY / 8, "you count bits, not bytes")])
    bm, bn, bk = TILE
    s = TILE_DTYPE.itemsize
    stage = (bm * bk + bk * bn) * s
    values["1b"] = (SRAM, 0.02, [
            (stage, f"you count one stage: each of the {TILE_STAGES} stages has its own A and "
                    "B tiles"),
            (SRAM + bm * bn * 4, "you add the fp32 accumulator: it lives in registers, not "
                                 "shared memory"),
            (TILE_STAGES * bm * bn * s, "you count a tile of C: the stages hold tiles of A "
                                        "and B"),
            (2 * SRAM, "you use 4 bytes per element: bf16 is 2"),
            (8 * SRAM, "you count bits, not bytes"),
            (SRAM / 1024, "you give KiB; the answer is in bytes")])
    return values
