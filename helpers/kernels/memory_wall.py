"""Lesson 01's kernels: ops that do little arithmetic on a lot of data.

Each kernel here streams its data through the chip once, so the time it takes is set
by how fast DRAM can deliver bytes, not by the arithmetic:

1. ``copy``: read every element, write it back. Zero FLOPs: the purest bandwidth test.
2. ``gelu``: the tanh-approximated GELU activation, 8 FLOPs per element, still the
   same bytes as a copy.
3. ``row_sum``: a reduction. Each program sums one row, looping over it in blocks.
4. ``fma_chain``: a copy that does ``iters`` multiply-adds on every element on the
   way through. Sweeping ``iters`` shows how much arithmetic rides free on the bytes.
5. ``bias_add`` then ``gelu`` (two kernels, the intermediate goes to DRAM and comes
   back) versus ``bias_gelu_fused`` (one kernel, the intermediate never leaves the
   registers): the fusion preview.

Every op has a PyTorch reference (the spec) and a launcher that checks its inputs and
picks the grid. Their napkin math is in :mod:`helpers.intensity` (``copy``, ``gelu``,
``row_sum``, ``fma_chain``, ``bias_add``, ``bias_gelu``). Lesson 05's fusion module
(:mod:`helpers.kernels.gelu`) reuses the GELU and the fused bias + GELU kernel from here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_num_warps, check_power_of_two, check_same_shape, check_tensor

# Offsets below are 32-bit integers: enough for 2**31 - 1 elements (8 GiB of fp32).
MAX_ELEMENTS = 2**31 - 1

# Launch configuration of the streaming kernels: each program moves BLOCK_SIZE
# elements with NUM_WARPS warps (32 threads each), so a thread handles
# BLOCK_SIZE / (32 * NUM_WARPS) elements: 4 fp32 values, one 16-byte load each way.
# Measured (memory_wall records, copy_configs, 2 GiB moved): on an H100, 1024 x 8 warps
# copied at 3,014 GB/s (512 x 4 as fast), every block of 2048 to 16384 elements at
# 2,961-3,007 GB/s; on an H200, 4,272 GB/s against 4,057-4,145. Small blocks make many
# programs, and the GPU keeps more of them in flight at once.
BLOCK_SIZE = 1024
NUM_WARPS = 8

# 0.5 * (1 + tanh(u)) == sigmoid(2u), so the tanh-GELU is x * sigmoid(2u) with
# u = sqrt(2/pi) * (x + 0.044715 x^3). We fold 2 * sqrt(2/pi) into one constant.
# (Triton kernels may read globals only when they are tl.constexpr.)
_GELU_C = tl.constexpr(0.044715)
_GELU_2K = tl.constexpr(2 * (2 / 3.141592653589793) ** 0.5)

# The multiply-add of fma_chain: y <- a * y + b keeps |y| bounded for these values, so a
# long chain neither overflows nor collapses to a constant the compiler could fold.
FMA_A = 0.999
FMA_B = 0.001


# --------------------------------------------------------------------------------------
# References: the spec each kernel must match.
# --------------------------------------------------------------------------------------


def copy_reference(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)


def row_sum_reference(x: torch.Tensor) -> torch.Tensor:
    return x.float().sum(dim=1)


def fma_chain_reference(x: torch.Tensor, iters: int, a: float = FMA_A,
                        b: float = FMA_B) -> torch.Tensor:
    y = x.float()
    for _ in range(iters):
        y = y * a + b
    return y.to(x.dtype)


def bias_add_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (x.float() + bias.float()).to(x.dtype)


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x.float() + bias.float(), approximate="tanh").to(x.dtype)


# --------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def copy_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements              # the last block hangs over the end
    x = tl.load(x_ptr + offsets, mask=mask)  # DRAM -> registers, 16 bytes per load
    tl.store(y_ptr + offsets, x, mask=mask)  # registers -> DRAM; no arithmetic at all


@triton.jit
def _gelu_tanh(x):
    # x is fp32 in registers; every FLOP here is free next to the bytes that fed it.
    u2 = _GELU_2K * (x + _GELU_C * x * x * x)
    return x / (1.0 + tl.exp(-u2))


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # read x once
    y = _gelu_tanh(x)                                        # 8 FLOPs, in registers
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # write y once


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, row_stride, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)                     # one program per row
    row_ptr = x_ptr + row.to(tl.int64) * row_stride  # 64-bit: rows * stride can pass 2**31
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)  # partial sums stay in registers
    for start in range(0, n_cols, BLOCK_SIZE):      # walk the row block by block
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
        acc += x.to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))    # one number per row goes back out


@triton.jit
def fma_chain_kernel(x_ptr, y_ptr, n_elements, iters, a, b, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    y = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # the same bytes as a copy...
    for _ in range(iters):                                  # ...plus 2 * iters FLOPs each,
        y = y * a + b                                       # one fused multiply-add a step
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bias_add_kernel(x_ptr, b_ptr, y_ptr, n_elements, n_cols, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offsets % n_cols, mask=mask).to(tl.float32)  # tiny, stays in cache
    tl.store(y_ptr + offsets, (x + b).to(y_ptr.dtype.element_ty), mask=mask)  # to DRAM...


@triton.jit
def bias_gelu_fused_kernel(x_ptr, b_ptr, y_ptr, n_elements, n_cols, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offsets % n_cols, mask=mask).to(tl.float32)
    t = x + b                 # the intermediate lives in registers only: no DRAM round trip
    tl.store(y_ptr + offsets, _gelu_tanh(t).to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------
# Launchers: check, allocate, pick the grid, launch.
# --------------------------------------------------------------------------------------


def _check_block(block_size: int, num_warps: int) -> None:
    check_power_of_two("block_size", block_size)
    check_num_warps(num_warps)


def _launch_flat(kernel, n: int, block_size: int, num_warps: int, *args) -> None:
    """Start ``ceil(n / block_size)`` programs of a kernel that walks a flat array."""
    if n:
        kernel[(triton.cdiv(n, block_size),)](*args, BLOCK_SIZE=block_size, num_warps=num_warps)


def _check_stream_input(x: torch.Tensor, name: str = "x") -> None:
    check_tensor(x, name, dtypes=FLOAT_DTYPES)
    if x.numel() > MAX_ELEMENTS:
        raise ValueError(f"{name} has {x.numel()} elements; these kernels use 32-bit offsets "
                         f"and take at most {MAX_ELEMENTS}")


def _stream(kernel, x: torch.Tensor, block_size: int, num_warps: int,
            out: torch.Tensor | None) -> torch.Tensor:
    """Check, allocate and launch one elementwise kernel over every element of ``x``."""
    _check_stream_input(x)
    _check_block(block_size, num_warps)
    y = _out_like(x, out)
    _launch_flat(kernel, x.numel(), block_size, num_warps, x, y, x.numel())
    return y


def copy(x: torch.Tensor, block_size: int = BLOCK_SIZE, num_warps: int = NUM_WARPS,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x`` through :func:`copy_kernel`. ``out`` reuses a buffer (for timing)."""
    return _stream(copy_kernel, x, block_size, num_warps, out)


