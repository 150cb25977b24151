"""Lesson 09's planted mistakes: the FP8 assignment's solution with a slip in part 1 and
one in part 2 (parts that do not read one another: :func:`planting.together`).

Scales counted without their 4 bytes, partial edge groups dropped, the granularity picked
by error alone, the course's scale_shape behind the learner's; in the kernel: one amax for
the whole tile instead of each row's group, log2 of a group of zeros (NaN), no saturation
before the cast, and the lesson's amax / 448 instead of a power of two. On a GPU, part 3c's
promotion never chosen (a plant of GPU-only parts: tests/test_grading_09.py grades it in GPU
mode; CPU mode, where 3c waits for a GPU, leaves it out). Each plant is made from
solutions/09_fp8.ipynb (a replacement that no longer applies fails loudly) and graded by
tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

ROW_AMAX = "amax = tl.max(tl.abs(x), axis=1)"
BITS_SCALE = """    exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    # 2^(exponent - 8), built from its bits: exact, with no exp2 approximation.
    scale = ((exponent - 8 + 127) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, scale, 1.0)"""
CLAMP = "q = tl.minimum(tl.maximum(x * (1.0 / scale)[:, None], -448.0), 448.0)    # saturate"
SHAPE = "return (-(-M // rows), -(-K // cols))     # partial groups at the edges count"
PICK = "return min(within, key=lambda g: (math.prod(scale_shape_for(tuple(x.shape), g)), errors[g]))"
PROMOTE = """    for every in (0, 128, 64, 32):
        if promotion_error(a, b, a_scale, b_scale, every) <= budget:
            return every
    return 32"""

PLANTS = {
    "scales_at_one_byte_and_one_amax_a_tile": together(
        (edit([("return 4 * rows * cols / (shape[0] * shape[1])",
                "return rows * cols / (shape[0] * shape[1])")]),
         {"1b": "4 bytes, not 1"}),
        (edit([(ROW_AMAX, "amax = tl.zeros((ROWS,), tl.float32) + tl.max(tl.abs(x))")]),
         {"2a": "one row's 128 consecutive values"})),
    "picked_by_error_and_nan_on_zero_groups": together(
        (edit([(PICK, "return min(within, key=lambda g: errors[g])")]),
         {"1c": "fewer scales"}),
        (edit([(BITS_SCALE, "    scale = tl.exp2(tl.floor(tl.log2(amax)) - 8)")]),
         {"2a": "NaN or 0"})),
    "course_scale_shape_and_no_saturation": together(
        (edit([(SHAPE, "from helpers.kernels import fp8 as _fp8\n"
                       "    return _fp8.scale_shape(granularity, shape)")]),
         {"1a": "course's own", "1b": "course's own", "1c": "course's own"}),
        (edit([(CLAMP, "q = x * (1.0 / scale)[:, None]")]), {"2a": "clamp x / scale"})),
    "edge_groups_dropped_and_amax_over_448": together(
        (edit([(SHAPE, "return (M // rows, K // cols)")]),
         {"1a": "partial group", "1b": "wrong"}, ("1c",)),
        (edit([(BITS_SCALE, "    scale = tl.where(amax > 0, amax / 448.0, 1.0)")]),
         {"2a": "powers of two"})),
    # A solution that never promotes: the drift over a long K past the budget goes unseen.
    "promotion_missing": (edit([(PROMOTE, "    return 0")]), {"3c": "never promote"}),
}
