"""Lesson 08's planted mistakes: the Mixture-of-Experts solution with one slip each.

Weights not renormalised, offsets off by one expert, trailing empty experts lost by
bincount, a capacity that keeps the earliest tokens rather than the first choices, copies
dropped past the capacity without a -1, an empty expert that takes a
tile, tiles that straddle experts, padding rows stored, a launcher that computes with
torch, padding counted in tiles or as a fraction of the real rows. Each plant is made from
solutions/08_moe.ipynb (a replacement that no longer applies fails loudly) and graded by
tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

TILES = """\
    tiles = (counts + BLOCK_M - 1) // BLOCK_M               # an empty expert owns no tile
    first_tile = tl.cumsum(tiles, axis=0) - tiles           # of each expert
    first_row = tl.cumsum(counts, axis=0) - counts          # = offsets[e]
    mine = (first_tile <= tile) & (tile < first_tile + tiles)   # one expert, or none
    expert = tl.sum(tl.where(mine, e, 0), axis=0)
    start = tl.sum(tl.where(mine, first_row + (tile - first_tile) * BLOCK_M, 0), axis=0)
    end = tl.sum(tl.where(mine, first_row + counts, 0), axis=0)   # none: start = end = 0
"""
# Tiles laid over the sorted rows as one matrix, each with the expert of its first row.
STRADDLING = """\
    first_row = tl.cumsum(counts, axis=0) - counts
    start = tile * BLOCK_M
    mine = (first_row <= start) & (start < first_row + counts)
    expert = tl.sum(tl.where(mine, e, 0), axis=0)
    end = tl.minimum(tl.sum(counts, axis=0), start + BLOCK_M)
"""
TORCH = ("    return torch.cat([a[s:s + n] @ w[e] for e, (s, n) in enumerate(zip(\n"
         "        (torch.cumsum(counts, 0) - counts).tolist(), counts.tolist()))])\n")

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    "weights_not_renormalised": (
        edit([("return weights / weights.sum(dim=-1, keepdim=True), ids", "return weights, ids")]),
        {"1a": "renormalise them", "4a": "not renormalised"}),
    # Both places the solution writes offsets (before and after the capacity).
    "offsets_one_expert_late": (
        edit([("offsets[1:] = torch.cumsum(counts, 0)",
               "offsets[1:] = torch.cumsum(counts, 0) - counts")]),
        {"1b": "shifted one expert late", "1c": "shifted one expert late",
         "1d": "shifted one expert late"}),
    # Right while the last expert gets a copy: the grader's ordinary, capacity and layer
    # routings use every expert.
    "bincount_without_minlength": (
        edit([("torch.bincount(flat, minlength=experts)", "torch.bincount(flat)")]),
        {"1c": "minlength"}),
    # Right without a capacity (the rows of an expert may come in any order); with one, the
    # earliest tokens are kept whatever their choice, not GShard's priority.
    "capacity_by_token_order": (
        edit([("order = by_priority[torch.argsort(flat[by_priority], stable=True)]",
               "order = torch.argsort(flat, stable=True)")]),
        {"1d": "earliest tokens whatever their choice"}),
    "copies_dropped_silently": (
        edit([("position = torch.full((T * top_k,), -1,",
               "position = torch.full((T * top_k,), 0,")]),
        {"1d": "silently"}),
    # Harmless until empty experts push real tiles past a grid of min(R, ...) row tiles.
    "empty_expert_owns_a_tile": (
        edit([("tiles = (counts + BLOCK_M - 1) // BLOCK_M ",
               "tiles = tl.maximum((counts + BLOCK_M - 1) // BLOCK_M, 1) ")]),
        {"2b": "an expert with no rows must own no tile"}),
    "tiles_straddle_experts": (
        edit([(TILES, STRADDLING)]),
        {"2a": "cut the sorted rows as one matrix", "2b": "cut the sorted rows as one matrix",
         "4a": "outputs are off"}),
    # The guard stops the stores past C; the rows stored into the next expert's are
    # overwritten by its own tiles, which run later: only the bounds part sees it.
    "padding_rows_stored": (
        edit([("mask=real[:, None] & (cols[None, :] < N))", "mask=cols[None, :] < N)")]),
        {"2c": "past the end of c_ptr"}),
    "torch_instead_of_triton": (
        edit([("    grouped_matmul_kernel[grid](", TORCH + "    grouped_matmul_kernel[grid](")]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "no kernel of yours ran", "4a": "launched no kernel of your notebook"}),
    # 3b is computed from 3a's count, so it is wrong too.
    "padding_in_tiles": (
        edit([("wasted_rows = sum(per_expert)",
               "wasted_rows = sum(-(-n // PADDING_BLOCK_M) for n in PADDING_COUNTS)")]),
        {"3a": "tiles, not rows", "3b": "not right"}),
    "fraction_of_the_real_rows": (
        edit([("wasted_fraction = wasted_rows / (sum(PADDING_COUNTS) + wasted_rows)",
               "wasted_fraction = wasted_rows / sum(PADDING_COUNTS)")]),
        {"3b": "divide by the real rows"}),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["slips_a"] = together(*(PLANTS.pop(name) for name in (
    "bincount_without_minlength",
    "capacity_by_token_order",
    "empty_expert_owns_a_tile",
    "padding_in_tiles",
)))
PLANTS["slips_b"] = together(*(PLANTS.pop(name) for name in (
    "copies_dropped_silently",
    "padding_rows_stored",
    "fraction_of_the_real_rows",
)))
