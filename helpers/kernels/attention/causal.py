"""Which key tiles a block of query rows visits, for the kernels that walk K/V tiles past
a resident Q tile (the split-head forward of :mod:`.forward_split` and the dQ kernel of
:mod:`.backward`).

Query ``i`` sees key ``j`` when ``j <= i + diag``: ``diag`` is 0 aligned at the top left,
``seq_k - seq_q`` at the bottom right. A program of ``BLOCK_M`` rows from ``first_row`` walks
keys in ``BLOCK_N`` tiles, in two loops:

* ``0 .. unmasked_end``: whole tiles every row of the block sees entirely (non-causal:
  every whole tile), run without a mask;
* ``unmasked_end .. stop``: the diagonal band and the sequence's last, partial tile, run
  masked element by element. The tiles past ``stop`` are hidden from every row of the
  block and never loaded.

:mod:`.forward` writes the same lines out inline: lesson 06 hides them as the learner's
exercise.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_tile_range(first_row, seq_k, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr):
    """``(unmasked_end, stop)`` for the block of query rows ``first_row ..``."""
    full_tiles_end = (seq_k // BLOCK_N) * BLOCK_N              # keys in whole K tiles
    if CAUSAL:
        # The band starts at the first row's last visible key, in whole tiles; the block's
        # last row sees keys up to first_row + BLOCK_M - 1 + diag.
        band = tl.maximum(first_row + diag, 0) // BLOCK_N * BLOCK_N
        unmasked_end = tl.minimum(band, full_tiles_end)
        stop = tl.minimum(tl.maximum(first_row + BLOCK_M + diag, 0), seq_k)
    else:
        unmasked_end = full_tiles_end
        stop = seq_k
    return unmasked_end, stop
