"""The answer key of assignment 04 (a tiled matmul): every graded number, from the formulas.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). Every value comes from the course's napkin math
(:mod:`helpers.intensity`), never typed in.
"""

from __future__ import annotations

import torch

from ... import intensity
from .tiling_design import tile_values

# Part 1: one tile of 64 x 128 outputs, BLOCK_K = 32, bf16, 5 pipeline stages.
TILE = (64, 128, 32)
TILE_DTYPE = torch.bfloat16
TILE_STAGES = 5
INTENSITY = intensity.tile_intensity(*TILE, TILE_DTYPE)
SRAM = intensity.sram_bytes(*TILE, TILE_DTYPE, TILE_STAGES)


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    values = tile_values(TILE, TILE_STAGES, TILE_DTYPE)
    assert values["intensity"][0] == INTENSITY and values["sram"][0] == SRAM
    return {"1a": values["intensity"], "1b": values["sram"]}
