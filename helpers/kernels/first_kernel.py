"""The first kernel of the course: ``y = a * x + b``, elementwise, in Triton.

A Triton kernel is written for ONE program instance; the launcher starts a grid of
them. Program ``pid`` handles ``BLOCK_SIZE`` consecutive elements: it computes their
offsets, loads them, does the arithmetic in registers and stores the result. The last
program usually runs past the end of the tensor, so every load and store is masked.
Its napkin math is :func:`helpers.intensity.scale_shift`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_power_of_two, check_tensor


def scale_shift_reference(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """The spec, in PyTorch."""
    return a * x + b


@triton.jit
def scale_shift_kernel(x_ptr, y_ptr, a, b, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)                      # which block of elements is mine
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements                      # the last block may hang over the end
    x = tl.load(x_ptr + offsets, mask=mask)          # one read of each element from DRAM
    y = a * x.to(tl.float32) + b                     # arithmetic in fp32 registers
    tl.store(y_ptr + offsets, y.to(x.dtype), mask=mask)  # one write of each element


def scale_shift(x: torch.Tensor, a: float, b: float, block_size: int = 1024) -> torch.Tensor:
    """Launch ``scale_shift_kernel`` over ``x`` (any shape, contiguous)."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    check_power_of_two("block_size", block_size)
    y = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, block_size),)             # enough programs to cover n elements
    scale_shift_kernel[grid](x, y, a, b, n, BLOCK_SIZE=block_size)
    return y
