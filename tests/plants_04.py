"""Lesson 04's planted mistakes: the tiled-matmul solution with one slip each.

A missing K mask, a wrong K stride, an fp16 accumulator, torch.matmul instead of a kernel,
an H100 choice that overflows shared memory or spills registers, ... Each plant is made
from solutions/04_tiling.ipynb (a replacement that no longer applies fails loudly) and
graded by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

LOAD_A = "a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)"
LOAD_B = "b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)"
LAUNCH = ("matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), "
          "b.stride(1),")
CONFIG = "H100_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)"

# name -> (how to plant it, {part: words its message must contain}, parts whose outcome
# depends on the machine); every other part must keep its full points.
#
# Why "depends on the machine": in CPU mode the grader's bounds guard turns a load outside
# every tensor into a masked load (zeros), so an unmasked read past the end of B multiplies
# by zero and the values can still come out right; a read that lands in the memory of the
# launch's other tensors is not outside any of them. Where the allocator puts A, B and C
# decides which happens. The part that grades bounds always catches the slip.
PLANTS = {
    "fp32_bytes": (
        edit([("BYTES_BF16 = 64, 128, 32, 5, 2", "BYTES_BF16 = 64, 128, 32, 5, 4")]),
        {"1a": "4 bytes per element", "1b": "4 bytes per element"}, ()),
    "one_stage": (
        edit([("tile_sram_bytes = STAGES_1 * bytes_per_step",
                "tile_sram_bytes = bytes_per_step")]),
        {"1b": "one stage"}, ()),
    "no_k_mask": (
        edit([(LOAD_A, "a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0)"),
               (LOAD_B, "b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0)")]),
        {"2b": "mask offs_k < K - k", "2c": "the K tail"}, ("2a",)),
    "wrong_k_stride": (
        edit([("b_ptrs += BLOCK_K * stride_bk", "b_ptrs += BLOCK_K * stride_bn")]),
        {"2a": "BLOCK_K * stride_bk", "2b": "BLOCK_K * stride_bk", "2d": "wrong result"},
        ("2c",)),
    "fp16_accumulator": (
        edit([("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
               ("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b).to(tl.float16)")]),
        {"2d": "keep the running sum in fp32"}, ()),
    "torch_matmul": (
        edit([(LAUNCH, "return torch.matmul(a, b)\n    " + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "no kernel of yours ran", "2d": "launched no Triton kernel",
         "3c": "the kernel matmul launches", "3d": "the kernel matmul launches"}, ()),
    "syntax_error_in_kernel": (
        edit([("offs_k = tl.arange(0, BLOCK_K)\n", "offs_k = tl.arange(0, BLOCK_K))\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError", "2c": "SyntaxError", "2d": "SyntaxError",
         "3c": "SyntaxError", "3d": "SyntaxError"}, ()),
    # Right everywhere but on a single row, where it hands the product to torch.
    "torch_for_a_single_row": (
        edit([("    M, K = a.shape\n    N = b.shape[1]\n",
                "    M, K = a.shape\n    N = b.shape[1]\n    if M == 1:   # a matrix-vector "
                "product: torch will do\n        return (a.float() @ b.float()).to(a.dtype)\n")]),
        {"2a": "launched no Triton kernel"}, ()),
    # A kernel that stores nothing; torch writes C around it.
    "torch_result_around_an_idle_kernel": (
        edit([("    return c\n", "    c.copy_(torch.matmul(a.float(), b.float()).to(a.dtype))\n"
                "    return c\n"),
               ("    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),\n"
                "             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n", "")]),
        {"2a": "never stored by your kernel", "2b": "never stored by your kernel",
         "2c": "did not compute the output", "2d": "never stored by your kernel",
         "3b": "the compiled kernel asks for"}, ()),
    # Part 3, the H100 design, graded on the kernel compiled for sm_90.
    "overflowing_config": (
        edit([(CONFIG, CONFIG.replace("num_stages=4", "num_stages=5"))]),
        {"3c": "out of resource: shared memory"}, ()),
    "spilling_config": (
        edit([(CONFIG, CONFIG.replace("num_warps=8", "num_warps=4"))]),
        {"3d": "spilled to local memory"}, ()),
    "sram_without_stages": (
        edit([("h100_sram_bytes = H100_CONFIG[\"num_stages\"] * h100_step_bytes",
                "h100_sram_bytes = h100_step_bytes")]),
        {"3b": "one stage"}, ()),
    "intensity_off_by_2x": (
        edit([("h100_intensity = 2 * bm * bn * bk / h100_step_bytes",
                "h100_intensity = bm * bn * bk / h100_step_bytes")]),
        {"3a": "one FLOP per multiply-add"}, ()),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["napkin_slips"] = together(*(PLANTS.pop(name) for name in (
    "one_stage",
    "intensity_off_by_2x",
    "sram_without_stages",
)))
