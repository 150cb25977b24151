"""The first kernel of the course: ``y = a * x + b``, elementwise, in Triton.

A Triton kernel is written for ONE program instance; the launcher starts a grid of
them. Program ``pid`` handles ``BLOCK_SIZE`` consecutive elements: it computes their
offsets, loads them, does the arithmetic in registers and stores the result. The last
program usually runs past the end of the tensor, so every load and store is masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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
    if block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two (tl.arange needs one), "
                         f"got {block_size}")
    y = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, block_size),)             # enough programs to cover n elements
    scale_shift_kernel[grid](x, y, a, b, n, BLOCK_SIZE=block_size)
    return y


def bytes_moved(n_elements: int, dtype: torch.dtype) -> int:
    """Read x once, write y once."""
    return 2 * n_elements * torch.empty((), dtype=dtype).element_size()


def flops(n_elements: int) -> int:
    """One multiply and one add per element."""
    return 2 * n_elements
