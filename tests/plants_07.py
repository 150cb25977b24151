"""Lesson 07's planted mistakes: the autotuning solution with one slip each.

The course's own launch rule as the space and as the prune, a space fitted to the shapes
the notebook shows (it misses the held-out ones), a prune that keeps everything or may keep
nothing, a key of the exact sizes and one that ignores the rows. Each plant is made from
solutions/07_autotuning.ipynb (a replacement that no longer applies fails loudly) and graded
by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

SPACE = """\
        for per_thread in (4, 16):
            warps = block // (32 * per_thread)
            if 1 <= warps <= 32:
                space.append(triton.Config({"BLOCK_SIZE": block}, num_warps=warps,
                                           num_stages=1))
    return space
"""
# The course's launch rule, one setting per block: the nearest course function.
COURSE_SPACE = """\
        space.append(triton.Config({"BLOCK_SIZE": block}, num_warps=sk.num_warps_for(block),
                                   num_stages=3))
    return space
"""
# Fitted to the shapes the notebook shows: the fewest settings that cover them.
FITTED_SPACE = """\
        pass
    shown = [s for s in table if s[1] in SHOWN_COLS]
    chosen = []
    while shown:
        pick = max(grid, key=lambda g: sum(table[s][g] <= 1.1 * min(table[s].values())
                                           for s in shown))
        chosen.append(pick)
        shown = [s for s in shown if table[s][pick] > 1.1 * min(table[s].values())]
    return [triton.Config({"BLOCK_SIZE": b}, num_warps=w, num_stages=st) for b, w, st in chosen]
"""
RULE = """\
    kept = [c for c in configs if c.kwargs["BLOCK_SIZE"] in blocks
            and c.kwargs["BLOCK_SIZE"] // (32 * c.num_warps) in (4, 8, 16)]
"""
COURSE_RULE = """\
    block = min(sk.ONLINE_BLOCK, row)
    kept = [c for c in configs if c.kwargs["BLOCK_SIZE"] == block
            and c.num_warps == sk.num_warps_for(block)]
"""
FALLBACK = "    if not kept:        # nothing the rule picks: the block nearest its choice, never none"
KEY = "    return rows, min(triton.next_power_of_2(max(N, 1)), 65536)\n"

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    # The course's own code in the space: 1a, right otherwise, is refused for it; 1b fails
    # on the data anyway.
    "course_rule_space": (edit([(SPACE, COURSE_SPACE)]),
                          {"1a": "uses the course's own", "1b": "slower than the sweep's best"}),
    "space_fitted_to_the_shown_shapes": (
        edit([(SPACE, FITTED_SPACE)]),
        {"1b": "a shape the notebook does not show"}),
    "prune_keeps_everything": (edit([(RULE, "    kept = list(configs)\n")]), {"2b": "at most 18"}),
    # The course's rule as the prune: slow on most shapes (2a); 2b and 2c (the solution's
    # fallback keeps a setting), right otherwise, refused for the course's code.
    "prune_by_the_course_rule": (
        edit([(RULE, COURSE_RULE)]),
        {"2a": "drops every setting within", "2b": "uses the course's own",
         "2c": "uses the course's own"}),
    "prune_may_keep_nothing": (edit([(FALLBACK, "    if False:")]), {"2c": "keeps nothing"}),
    "key_of_the_exact_sizes": (edit([(KEY, "    return M, N\n")]), {"3b": "at most 64"}),
    "key_ignores_the_rows": (
        edit([(KEY, "    return min(triton.next_power_of_2(max(N, 1)), 65536)\n")]),
        {"3a": "share your key"}),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["slips_a"] = together(*(PLANTS.pop(name) for name in (
    "course_rule_space",
    "prune_keeps_everything",
    "key_ignores_the_rows",
)))
PLANTS["slips_b"] = together(*(PLANTS.pop(name) for name in (
    "space_fitted_to_the_shown_shapes",
    "prune_may_keep_nothing",
    "key_of_the_exact_sizes",
)))
