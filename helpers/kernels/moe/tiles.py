"""The grouped GEMMs' shared pieces: which row tile belongs to which expert, the tuners'
row buckets, how a setting is named and the interpreter's one setting (:mod:`.grouped`'s
cp.async kernels and :mod:`.grouped_tma`'s TMA-fed ones both build on them)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..matmul.config import TILE_KEYS, TileConfig

# How a setting of the grouped GEMM is named: lesson 04's tile and order, warps, stages.
KEYS = (*TILE_KEYS, "num_warps", "num_stages")

# The interpreter's one small setting (CPU mode), for every grouped kernel.
CPU_CONFIG = TileConfig(16, 32, 32, num_warps=4, num_stages=1)


def bucket(n: int) -> int:
    """Rows rounded up to a power of two (at least 16): the tuners' key."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def expert_of_tile(tile, counts_ptr, E, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row tile ``tile`` of the grouped problem: its expert and its rows ``[start, end)``.

    Expert ``e`` owns ``cdiv(counts[e], BLOCK_M)`` consecutive row tiles; the tiles of
    the experts before it come first. A tile past the last real one gets ``start >=
    end`` (its program has nothing to do).
    """
    e = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + e, mask=e < E, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M            # 0 for an expert with no rows
    tiles_end = tl.cumsum(tiles, axis=0)                  # first tile *after* expert e
    expert = tl.sum((tiles_end <= tile).to(tl.int32), axis=0)
    before = e < expert
    first_tile = tl.sum(tl.where(before, tiles, 0), axis=0)
    expert_start = tl.sum(tl.where(before, counts, 0), axis=0)     # = offsets[expert]
    expert_rows = tl.sum(tl.where(e == expert, counts, 0), axis=0)
    start = expert_start + (tile - first_tile) * BLOCK_M
    end = expert_start + expert_rows
    return expert, start, end
