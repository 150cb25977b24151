"""Elementwise chains, lesson 05's second fusion: bias + GELU, and SwiGLU.

Both are what a transformer's MLP does right after a matrix product, on a tensor of
``M`` tokens by ``N`` features:

* **bias + GELU**: ``y = gelu(x + bias)``, the bias broadcast along the rows. GELU is
  the tanh approximation (GPT-2's), ``0.5 t (1 + tanh(sqrt(2/pi) (t + 0.044715 t^3)))``.
  In PyTorch it is two kernels: the add writes ``x + bias`` to DRAM and GELU reads it
  straight back, so ``4MN`` elements cross the bus. Fused, ``x`` is read once and ``y``
  written once: ``2MN``, half the traffic, and the same arithmetic.
* **SwiGLU**: ``y = silu(gate) * up`` (Llama's MLP). PyTorch runs SiLU (read ``MN``,
  write ``MN``) then the product (read ``2MN``, write ``MN``): ``5MN``. Fused: ``3MN``.

For both, the arithmetic is a handful of FLOPs per element against several bytes: far
left of the ridge point, so time is bytes divided by bandwidth and the predicted
speed-up of fusion is simply the ratio of bytes.

Two bias + GELU kernels show one more thing: measure before you optimise.
:func:`bias_gelu_kernel_v1` treats the tensor as one flat array and finds each
element's bias with ``offsets % n_cols``, an integer remainder by a number known only
at run time, which costs a few dozen integer instructions per element.
:func:`bias_gelu_kernel_v2` removes them: it tiles the matrix in 2-D, loads a tile's
bias once and broadcasts it down the tile's rows. It is *not* faster. The fusion
experiment recorded 2,838 GB/s for v1 and 2,701 GB/s for v2 on an H100 (4096 x 16384,
bf16; helpers/records/fusion__H100-SXM.json; 3,812 and 3,632 on an H200): the integer work hides under the memory time, as all arithmetic does in a
memory-bound kernel. So :func:`bias_gelu` launches the simpler v1 (and Inductor, shown
in the lesson, generates the same flat kernel with the same remainder).

The flat kernel, its GELU and its spec are lesson 01's (:mod:`helpers.kernels.memory_wall`,
where the fusion was previewed): this module imports them rather than keeping a copy.
The napkin math is :func:`helpers.intensity.bias_gelu` and :func:`helpers.intensity.swiglu`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_power_of_two, check_tensor
from .memory_wall import _gelu_tanh, bias_gelu_fused
from .memory_wall import bias_gelu_reference  # noqa: F401  -- lesson 05 reads its spec here
# v1, the flat kernel: lesson 01's fused bias + GELU, one program per BLOCK_SIZE elements.
from .memory_wall import bias_gelu_fused_kernel as bias_gelu_kernel_v1  # noqa: F401

# Offsets in these kernels are 32-bit: at most 2**31 - 1 elements (4 GiB of bf16).
MAX_ELEMENTS = 2**31 - 1

# Elements per program. Each thread then handles BLOCK / (32 * num_warps) elements: with
# 4096 and 8 warps, 16 elements, two 16-byte loads of bf16 in flight per thread.
BLOCK_SIZE = 4096
NUM_WARPS = 8
# v2's tile: up to 1024 columns wide, as many rows as make BLOCK_SIZE elements.
MAX_BLOCK_N = 1024

# (atol, rtol) per dtype: |got - reference| <= atol + rtol * |reference|. One rounding
# of an fp32 result to the output format, so rtol is two units in the last place (the
# interpreter rounds fp32 -> bf16 toward zero, the GPU to nearest); atol covers the
# outputs near zero, where GELU flattens out.
TOLERANCES = {
    torch.float32: (1e-6, 1e-5),
    torch.float16: (1e-5, 2 * 2.0**-10),
    torch.bfloat16: (1e-5, 2 * 2.0**-7),
}


# --------------------------------------------------------------------------------------
# Specs and the unfused versions.
# --------------------------------------------------------------------------------------


def bias_gelu_eager(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x + bias)`` as a model writes it in PyTorch: two kernels."""
    t = x + bias                                                # read MN + N, write MN
    return torch.nn.functional.gelu(t, approximate="tanh")      # read MN,     write MN


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)


