"""Lesson 08's planted mistakes: the Mixture-of-Experts solution with one slip each.

Weights not renormalised, offsets off by one expert, trailing empty experts lost by
bincount, a capacity that keeps the earliest tokens rather than the first choices, copies
dropped past the capacity without a -1, the course's grid bound as the layout's length,
slots holding sorted rows instead of copies, a kernel that reads row `copy` of a, empty
slots stored, the course's grouped GEMM behind the launcher, and expected paddings from a
simulation or from the average count. Each plant is made from solutions/08_moe.ipynb (a
replacement that no longer applies fails loudly) and graded by
tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

# The course's grouped GEMM behind the learner's launcher, its own kernel launched idle
# beside it: sort the copies, run the course's, put each row back at its copy.
COURSE_KERNEL = """\
    E, K, N = w.shape
    copies = a.shape[0] * top_k
    scratch = torch.empty((copies, N), device=a.device, dtype=a.dtype)
    grid = (block_expert.numel(), triton.cdiv(N, BLOCKS["BLOCK_N"]))
    if block_expert.numel():
        expert_matmul_kernel[grid](a, w, scratch, slots, block_expert, N, K, copies, top_k,
                                   *a.stride(), *w.stride(), *scratch.stride(),
                                   EVEN_K=K % BLOCKS["BLOCK_K"] == 0, **BLOCKS)
    real = slots < copies
    order = slots[real]
    experts = block_expert.repeat_interleave(BLOCKS["BLOCK_M"])[real]
    order = order[torch.argsort(experts, stable=True)]
    counts = torch.bincount(experts, minlength=E).to(torch.int32)
    c = torch.empty((copies, N), device=a.device, dtype=a.dtype)
    c[order] = moe.grouped_matmul(a[order // top_k], counts, w)
    return c
"""
# A simulation of the random router, through the course's padding_rows.
SIMULATED = """    drawn = [moe.padding_rows(torch.bincount(
        torch.rand(tokens, experts).argsort(-1)[:, :top_k].flatten(), minlength=experts), block_m)
             for _ in range(200)]
    return sum(drawn) / len(drawn)
"""


def _body(function: str, new: str):
    """Replace the solution region of ``function`` with ``new``."""
    def apply(nb):
        import copy
        nb = copy.deepcopy(nb)
        for cell in nb.cells:
            if cell.cell_type == "code" and f"def {function}(" in cell.source:
                head, rest = cell.source.split(f"def {function}(", 1)
                start = rest.index("### BEGIN SOLUTION\n") + len("### BEGIN SOLUTION\n")
                end = rest.index("    ### END SOLUTION", start)
                cell.source = head + f"def {function}(" + rest[:start] + new + rest[end:]
                return nb
        raise AssertionError(f"no {function} in the solution")
    return apply


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
         "1d": "shifted one expert late", "4a": "raised"}),
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
    # The course's grid bound, min(R, R // BLOCK_M + E) blocks: more than some sizes need.
    "course_grid_bound": (
        edit([("    blocks = holding + (R - holding) // block_m ",
               "    blocks = min(R, R // block_m + E) ")]),
        {"2b": "more than any counts"}),
    "slots_hold_sorted_rows": (
        edit([("    slots[shift[expert_of_row] + row] = d.order\n",
               "    slots[shift[expert_of_row] + row] = row\n")]),
        {"2a": "", "2c": "", "4a": ""}),
    "kernel_reads_row_copy": (
        edit([("    rows = tl.where(real, copy, 0) // top_k ",
               "    rows = tl.where(real, copy, 0) ")]),
        {"2c": "", "2d": "", "4a": ""}),
    # The guard stops the stores past C: only the bounds part sees it.
    "empty_slots_stored": (
        edit([("mask=real[:, None] & (cols[None, :] < N))", "mask=cols[None, :] < N)")]),
        {"2d": "past the end of c_ptr"}),
    "courses_grouped_gemm": (
        (lambda nb: _body("expert_matmul", COURSE_KERNEL)(nb)),
        {"2c": "a C your kernel was not given", "2d": "your kernel did not compute the output",
         "4a": "launched the course's"}),
    "simulated_padding": (
        (lambda nb: _body("expected_padding", SIMULATED)(nb)),
        {"3a": "", "3b": ""}),
    "padding_of_the_mean": (
        (lambda nb: _body("expected_padding",
                          "    return experts * (-(tokens * top_k / experts) % block_m)\n")(nb)),
        {"3a": "padding of the average count", "3b": ""}),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["slips_a"] = together(*(PLANTS.pop(name) for name in (
    "weights_not_renormalised",
    "bincount_without_minlength",
    "capacity_by_token_order",
    "course_grid_bound",
    "padding_of_the_mean",
)))
PLANTS["slips_b"] = together(*(PLANTS.pop(name) for name in (
    "slots_hold_sorted_rows",
    "copies_dropped_silently",
    "empty_slots_stored",
    "simulated_padding",
)))
