"""Lesson 05's planted mistakes: the fused residual add + LayerNorm solution with one slip
each (or two, in parts that do not read one another: :func:`planting.together`).

Bytes counted wrong or taken from the course's trace, the variance over the block, by the
shortcut mean(h^2) - mean(h)^2 or without centring (RMSNorm), the bias forgotten, torch or
the course's RMSNorm kernel instead of one's own, eps outside the square root, ... Each
plant is made from solutions/05_fusion.ipynb (a replacement that no longer applies fails
loudly) and graded by tests/test_grading_lessons.py.
"""

from planting import edit, together  # tests/planting.py

Y_STORE = "(centred * rstd * scale + shift).to(y_ptr.dtype.element_ty)"
RSTD = "rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)"
LAUNCH = ("residual_layernorm_kernel[(rows,)](x, residual, weight, bias, h, y, cols, eps,\n"
          "                                       BLOCK_SIZE=block, num_warps=warps)\n"
          "    return h, y")
TORCH_FILLS = ("h.copy_(x + residual)\n"
               "    y.copy_(residual_layernorm_reference(x, residual, weight, bias, eps)[1])\n"
               "    return h, y")
# The course's RMSNorm kernel (lesson 05), pasted under this assignment's names with the
# bias added to its arguments, the nearest thing the course ships.
PASTED_RMSNORM = '''@triton.jit
def residual_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, n_cols, eps,
                              BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offsets, h, mask=mask)
    hf = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (hf * inv_rms * w + b).to(y_ptr.dtype.element_ty), mask=mask)
'''

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    "forgot_to_write_h_and_the_bias": together(
        (edit([("fused_bytes = 4 * MN * BF16 + 2 * N * BF16",
                 "fused_bytes = 3 * MN * BF16 + 2 * N * BF16")]),
         {"1b": "forget to write h", "1c": "not right", "1d": "not right"}),
        (edit([(Y_STORE, Y_STORE.replace(" + shift", ""))]), {"2a": "without the bias"})),
    "fp32_as_bf16_datasheet_and_variance_over_the_block": together(
        (edit([("BF16, FP32 = 2, 4", "BF16, FP32 = 2, 2"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (3350 * 1e9) * 1e3")]),
         {"1a": "fp32 intermediates at 2 bytes", "1c": "fp32 intermediates counted at 2",
          "1d": "datasheet"}),
        (edit([(RSTD, RSTD.replace("/ n_cols", "/ BLOCK_SIZE")),
               ("shift = tl.load(b_ptr + cols, mask=inside, other=0.0)",
                "shift = tl.load(b_ptr + cols)")]),
         {"2a": "not the block size", "2b": "past the end of b_ptr"})),
    "nan_inverted_seconds_and_torch": together(
        (edit([("predicted_speedup = eager_bytes / fused_bytes",
                "predicted_speedup = fused_bytes / eager_bytes"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (copy_gbps * 1e9)")],
              append=['eager_bytes = float("nan")']),
         {"1a": "nan", "1c": "divide fused bytes by eager bytes", "1d": "seconds"}),
        (edit([(LAUNCH, "return residual_layernorm_torch(x, residual, weight, bias, eps)")]),
         {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel"})),
    # The answer to 1a computed by the course's own trace, and the course's RMSNorm kernel
    # pasted in for the LayerNorm: both lose their parts.
    "traced_bytes_and_pasted_rmsnorm": together(
        (edit(append=["from helpers.launches import trace as _count\n"
                      "eager_bytes = _count(residual_layernorm_eager, *(torch.empty(*s, "
                      "device='meta', dtype=torch.bfloat16) for s in ((M, N), (M, N), (N,), "
                      "(N,)))).bytes"]),
         {"1a": "helpers.launches"}),
        (lambda nb: _replace_kernel(nb, PASTED_RMSNORM), {"2a": "RMSNorm"})),
    # Right on every ordinary row; wrong only where the variance cancels: rows of values
    # far from zero with a small spread.
    "variance_by_the_shortcut": (
        edit([("    centred = tl.where(inside, hf - mean, 0.0)     # the lanes past the row "
               "count for nothing\n"
               "    " + RSTD,
               "    centred = tl.where(inside, hf - mean, 0.0)\n"
               "    squares = tl.sum(tl.where(inside, hf * hf, 0.0), axis=0) / n_cols\n"
               "    rstd = tl.rsqrt(squares - mean * mean + eps)")]),
        {"2a": "lost its digits"}),
    "eps_outside_the_rsqrt": (
        edit([(RSTD, "rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / n_cols) + eps")]),
        {"2a": "eps belongs inside the square root"}),
    "no_centring": (
        edit([("centred = tl.where(inside, hf - mean, 0.0)", "centred = hf")]),
        {"2a": "RMSNorm"}),
    "wrong_output_dtype": (
        edit([("h, y = torch.empty_like(x), torch.empty_like(x)",
               "h, y = torch.empty_like(x, dtype=torch.float32), torch.empty_like(x)")]),
        {"2a": "float32 for float16 inputs"}),
    "syntax_error_in_kernel": (
        edit([("inside = cols < n_cols\n", "inside = cols < n_cols)\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError"}),
    # A kernel that stores nothing, launched once; torch writes the outputs around it.
    "torch_results_around_an_idle_kernel": (
        edit([(LAUNCH, LAUNCH.replace("return h, y", TORCH_FILLS)),
              ("    tl.store(h_ptr + at, h, mask=inside)\n", ""),
              ("    tl.store(y_ptr + at, " + Y_STORE + ",\n             mask=inside)\n", "")]),
        {"2a": "never stored by your kernel", "2b": "did not compute the output"}),
}


def _replace_kernel(nb, source):
    import copy

    nb = copy.deepcopy(nb)
    hits = [c for c in nb.cells if c.cell_type == "code"
            and c.source.startswith("@triton.jit\ndef residual_layernorm_kernel")]
    assert len(hits) == 1, "the solution changed: its kernel cell is not found"
    hits[0].source = source
    return nb
