"""Vector add, ``C = A + B``: the simplest kernel there is, and the course's bandwidth yardstick.

Per element the GPU does one addition and moves three values across the memory bus:
it reads ``A[i]`` and ``B[i]`` from DRAM and writes ``C[i]`` back. In fp16 that is
1 FLOP for 6 bytes, an arithmetic intensity of 1/6 FLOP/byte, while an H100 needs
about 20 FLOP/byte (CUDA-core fp32 peak over HBM bandwidth) before arithmetic limits
anything. So the adder units idle and the kernel runs exactly as fast as memory can
stream: the only question is how close to the datasheet bandwidth it gets.

What follows: the spec in PyTorch, the Triton kernel, and a launcher that checks its
inputs and picks the grid. The napkin math is :func:`helpers.intensity.vector_add`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_power_of_two, check_same_shape, check_tensor

# Elements per program. With Triton's default of 4 warps (128 threads) a block of 1024
# gives each thread 8 consecutive elements: 16 bytes of fp16, one 128-bit load per operand,
# the widest load there is. Smaller blocks starve the memory system with narrow loads: in
# the recorded runs (helpers/records/vector_add__*.json, 2^28 fp16 elements) blocks of 128
# and 256 reached 1,271 and 2,516 GB/s on an H100, while every block from 512 to 8192
# landed between 2,987 and 3,046 GB/s (on an H200: 1,267, 2,518, then 4,276 to 4,338).
DEFAULT_BLOCK_SIZE = 1024

# Offsets are computed in 32-bit integers (pid * BLOCK_SIZE + arange): past 2^31 - 1
# elements they would wrap around and address memory before the tensor.
MAX_ELEMENTS = 2**31 - 1


def add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The spec: what every vector add in the course must return."""
    return a + b


@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)                      # which block of the vector is mine
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements                      # the last block may hang over the end
    a = tl.load(a_ptr + offsets, mask=mask)          # read A: one trip over the bus
    b = tl.load(b_ptr + offsets, mask=mask)          # read B: a second trip
    c = a.to(tl.float32) + b.to(tl.float32)          # add in fp32 registers: free, see below
    tl.store(c_ptr + offsets, c.to(c_ptr.dtype.element_ty), mask=mask)  # write C: the third


# Why the add goes through fp32: on the GPU the conversion costs nothing (the kernel waits
# for memory anyway) and rounding the exact fp32 sum to fp16 gives the same bits as an fp16
# add. In CPU mode it is needed: Triton's interpreter adds bf16 values as raw 16-bit
# integers (NumPy has no bfloat16), which returns garbage, while its fp32 casts are exact.


def add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
        block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``a + b`` by ``add_kernel``; ``out=a`` adds in place (``A += B``).

    ``a`` and ``b`` must have the same shape and dtype, be contiguous and live where
    kernels run (``helpers.device()``). The grid has ``ceil(n / block_size)`` programs:
    one more than ``n // block_size`` whenever ``n`` is not a multiple of the block, and
    that last program is the one the mask protects.
    """
    check_tensor(a, "a", dtypes=FLOAT_DTYPES)
    check_tensor(b, "b", dtypes=FLOAT_DTYPES)
    check_same_shape(a, b, "a and b")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: convert one so both match "
                        "(this kernel does not mix precisions)")
    if out is None:
        out = torch.empty_like(a)
    else:
        check_tensor(out, "out", dtypes=(a.dtype,))
        check_same_shape(a, out, "a and out")
    check_power_of_two("block_size", block_size)
    n = a.numel()
    if n > MAX_ELEMENTS:
        raise ValueError(f"{n} elements: this kernel indexes with 32-bit offsets, which "
                         f"reach {MAX_ELEMENTS}. Split the vector into chunks.")
    if n == 0:
        return out
    grid = (triton.cdiv(n, block_size),)
    add_kernel[grid](a, b, out, n, BLOCK_SIZE=block_size)
    return out


# --------------------------------------------------------------------------------------
# A fused variant: axpy with a cast, ``z = alpha * x + y`` with x in half precision and
# y, z in fp32 (a mixed-precision update: an fp16 gradient into fp32 weights).
#
# Per element: read 2 bytes of x, read 4 of y, write 4 of z (10 bytes), and one fused
# multiply-add, 2 FLOPs. Fused, x is converted to fp32 in registers: done as PyTorch ops,
# ``x.float()`` alone would write a 4-byte copy of x and read it back, 8 more bytes.
# Still far left of the ridge point: memory-bound, so it must reach the same fraction of
# the bandwidth as the plain add (helpers/records/vector_add__*.json, key "axpy").
# --------------------------------------------------------------------------------------

AXPY_X_DTYPES = (torch.float16, torch.bfloat16)


def axpy_reference(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """The spec of the fused variant: ``alpha * x + y`` in fp32 (x converted first)."""
    return alpha * x.to(torch.float32) + y


@triton.jit
def axpy_kernel(x_ptr, y_ptr, z_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)   # 2 bytes in, fp32 in registers
    y = tl.load(y_ptr + offsets, mask=mask)                   # 4 bytes in
    tl.store(z_ptr + offsets, alpha * x + y, mask=mask)       # one FMA; 4 bytes out


def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None, *,
         block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``alpha * x + y`` by ``axpy_kernel``: ``x`` fp16 or bf16, ``y`` and the result fp32.

    Same grid as :func:`add`: ``ceil(n / block_size)`` programs, the last one masked.
    """
    check_tensor(x, "x", dtypes=AXPY_X_DTYPES)
    check_tensor(y, "y", dtypes=(torch.float32,))
    check_same_shape(x, y, "x and y")
    if out is not None:
        check_tensor(out, "out", dtypes=(torch.float32,))
        check_same_shape(y, out, "y and out")
    check_power_of_two("block_size", block_size)
    z = torch.empty_like(y) if out is None else out
    if x.numel() > MAX_ELEMENTS:   # the same 32-bit offsets as add_kernel
        raise ValueError(f"{x.numel()} elements: past {MAX_ELEMENTS} the offsets wrap around. "
                         "Split the vectors into chunks.")
    if x.numel():
        grid = (triton.cdiv(x.numel(), block_size),)
        axpy_kernel[grid](x, y, z, float(alpha), x.numel(), BLOCK_SIZE=block_size)
    return z
