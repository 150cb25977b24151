"""The answer key of assignment 08 (a Mixture-of-Experts layer): part 3's padding numbers.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). The routing is the one the notebook shows
(``PADDING_COUNTS``, in the assignment module); every value comes from the course's napkin
math (:func:`helpers.intensity.padding_rows`, :func:`~helpers.intensity.tiles_per_expert`),
never typed in. Parts 1, 2 and 4 grade functions against the course's reference
implementation and need no key.
"""

from __future__ import annotations

from ... import intensity
from .moe import PADDING_BLOCK_M, PADDING_COUNTS

ROWS_TOLERANCE = 1e-3        # a count of rows: exact
FRACTION_TOLERANCE = 0.02


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    counts, bm = PADDING_COUNTS, PADDING_BLOCK_M
    rows = sum(counts)
    tiles = sum(intensity.tiles_per_expert(counts, bm))
    padding = intensity.padding_rows(counts, bm)
    empty = sum(c == 0 for c in counts)
    whole = sum(c > 0 and c % bm == 0 for c in counts)
    values = {"3a": (padding, ROWS_TOLERANCE, [
        (tiles, "you count tiles, not rows: each tile computes BLOCK_M rows"),
        (tiles * bm, "you count every row the tiles compute: the real rows among them are not "
                     "padding"),
        (padding + bm * empty, "you give each empty expert a tile of padding: an expert with no "
                               "rows owns no tile"),
        (padding + bm * whole, "you give an expert whose rows fill whole tiles a tile of "
                               "padding: BLOCK_M - count % BLOCK_M is BLOCK_M there, not 0"),
        (padding + bm * (empty + whole), "you add BLOCK_M - count % BLOCK_M for every expert: "
                                         "that is BLOCK_M, not 0, for an empty expert and for "
                                         "one whose rows fill whole tiles"),
        (-(-rows // bm) * bm - rows, "you round the total number of rows up to whole tiles "
                                     "once: each expert's rows start a tile of their own, so "
                                     "each expert's count is rounded up on its own"),
        (sum(c % bm for c in counts), "you count the real rows of each expert's last tile: "
                                      "padding is the rest of that tile")])}
    fraction = padding / (rows + padding)
    values["3b"] = (fraction, FRACTION_TOLERANCE, [
        (padding / rows, "you divide by the real rows: the fraction is of every row the tiles "
                         "compute, real rows and padding"),
        (100 * fraction, "you give a percentage: give a fraction between 0 and 1"),
        (1 - fraction, "you give the fraction of the computed rows that is useful: the "
                       "question asks for the padding's")])
    return values
