"""Lesson 07's planted mistakes: the autotuning solution with one slip each.

A configuration that overflows shared memory kept, pruning rules that drop the fastest
configuration, a key that never buckets or buckets wrongly at the edges, a space with an
invalid entry. Each plant is made from solutions/07_autotuning.ipynb (a replacement that
no longer applies fails loudly) and graded by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

KEY = "return tuple(max(16, triton.next_power_of_2(n)) for n in (M, N, K))"

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    # The pipeline's stages forgotten: 128 x 128 x 64 with 8 stages (256 KiB) is kept.
    "overflowing_config_kept": (
        edit([("shared = c.num_stages * (bm * bk + bk * bn) * size",
               "shared = (bm * bk + bk * bn) * size")]),
        {"2a": "your prune keeps it (it counts one stage"}),
    # A budget written for another GPU drops the H100's fastest recorded configuration.
    "a100_budget_drops_the_best": (
        edit([("shared <= SMEM_LIMIT", "shared <= 166_912")]),
        {"2a": "but your prune drops it", "2c": "the fastest configuration of lesson 04's"}),
    # The fastest recorded configuration holds exactly 128 registers a thread.
    "registers_strictly_below_the_limit": (
        edit([("registers <= MAX_ACC_REGISTERS", "registers < MAX_ACC_REGISTERS")]),
        {"2a": "use <=, not <", "2c": "your prune drops 128x256x64"}),
    "two_bytes_for_every_dtype": (
        edit([('size = named_args["a_ptr"].element_size()', "size = 2")]),
        {"2a": "2 bytes an element"}),
    "tiles_compared_with_m_itself": (
        edit([("biggest_m = max(16, triton.next_power_of_2(M))", "biggest_m = M"),
              ("biggest_n = max(16, triton.next_power_of_2(N))", "biggest_n = N")]),
        {"2b": "compares with M and N themselves"}),
    "key_never_buckets": (
        edit([(KEY, "return (M, N, K)")]),
        {"3a": "never buckets", "3b": "never buckets"}),
    # Right away from the edges; 16 -> 32 and 1024 -> 2048 at them.
    "key_doubles_exact_powers_of_two": (
        edit([(KEY, "return tuple(max(16, 1 << n.bit_length()) for n in (M, N, K))")]),
        {"3b": "an exact power of two is its own bucket"}),
    "block_k_of_8": (
        edit([("(64, 128, 32, 4, 5)", "(64, 128, 8, 4, 5)")]),
        {"1a": "BLOCK_K = 8"}),
    "block_n_not_a_power_of_two": (
        edit([("(64, 64, 64, 4, 4)", "(64, 96, 64, 4, 4)")]),
        {"1a": "BLOCK_N = 96"}),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["slips_a"] = together(*(PLANTS.pop(name) for name in (
    "tiles_compared_with_m_itself",
    "key_doubles_exact_powers_of_two",
    "block_n_not_a_power_of_two",
)))
PLANTS["slips_b"] = together(*(PLANTS.pop(name) for name in (
    "two_bytes_for_every_dtype",
    "key_never_buckets",
    "block_k_of_8",
)))
