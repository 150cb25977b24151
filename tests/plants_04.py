"""Lesson 04's planted mistakes: the tiled linear-layer solution with one slip each.

A missing K mask, a wrong K stride, an fp16 accumulator, no bias, F.linear instead of a
kernel, an H100 choice that overflows shared memory or spills registers, waves without
occupancy, the fastest setting always, ... Each plant is made
from solutions/04_tiling.ipynb (a replacement that no longer applies fails loudly) and
graded by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

LOAD_X = "x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)"
LOAD_W = "w = tl.load(w_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)"
LAUNCH = "linear_kernel[grid](x, weight, bias, y, M, N, K, x.stride(0), x.stride(1),"
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
        edit([(LOAD_X, "x = tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0)"),
               (LOAD_W, "w = tl.load(w_ptrs, mask=offs_n[None, :] < N, other=0.0)")]),
        {"2b": "mask offs_k < K - k", "2c": "the K tail"}, ("2a",)),
    # W taken for K x N, the layout of lesson 04's B: its strides passed the other way round.
    "weight_read_as_k_by_n": (
        edit([("weight.stride(0), weight.stride(1), y.stride(0)",
               "weight.stride(1), weight.stride(0), y.stride(0)")]),
        {"2a": "W is stored out x in", "2b": "W is stored out x in", "2d": "wrong result"},
        ("2c",)),
    "fp16_accumulator": (
        edit([("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
               ("acc = tl.dot(x, w, acc)", "acc += tl.dot(x, w).to(tl.float16)")]),
        {"2d": "keep the running sum in fp32"}, ()),
    "torch_linear": (
        edit([(LAUNCH, "return torch.nn.functional.linear(x, weight, bias)\n    " + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "no kernel of yours ran", "2d": "launched no Triton kernel",
         "3c": "the kernel linear launches", "3d": "the kernel linear launches"}, ()),
    "syntax_error_in_kernel": (
        edit([("offs_k = tl.arange(0, BLOCK_K)\n", "offs_k = tl.arange(0, BLOCK_K))\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError", "2c": "SyntaxError", "2d": "SyntaxError",
         "3c": "SyntaxError", "3d": "SyntaxError"}, ()),
    # Right everywhere but on a single row, where it hands the product to torch.
    "torch_for_a_single_row": (
        edit([("    M, K = x.shape\n    N = weight.shape[0]\n",
                "    M, K = x.shape\n    N = weight.shape[0]\n    if M == 1:   # a matrix-vector "
                "product: torch will do\n        return (x.float() @ weight.float().T + "
                "bias.float()).to(x.dtype)\n")]),
        {"2a": "launched no Triton kernel"}, ()),
    # A kernel that stores nothing; torch writes y around it.
    "torch_result_around_an_idle_kernel": (
        edit([("    return y\n", "    y.copy_(torch.nn.functional.linear(x, weight, bias))\n"
                "    return y\n"),
               ("    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),\n"
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
    # The bias never added: right wherever a learner forgets nothing else, wrong everywhere.
    "no_bias": (
        edit([("    acc += bias[None, :].to(tl.float32)", "    pass")]),
        {"2a": "without the bias", "2b": "without the bias", "2d": "wrong result"}, ()),
    # Part 5: the fastest setting at 4096^3 whatever the shape, and waves counted as if an
    # SM ran one program of every setting (the choice reads the waves too: either way).
    "always_the_fastest_setting": (
        edit([("    return max(range(len(SETTINGS)), key=lambda i: predicted(SETTINGS[i]))",
               "    return max(range(len(SETTINGS)), key=lambda i: SETTINGS[i][\"tflops\"])")]),
        {"5b": "of the best setting's speed"}, ()),
    "one_program_per_sm": (
        edit([("    return min(by_registers, by_shared, LIMITS[\"warps\"] // s[\"num_warps\"], "
               "LIMITS[\"blocks\"])", "    return 1")]),
        {"5a": "more than one program"}, ("5b",)),
    # The course's nearest code: lesson 04's matmul with the bias added by torch, and part 5
    # answered by the grader's own model.
    "courses_matmul_and_the_graders_waves": (
        edit([(LAUNCH, "from helpers.kernels import matmul as course\n"
                       "    return course.matmul(x, weight.t()) + bias\n    " + LAUNCH),
              ("    tiles = -(-M // setting[\"BLOCK_M\"]) * -(-N // setting[\"BLOCK_N\"])   "
               "# partial tiles count\n",
               "    from helpers.grading.assignments import tiling_waves as grader\n"
               "    return grader.wave_count(M, N, setting)\n"),
              ("    return max(range(len(SETTINGS)), key=lambda i: predicted(SETTINGS[i]))",
               "    from helpers.grading.assignments import tiling_waves as grader\n"
               "    return max(range(len(SETTINGS)), key=lambda i: grader.predicted_tflops("
               "M, N, SETTINGS[i]))")]),
        {"2a": "not a kernel defined in your notebook",
         "2b": "not a kernel defined in your notebook", "2c": "no kernel of yours ran",
         "2d": "not a kernel defined in your notebook",
         "3a": "uses the course's own helpers.kernels.matmul.matmul",
         "3b": "uses the course's own helpers.kernels.matmul.matmul",
         "3c": "the kernel linear launches", "3d": "the kernel linear launches",
         "5a": "uses the course's own", "5b": "uses the course's own"}, ()),
}

# Slips in parts that do not read one another, graded in one notebook each group.
PLANTS["napkin_slips_and_no_bias"] = together(*(PLANTS.pop(name) for name in (
    "one_stage",
    "intensity_off_by_2x",
    "sram_without_stages",
    "no_bias",
)))
PLANTS["no_k_mask_and_always_the_fastest_setting"] = together(
    PLANTS.pop("no_k_mask"), PLANTS.pop("always_the_fastest_setting"))
PLANTS["courses_matmul_the_graders_waves_and_fp32_bytes"] = together(
    PLANTS.pop("courses_matmul_and_the_graders_waves"), PLANTS.pop("fp32_bytes"))
PLANTS["torch_for_a_single_row_and_spilling_config"] = together(
    PLANTS.pop("torch_for_a_single_row"), PLANTS.pop("spilling_config"))
PLANTS["overflowing_config_and_one_program_per_sm"] = together(
    PLANTS.pop("overflowing_config"), PLANTS.pop("one_program_per_sm"))
