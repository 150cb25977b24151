"""Lesson 06's planted mistakes: the FlashAttention forward solution with one slip each.

No rescaling, the max not subtracted, the causal mask off by the diagonal, the lse not
stored or in base 2, an fp16 accumulator, tiles above the diagonal visited, ... Each plant
is made from solutions/06_flash_attention.ipynb (a replacement that no longer applies fails
loudly) and graded by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

RESCALED_L = "l_i = l_i * rescale + tl.sum(p, 1)"
RESCALED_ACC = "acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])"
LAUNCH = "    flash_forward_kernel[grid]("
LSE = "lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453"

# name -> (how to plant it, {part: words its message must contain}, parts whose outcome
# depends on the grader's random inputs); every other part must keep its full points.
PLANTS = {
    # Without its rescale, l (and so the lse) is off only for rows whose maximum rises in a
    # later key tile, by more than the tolerance only where it rises enough; whether the lse
    # part's cases have such a row depends on the seed (a full CI run once lost 2c to it).
    "no_rescaling": (
        edit([(RESCALED_L, "l_i = l_i + tl.sum(p, 1)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, acc)")]),
        {"2a": "rescale l and acc", "2b": "rescale l and acc"}, ("2c",)),
    # The textbook softmax sum: right on ordinary scores, inf/NaN on scores in the hundreds.
    "max_not_subtracted": (
        edit([(RESCALED_L, "l_i = l_i + tl.sum(p, 1)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, acc)"),
              ("p = tl.math.exp2(s - m_new[:, None])", "p = tl.math.exp2(s)"),
              (LSE, "lse = tl.math.log2(l_i) * 0.6931471805599453")]),
        {"2a": "exp overflows", "2b": "exp overflows"}),
    "causal_mask_j_less_than_i": (
        edit([("cols[None, :] <= rows[:, None]", "cols[None, :] < rows[:, None]")]),
        {"2b": "j <= i"}),
    # The unmasked loop runs one tile too far: into the tile where the diagonal starts.
    "diagonal_tile_without_mask": (
        edit([("unmasked_end = tl.minimum(start_m, full_end)",
               "unmasked_end = tl.minimum(start_m + BLOCK_N, full_end)")]),
        {"2b": "tile where the diagonal starts"}),
    "lse_not_stored": (
        edit([("    tl.store(lse_ptr + head + rows, lse, mask=rows < seq_len)\n", "")]),
        {"2c": "never stored by your kernel"}),
    "lse_in_base_2": (
        edit([(LSE, "lse = m_i + tl.math.log2(l_i)")]),
        {"2c": "base 2"}),
    "fp16_accumulator": (
        edit([("acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)",
               "acc = tl.zeros((BLOCK_M, HEAD_DIM), q.dtype)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, (acc * rescale[:, None])"
                             ".to(v.dtype), out_dtype=v.dtype)")]),
        {"2f": "65504"}),
    "every_causal_tile_visited": (
        edit([("stop = tl.minimum(start_m + BLOCK_M, seq_len)", "stop = seq_len")]),
        {"2d": "wholly above the diagonal"}),
    # Right on every length that is a multiple of the tile; wrong only where the last tile
    # is partial: the mask tests the rows, so the padding keys count with score 0.
    "padded_keys_unmasked": (
        edit([("visible = cols[None, :] < seq_len", "visible = rows[:, None] < seq_len")]),
        {"2a": "padded keys"}),
    # Merge: right on every row that sees a key; NaN only on the fully masked rows. Kernel:
    # the running maximum starts at 0, which every ordinary row survives (its shift cancels
    # in O and in lse); only rows whose scores all sit far below zero underflow to 0 / 0.
    "merge_nan_and_maximum_from_zero": together(
        (edit([('shift = torch.where(m == float("-inf"), 0.0, m)', "shift = m")]),
         {"1": "exp(-inf - (-inf)) is NaN"}),
        (edit([('m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)',
                "m_i = tl.zeros((BLOCK_M,), tl.float32)")]),
         {"2a": "far below zero", "2b": "far below zero"})),
    "torch_instead_of_triton": (
        edit([(LAUNCH, "    return attention.attention_reference(q, k, v, causal)\n" + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "make 2a and 2b pass first", "2d": "launched no Triton kernel",
         "2e": "no kernel of yours ran", "2f": "launched no Triton kernel"}),
}