def swiglu_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in PyTorch: two kernels."""
    s = torch.nn.functional.silu(gate)                          # read MN,  write MN
    return s * up                                               # read 2MN, write MN


# --------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def bias_gelu_kernel_v2(x_ptr, b_ptr, y_ptr, n_rows, n_cols,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # a BLOCK_M x BLOCK_N tile
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    # The tile's bias, loaded once and broadcast down its BLOCK_M rows.
    b = tl.load(b_ptr + cols, mask=col_mask).to(tl.float32)
    offsets = rows[:, None] * n_cols + cols[None, :]   # one multiply-add per element
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)      # read x once
    y = _gelu_tanh(x + b[None, :])                              # add and GELU in registers
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # write y once


@triton.jit
def swiglu_kernel(gate_ptr, up_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    g = tl.load(gate_ptr + offsets, mask=mask).to(tl.float32)   # read gate once
    u = tl.load(up_ptr + offsets, mask=mask).to(tl.float32)     # read up once
    y = g / (1.0 + tl.exp(-g)) * u          # silu(gate) * up: silu(g) never reaches DRAM
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # write y once


# --------------------------------------------------------------------------------------
# Launchers.
# --------------------------------------------------------------------------------------


def _check_bias_input(x: torch.Tensor, bias: torch.Tensor) -> tuple[int, int]:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    check_tensor(bias, "bias", dtypes=(x.dtype,), ndim=1)
    if x.dim() < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have one entry per column of x (its last dimension): "
                         f"x has shape {tuple(x.shape)}, bias {tuple(bias.shape)}")
    if x.numel() > MAX_ELEMENTS:
        raise ValueError(f"x has {x.numel()} elements; these kernels use 32-bit offsets and "
                         f"take at most {MAX_ELEMENTS}")
    n_cols = x.shape[-1]
    return (x.numel() // n_cols if n_cols else 0), n_cols


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, block_size: int = BLOCK_SIZE,
              num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``gelu(x + bias)`` in one kernel over the flat tensor (:func:`bias_gelu_kernel_v1`).

    Each element finds its column by an integer remainder, ``offsets % n_cols``: a few
    dozen integer instructions, hidden under the memory time.
    """
    _check_bias_input(x, bias)
    return bias_gelu_fused(x, bias, block_size, num_warps)


def bias_gelu_v2(x: torch.Tensor, bias: torch.Tensor, block_size: int = BLOCK_SIZE,
                 num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``gelu(x + bias)`` over 2-D tiles, the bias loaded once per tile
    (:func:`bias_gelu_kernel_v2`)."""
    n_rows, n_cols = _check_bias_input(x, bias)
    check_power_of_two("block_size", block_size)
    y = torch.empty_like(x)
    if x.numel() == 0:
        return y
    block_n = min(triton.next_power_of_2(n_cols), MAX_BLOCK_N, block_size)
    block_m = block_size // block_n
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
    bias_gelu_kernel_v2[grid](x, bias, y, n_rows, n_cols, BLOCK_M=block_m, BLOCK_N=block_n,
                              num_warps=num_warps)
    return y


def swiglu(gate: torch.Tensor, up: torch.Tensor, block_size: int = BLOCK_SIZE,
           num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``silu(gate) * up`` in one kernel."""
    check_tensor(gate, "gate", dtypes=FLOAT_DTYPES)
    check_tensor(up, "up", dtypes=(gate.dtype,))
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and "
                         f"{tuple(up.shape)}")
    if gate.numel() > MAX_ELEMENTS:
        raise ValueError(f"gate has {gate.numel()} elements; at most {MAX_ELEMENTS}")
    check_power_of_two("block_size", block_size)
    y = torch.empty_like(gate)
    n = gate.numel()
    if n:
        swiglu_kernel[(triton.cdiv(n, block_size),)](gate, up, y, n, BLOCK_SIZE=block_size,
                                                    num_warps=num_warps)
    return y
