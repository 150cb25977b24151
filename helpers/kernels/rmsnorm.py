"""Residual add + RMSNorm (forward), lesson 05's third fusion and its assignment.

Every block of a Llama-style transformer ends the same way: add the block's output
``x`` to the residual stream, then normalise the sum for the next block::

    h = x + residual                                   # the new residual stream
    y = h / sqrt(mean(h^2 over the row) + eps) * weight

Both outputs are needed: ``h`` feeds the next residual add, ``y`` the next block. The
least any implementation can move is therefore: read ``x`` and ``residual``, write
``h`` and ``y``, read the weight (``N`` values, shared by every row): ``4MN + N``
elements.

The versions:

* :func:`residual_rmsnorm_eager`: the way a model writes it in PyTorch, with the
  statistics in fp32 for accuracy. Nine ops, nine kernels, and the fp32 copies make
  every round trip twice as expensive as the bf16 data. Count them with
  :func:`helpers.intensity.residual_rmsnorm_eager_kernels` (and let
  ``helpers.launches.trace`` count them for you).
* :func:`residual_rmsnorm_torch`: the add, then PyTorch's own ``F.rms_norm``, which on
  a GPU is one fused kernel: the norm is fused, but the add is not, so ``h`` is
  written by one kernel and read back by the next (``5MN + N``).
* :func:`residual_rmsnorm_kernel`: one program per row; the row of ``x`` and of
  ``residual`` is read once, ``h`` and its sum of squares stay in registers, and ``h``
  and ``y`` are written once: ``4MN + N``.

The napkin math of all three is :func:`helpers.intensity.residual_rmsnorm`. The graded
assignment of lesson 05 asks you to write this kernel yourself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_num_warps, check_same_shape, check_tensor
from .softmax import num_warps_for  # one program per row, as in the softmax

EPS = 1e-6

# The longest row the kernel accepts: 65536 fp32 values spread over 32 warps is 64 per
# thread for h alone, a thread's whole share of the SM's registers, so past 32768 the
# compiler spills (lesson 05, section 5, shows the softmax slowing there). Longer rows
# would need the two-pass, blocked pattern of helpers.kernels.softmax.softmax_kernel_online.
MAX_COLS = 65536

# (atol, rtol) per dtype: |got - reference| <= atol + rtol * |reference|. y is rounded
# once, but it is computed from h, which was rounded too, and its row statistic sums N
# squares in an order the reference does not share: three units in the last place, and
# one unit at 1.0 for the outputs near zero. fp32 differs only by the order of the sum.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2.0**-10, 3 * 2.0**-10),
    torch.bfloat16: (2.0**-7, 3 * 2.0**-7),
}


# --------------------------------------------------------------------------------------
# The spec, and the unfused versions.
# --------------------------------------------------------------------------------------


def residual_rmsnorm_reference(x, residual, weight, eps: float = EPS):
    """The spec. ``h`` is rounded to the input dtype (it is stored that way) and ``y`` is
    the RMSNorm of that stored ``h``, computed in fp32 and rounded once."""
    h = (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return h, y.to(x.dtype)


def residual_rmsnorm_eager(x, residual, weight, eps: float = EPS):
    """Residual add + RMSNorm as a Llama-style model writes it in PyTorch ops.

    Each line launches one or more kernels; each kernel reads its inputs from DRAM and
    writes its output back. ``hf`` is an fp32 copy of ``h``: 4 bytes per element.
    """
    h = x + residual
    hf = h.to(torch.float32)
    variance = hf.pow(2).mean(-1, keepdim=True)
    hf = hf * torch.rsqrt(variance + eps)
    return h, weight * hf.to(x.dtype)


def residual_rmsnorm_torch(x, residual, weight, eps: float = EPS):
    """The add, then PyTorch's fused ``F.rms_norm`` (one kernel on a GPU)."""
    h = x + residual
    return h, torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps)


# --------------------------------------------------------------------------------------
# The fused kernel.
# --------------------------------------------------------------------------------------


@triton.jit
def residual_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps,
                            BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)        # one program per row; 64-bit offsets
    cols = tl.arange(0, BLOCK_SIZE)            # BLOCK_SIZE >= n_cols: the whole row
    mask = cols < n_cols
    offsets = row * n_cols + cols              # rows are contiguous, n_cols apart
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)   # read x once
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)   # read residual once
    # The new residual stream, rounded to the storage type as it is stored; the norm
    # below is taken of exactly what the next block will read back.
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offsets, h, mask=mask)    # write h once
    hf = h.to(tl.float32)
    # Masked lanes hold 0 and add nothing; divide by the true row length.
    inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    # The weight: N values that every row reads; after the first rows they come from L2.
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (hf * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)


def _check_inputs(x, residual, weight) -> tuple[int, int]:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    check_tensor(residual, "residual", dtypes=(x.dtype,))
    check_same_shape(x, residual, "x and residual")
    check_tensor(weight, "weight", dtypes=(x.dtype,), ndim=1)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    n_cols = x.shape[-1]
    if weight.shape[0] != n_cols:
        raise ValueError(f"weight must have one entry per column of x: x has {n_cols} columns, "
                         f"weight has shape {tuple(weight.shape)}")
    if n_cols > MAX_COLS:
        raise ValueError(f"rows of {n_cols} elements do not fit in one program's registers "
                         f"(at most {MAX_COLS}); they need a two-pass, blocked kernel")
    return x.numel() // n_cols, n_cols


def residual_rmsnorm(x, residual, weight, eps: float = EPS, num_warps: int | None = None):
    """Fused residual add + RMSNorm over the last dimension. Returns ``(h, y)``."""
    rows, n_cols = _check_inputs(x, residual, weight)
    block = triton.next_power_of_2(n_cols)
    num_warps = num_warps or num_warps_for(block)
    check_num_warps(num_warps)
    h = torch.empty_like(x)
    y = torch.empty_like(x)
    if rows:
        residual_rmsnorm_kernel[(rows,)](x, residual, weight, h, y, n_cols, eps,
                                         BLOCK_SIZE=block, num_warps=num_warps)
    return h, y
