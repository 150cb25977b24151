"""Lesson 06's planted mistakes: the FlashAttention forward solution with one slip each.

No rescaling, the max not subtracted, the causal mask off by the diagonal, the lse not
stored or in base 2, an fp16 accumulator, tiles above the diagonal visited, the scores not
soft-capped, the window one key too wide, tiles left of the window visited, ... Each plant
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
    # The textbook softmax sum: right on ordinary scores; NaN where every score sits far
    # below zero (exp underflows: l = 0), inf/NaN on scores in the hundreds.
    "max_not_subtracted": (
        edit([(RESCALED_L, "l_i = l_i + tl.sum(p, 1)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, acc)"),
              ("p = tl.math.exp2(s - shift[:, None])", "p = tl.math.exp2(s)"),
              (LSE, "lse = tl.math.log2(l_i) * 0.6931471805599453")]),
        {"2a": "subtract the running maximum", "2b": "subtract the running maximum"}),
    # The unmasked loop runs one tile too far: into the tile where the diagonal starts.
    "diagonal_tile_without_mask": (
        edit([("unmasked_end = tl.minimum(start_m, full_end)",
               "unmasked_end = tl.minimum(start_m + BLOCK_N, full_end)")]),
        {"2b": "tile where the diagonal starts"}),
    # A row the first tiles of its window hide every key from: exp(-inf - (-inf)) is NaN
    # (right without a window, where key 0 is in every row's first tile); and the lse never
    # stored.
    "window_rows_nan_and_lse_not_stored": together(
        (edit([('shift = tl.where(m_new == float("-inf"), 0.0, m_new)', "shift = m_new")]),
         {"2b": "as part 1's empty state does"}),
        (edit([("    tl.store(lse_ptr + head + rows, lse, mask=rows < seq_len)\n", "")]),
         {"2c": "never stored by your kernel"})),
    # The window holds i - W too: right without a window, wrong on every windowed row; and
    # the lse in base 2 (judged where O is right: the calls without a window).
    "window_one_key_wide_and_lse_in_base_2": together(
        (edit([("visible = visible & (cols[None, :] > rows[:, None] - window)",
                "visible = visible & (cols[None, :] >= rows[:, None] - window)")]),
         {"2b": "one key too many"}),
        (edit([(LSE, "lse = m_i + tl.math.log2(l_i)")]), {"2c": "base 2"})),
    # The scores never capped (2a's and 2b's soft-capped calls), and every windowed program
    # starting at key 0: right, but it loads tiles no query of it sees (2d).
    "no_softcap_and_window_from_key_0": together(
        (edit([("s = softcap * (2 * tl.sigmoid(2 * s / softcap) - 1)", "s = s")]),
         {"2a": "not soft-capped", "2b": "not soft-capped"}),
        (edit([("lo = tl.maximum(start_m - window + 1, 0) // BLOCK_N * BLOCK_N", "lo = 0")]),
         {"2d": "left of the window"})),
    # An fp16 accumulator (right but where acc passes 65504), and every causal tile visited
    # (right, but it loads tiles above the diagonal).
    "fp16_accumulator_and_every_causal_tile_visited": together(
        (edit([("acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)",
                "acc = tl.zeros((BLOCK_M, HEAD_DIM), q.dtype)"),
               (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, (acc * rescale[:, None])"
                              ".to(v.dtype), out_dtype=v.dtype)")]),
         {"2f": "65504"}),
        (edit([("stop = tl.minimum(start_m + BLOCK_M, seq_len)", "stop = seq_len")]),
         {"2d": "wholly above the diagonal"})),
    # Right on every length that is a multiple of the tile; wrong only where the last tile
    # is partial: the mask tests the rows, so the padding keys count with score 0 (2a). And
    # the causal mask without its diagonal (2b).
    # ... and the backward handed to the course's kernels, which know neither window nor cap.
    "padded_keys_unmasked_causal_mask_j_less_than_i_and_the_courses_backward": together(
        (edit([("visible = cols[None, :] < seq_len", "visible = rows[:, None] < seq_len")]),
         {"2a": "padded keys"}),
        (edit([("cols[None, :] <= rows[:, None]", "cols[None, :] < rows[:, None]")]),
         {"2b": "j <= i"}),
        (edit([("    delta = (do.float() * o.float()).sum(-1)",
                "    return attention.flash_attention_backward(do, q, k, v, o, lse, causal)\n"
                "    delta = (do.float() * o.float()).sum(-1)")]),
         {"4a": "not a kernel defined in your notebook",
          "4b": "not a kernel defined in your notebook", "4c": "no kernel of yours ran"})),
    # Merge: right on every row that sees a key; NaN only on the fully masked rows. Kernel:
    # the running maximum starts at 0, which every ordinary row survives (its shift cancels
    # in O and in lse); only rows whose scores all sit far below zero underflow to 0 / 0.
    "merge_nan_and_maximum_from_zero": together(
        (edit([('shift = torch.where(m == float("-inf"), 0.0, m)', "shift = m")]),
         {"1": "exp(-inf - (-inf)) is NaN"}),
        (edit([('m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)',
                "m_i = tl.zeros((BLOCK_M,), tl.float32)")]),
         {"2a": "far below zero", "2b": "far below zero"})),
    # Part 4, the backward. The gradient of the scores never goes back through the cap
    # (right without one); and the dQ kernel loads lse unmasked: the padding rows of a head
    # read the next head's (harmless: their dO is 0), the last head's read past the end.
    "backward_without_the_cap_derivative_and_dk_store_unmasked": together(
        (edit([("ds = ds * (1 - t * t)", "ds = ds * 1.0")]),
         {"4a": "back through that function", "4b": "back through that function"}),
        (edit([("lse = tl.load(lse_ptr + head + rows, mask=rows < seq_len, other=0.0)\n"
                "    delta = tl.load(delta_ptr + head + rows, mask=rows < seq_len, other=0.0)\n"
                "    dq = ",
                "lse = tl.load(lse_ptr + head + rows)\n"
                "    delta = tl.load(delta_ptr + head + rows, mask=rows < seq_len, other=0.0)\n"
                "    dq = ")]),
         {"4c": "Out-of-bounds"})),
    # The backward launched as if there were no window (right on every call without one),
    # and the dQ kernel stopping at the diagonal without a mask too (dK and dV right).
    "backward_without_the_window_and_dq_stopping_at_the_diagonal": together(
        (edit([("flags = dict(CAUSAL=causal, WINDOWED=window is not None,",
                "flags = dict(CAUSAL=causal, WINDOWED=False,")]),
         {"4b": "left of a query's window"}),
        (edit([("    hi = seq_len\n    if CAUSAL:\n        hi = tl.minimum(start_m + BLOCK_M, seq_len)",
                "    hi = tl.minimum(start_m + BLOCK_M, seq_len)\n    if CAUSAL:\n"
                "        hi = tl.minimum(start_m + BLOCK_M, seq_len)")]),
         {"4a": "dQ is not"})),
    "torch_instead_of_triton": (
        edit([(LAUNCH, "    return attention.attention_reference(q, k, v, causal)\n" + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "make 2a and 2b pass first", "2d": "launched no Triton kernel",
         "2e": "no kernel of yours ran", "2f": "launched no Triton kernel"}),
}

# Slips of the forward and of the backward, which read nothing of one another: one notebook
# each pair.
PLANTS["max_not_subtracted_and_the_backward_without_its_window"] = together(
    PLANTS.pop("max_not_subtracted"),
    PLANTS.pop("backward_without_the_window_and_dq_stopping_at_the_diagonal"))
PLANTS["diagonal_tile_without_mask_and_the_backward_without_the_cap_derivative"] = together(
    PLANTS.pop("diagonal_tile_without_mask"),
    PLANTS.pop("backward_without_the_cap_derivative_and_dk_store_unmasked"))