def gelu(x: torch.Tensor, block_size: int = BLOCK_SIZE, num_warps: int = NUM_WARPS,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """The tanh-approximated GELU of every element, computed in fp32."""
    return _stream(gelu_kernel, x, block_size, num_warps, out)


def row_sum(x: torch.Tensor, block_size: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """Sum each row of a 2-D tensor into fp32: one program per row.

    ``block_size`` defaults to the row length rounded up to a power of two, capped at
    4096 elements: longer rows are walked in several blocks.
    """
    check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    if x.stride(1) != 1:
        raise ValueError("x's rows must be contiguous (x.stride(1) == 1); pass x.contiguous()")
    rows, cols = x.shape
    if block_size is None:
        block_size = min(triton.next_power_of_2(max(cols, 1)), 4096)
    _check_block(block_size, num_warps)
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return out
    if cols == 0:
        return out.zero_()
    row_sum_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK_SIZE=block_size,
                            num_warps=num_warps)
    return out


def fma_chain(x: torch.Tensor, iters: int, block_size: int = BLOCK_SIZE,
              num_warps: int = NUM_WARPS, out: torch.Tensor | None = None) -> torch.Tensor:
    """``iters`` steps of ``y = a * y + b`` on every element, read and written once."""
    _check_stream_input(x)
    _check_block(block_size, num_warps)
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a whole number >= 0, got {iters!r}")
    y = _out_like(x, out)
    _launch_flat(fma_chain_kernel, x.numel(), block_size, num_warps, x, y, x.numel(), iters,
                 FMA_A, FMA_B)
    return y


def _check_bias(x: torch.Tensor, bias: torch.Tensor) -> int:
    _check_stream_input(x)
    check_tensor(bias, "bias", dtypes=(x.dtype,), ndim=1)  # one dtype for both, like torch
    if x.dim() == 0 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have one entry per column of x: x has shape "
                         f"{tuple(x.shape)}, bias {tuple(bias.shape)}")
    return x.shape[-1]


def bias_add(x: torch.Tensor, bias: torch.Tensor, block_size: int = BLOCK_SIZE,
             num_warps: int = NUM_WARPS, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + bias``, the bias broadcast along the last dimension."""
    n_cols = _check_bias(x, bias)
    _check_block(block_size, num_warps)
    y = _out_like(x, out)
    _launch_flat(bias_add_kernel, x.numel(), block_size, num_warps, x, bias, y, x.numel(), n_cols)
    return y


def bias_gelu_unfused(x: torch.Tensor, bias: torch.Tensor, block_size: int = BLOCK_SIZE,
                      num_warps: int = NUM_WARPS, tmp: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(x + bias)`` as two kernels: the sum is written to DRAM, then read back."""
    t = bias_add(x, bias, block_size, num_warps, out=tmp)
    return gelu(t, block_size, num_warps, out=out)


def bias_gelu_fused(x: torch.Tensor, bias: torch.Tensor, block_size: int = BLOCK_SIZE,
                    num_warps: int = NUM_WARPS, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(x + bias)`` as one kernel: read x once, write y once."""
    n_cols = _check_bias(x, bias)
    _check_block(block_size, num_warps)
    y = _out_like(x, out)
    _launch_flat(bias_gelu_fused_kernel, x.numel(), block_size, num_warps, x, bias, y, x.numel(),
                 n_cols)
    return y


def _out_like(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty_like(x)
    check_tensor(out, "out", dtypes=(x.dtype,))
    check_same_shape(x, out, "x and out")
    return out
