"""Lesson 05's planted mistakes: the fused residual add + RMSNorm solution with one slip each.

Bytes counted wrong, the mean over the block, the weight forgotten, torch or the course's
kernel instead of one's own, eps outside the square root, ... Each plant is made from
solutions/05_fusion.ipynb (a replacement that no longer applies fails loudly) and graded
by tests/test_grading_lessons.py.
"""

from planting import edit  # tests/planting.py

KERNEL_STORE = "tl.store(y_ptr + offsets, (hf * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)"
LAUNCH = ("residual_rmsnorm_kernel[(M,)](x, residual, weight, h, y, N, eps,\n"
          "                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)\n"
          "    return h, y")

TORCH_FILLS = ("h.copy_(x + residual)\n"
               "    y.copy_(rmsnorm.residual_rmsnorm_reference(x, residual, weight, eps)[1])\n"
               "    return h, y")

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    "forgot_to_write_h": (
        edit([("fused_bytes = 4 * MN * BF16 + N * BF16",
                "fused_bytes = 3 * MN * BF16 + N * BF16")]),
        {"1b": "forget to write h", "1c": "not right", "1d": "not right"}),
    "fp32_as_bf16_and_datasheet_bandwidth": (
        edit([("BF16, FP32 = 2, 4", "BF16, FP32 = 2, 2"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (3350 * 1e9) * 1e3")]),
        {"1a": "fp32 copies at 2 bytes", "1c": "fp32 copies counted at 2 bytes",
         "1d": "datasheet"}),
    "nan_inverted_and_seconds": (
        edit([("predicted_speedup = eager_bytes / fused_bytes",
                "predicted_speedup = fused_bytes / eager_bytes"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (copy_gbps * 1e9)")],
              append=['eager_bytes = float("nan")']),
        {"1a": "nan", "1c": "divide fused bytes by eager bytes", "1d": "seconds"}),
    "mean_over_block_and_unmasked_weight": (
        edit([("tl.sum(hf * hf, axis=0) / n_cols + eps",
                "tl.sum(hf * hf, axis=0) / BLOCK_SIZE + eps"),
               ("w = tl.load(w_ptr + cols, mask=mask, other=0.0)", "w = tl.load(w_ptr + cols)")]),
        {"2a": "divide by n_cols", "2b": "past the end of w_ptr"}),
    "forgot_the_weight": (
        edit([(KERNEL_STORE, KERNEL_STORE.replace("hf * inv_rms * w", "hf * inv_rms"))]),
        {"2a": "without the weight"}),
    "wrong_output_dtype": (
        edit([("h, y = torch.empty_like(x), torch.empty_like(x)",
                "h, y = torch.empty_like(x, dtype=torch.float32), torch.empty_like(x)")]),
        {"2a": "float32 for float16 inputs"}),
    "torch_instead_of_triton": (
        edit([(LAUNCH, "return rmsnorm.residual_rmsnorm_reference(x, residual, weight, eps)")]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel"}),
    "course_kernel_instead_of_own": (
        edit([(LAUNCH, "return rmsnorm.residual_rmsnorm(x, residual, weight, eps)")]),
        {"2a": "not a kernel defined in your notebook",
         "2b": "not a kernel defined in your notebook"}),
    "syntax_error_in_kernel": (
        edit([("mask = cols < n_cols\n", "mask = cols < n_cols)\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError"}),
    # Right on every ordinary row; wrong only on the edge rows: NaN where h is all zeros
    # (x = -residual), off on rows of one small element.
    "eps_outside_the_rsqrt": (
        edit([("inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)",
                "inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols) + eps")]),
        {"2a": "eps belongs inside the square root"}),
    # A kernel that stores nothing, launched once; torch writes the outputs around it.
    "torch_results_around_an_idle_kernel": (
        edit([(LAUNCH, LAUNCH.replace("return h, y", TORCH_FILLS)),
               ("    tl.store(h_ptr + offsets, h, mask=mask)\n", ""),
               (f"    {KERNEL_STORE}\n", "")]),
        {"2a": "never stored by your kernel", "2b": "did not compute the output"}),
}
