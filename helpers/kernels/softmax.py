"""Row softmax, lesson 05's first fusion: five PyTorch kernels versus one Triton kernel.

``softmax(x)[i, j] = exp(x[i, j] - max_j x[i, :]) / sum_j exp(x[i, j] - max_j x[i, :])``

Subtracting the row's maximum first changes nothing mathematically (it cancels in the
ratio) but keeps ``exp`` from overflowing: every exponent is <= 0, so every term is <= 1.

The versions, read top to bottom:

* :func:`naive_softmax`: the formula as five PyTorch ops. Each op is one kernel, and
  each kernel reads its input from DRAM (HBM) and writes its output back, so the row
  crosses the bus eight times. Triton's fused-softmax tutorial counts it: read
  ``5MN + 2M`` elements, write ``3MN + 2M``
  (https://triton-lang.org/main/getting-started/tutorials/02-fused-softmax.html).
* :func:`softmax_kernel_v1`: one program per row holds the whole row in registers,
  so the max, the exponentials and the sum never leave the chip: read ``MN``,
  write ``MN``. It needs the row to fit: ``BLOCK_SIZE`` is the row length rounded up to
  a power of two, and past a few tens of thousands of elements the registers run out.
* :func:`softmax_kernel_online`: for rows that do not fit. It walks the row in blocks
  twice: the first pass keeps a running maximum and a running sum (the *online
  softmax*, the trick FlashAttention builds on in lesson 06), the second writes the
  output. Read ``2MN``, write ``MN``: one extra read of the row, still far from eight.

:func:`softmax` picks between the last two by row length. The napkin math of all three
is :func:`helpers.intensity.softmax` (``version="naive"``, ``"fused"``, ``"online"``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_power_of_two, check_tensor

# The longest row (in elements, after rounding up to a power of two) that the
# row-in-registers kernel takes in `softmax(x)`: beyond it, the online kernel.
# Chosen from the long-rows sweep of the fusion experiment (helpers.experiments.fusion).
MAX_FUSED_BLOCK = 32768

# Triton refuses blocks of more than 2**20 elements in one tensor.
MAX_BLOCK = triton.language.TRITON_MAX_TENSOR_NUMEL

# The online kernel's block: 4096 elements of fp16 is 8 KiB per load per program.
ONLINE_BLOCK = 4096

# (atol, rtol) per dtype: |got - reference| <= atol + rtol * |reference|. The kernels
# compute in fp32 and round once, so the error is set by the output's format: rtol is
# two units in the last place (fp16 keeps 11 significant bits, bf16 8; and Triton's
# interpreter rounds fp32 -> bf16 toward zero where the GPU rounds to nearest), atol
# covers outputs too small for the format's normal range.
TOLERANCES = {
    torch.float32: (1e-7, 1e-5),
    torch.float16: (1e-6, 2 * 2.0**-10),
    torch.bfloat16: (1e-6, 2 * 2.0**-7),
}

# The lowest finite fp32 number: the online kernel's "no maximum yet". Starting from
# -inf instead would give exp(-inf - (-inf)) = exp(nan) on lanes that see only
# masked (-inf) elements.
_FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)


# --------------------------------------------------------------------------------------
# The spec, and the unfused version.
# --------------------------------------------------------------------------------------


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """The spec: softmax over the last dimension, computed in fp32, rounded once."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax as five PyTorch ops on an ``M x N`` matrix: five kernels, five round trips.

    Element counts per op as Triton's tutorial gives them (``amax`` returns only the
    values; ``max(dim=1)`` would also write ``M`` int64 indices).
    """
    x_max = x.amax(dim=1)                     # read MN,     write M
    z = x - x_max[:, None]                    # read MN + M, write MN
    numerator = torch.exp(z)                  # read MN,     write MN
    denominator = numerator.sum(dim=1)        # read MN,     write M
    return numerator / denominator[:, None]   # read MN + M, write MN
    # total: read 5MN + 2M, write 3MN + 2M elements


def naive_softmax_keepdim(x: torch.Tensor) -> torch.Tensor:
    """:func:`naive_softmax` spelled with ``keepdim=True``: the same five ops and bytes in
    eager mode, but the graph ``torch.compile`` sees is amax(keepdim) -> sub -> exp ->
    sum(keepdim), the pattern Inductor rewrites into an online softmax on a GPU
    (``torch._inductor.config.online_softmax``). ``[:, None]`` after a plain ``amax`` adds
    an unsqueeze between the ops, and the pattern no longer matches."""
    x_max = x.amax(dim=1, keepdim=True)
    numerator = torch.exp(x - x_max)
    return numerator / numerator.sum(dim=1, keepdim=True)


# --------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def softmax_kernel_v1(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                      BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)        # one program per row; 64-bit row offsets
    cols = tl.arange(0, BLOCK_SIZE)            # BLOCK_SIZE >= n_cols: the whole row at once
    mask = cols < n_cols
    # The only read of the row from DRAM. Lanes past the end get -inf: they cannot be the
    # maximum, and exp(-inf) = 0 adds nothing to the sum.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)                       # the arithmetic runs in fp32 registers
    x_max = tl.max(x, axis=0)                  # a reduction across the program's threads
    numerator = tl.exp(x - x_max)              # still in registers: no round trip
    denominator = tl.sum(numerator, axis=0)
    y = numerator * (1.0 / denominator)        # one division per row, a multiply per element
    # The only write: MN elements in, MN out, against 8MN for the five-kernel version.
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel_online(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                          BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    lanes = tl.arange(0, BLOCK_SIZE)
    # Pass 1: every lane keeps its own running maximum m and running sum d of exp(x - m).
    # When a larger value arrives, the old sum is rescaled by exp(m_old - m_new): the
    # online-softmax update. Nothing but these two vectors stays on chip.
    m = tl.full([BLOCK_SIZE], _FP32_LOWEST, tl.float32)
    d = tl.zeros([BLOCK_SIZE], tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + lanes
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        d = d * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    # Merge the lanes with the same rule: rescale every lane's sum to the row's maximum.
    row_max = tl.max(m, axis=0)
    inv_sum = 1.0 / tl.sum(d * tl.exp(m - row_max), axis=0)
    # Pass 2: the row is read a second time (the price of not fitting) and written once.
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + lanes
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - row_max) * inv_sum
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------
# Launchers.
# --------------------------------------------------------------------------------------


def num_warps_for(block_size: int) -> int:
    """Warps per program for a row block, from the fusion experiment's ``softmax_warps``
    sweep (M = 4096, fp16; helpers/records/fusion__H100-SXM.json, made on an H100).

    Rows of a few thousand elements want few warps: at N = 1024, 4 warps moved 1,594 GB/s
    and 16 warps 935; at N = 4096, 2,453 against 2,238. Spread over more threads, the row
    leaves each thread one or two vectors of work while the two reductions (max and sum)
    still cross every warp. At N = 8192, 4, 8 and 16 warps tie (2,656 to 2,663 GB/s). Long
    rows want many: at N = 16384, 32 warps reached 2,831 GB/s and 4 warps 2,628, whose
    threads each had to hold 128 values. With this rule a thread holds 8 to 32 fp32 values
    of the row.
    """
    if block_size <= 4096:
        return 4
    if block_size <= 8192:
        return 16
    return 32


def _check_input(x: torch.Tensor) -> tuple[int, int]:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension: softmax runs along the last one")
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: a softmax over zero elements is "
                         "undefined")
    return x.numel() // n_cols, n_cols


def _launch_rows(kernel, x: torch.Tensor, rows: int, n_cols: int, block: int,
                 num_warps: int | None) -> torch.Tensor:
    """One program per row of ``x`` viewed as ``rows x n_cols``, blocks of ``block``."""
    num_warps = num_warps or num_warps_for(block)
    check_power_of_two("num_warps", num_warps)
    x2 = x.view(rows, n_cols)
    y = torch.empty_like(x2)
    if rows:
        kernel[(rows,)](x2, y, n_cols, x2.stride(0), y.stride(0), BLOCK_SIZE=block,
                        num_warps=num_warps)
    return y.view(x.shape)


def softmax_v1(x: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension with :func:`softmax_kernel_v1`: one program per row,
    the whole row in registers."""
    rows, n_cols = _check_input(x)
    block = triton.next_power_of_2(n_cols)
    if block > MAX_BLOCK:
        raise ValueError(f"rows of {n_cols} elements need a block of {block}; Triton allows at "
                         f"most {MAX_BLOCK} elements per block. Use softmax_online(x).")
    return _launch_rows(softmax_kernel_v1, x, rows, n_cols, block, num_warps)


def softmax_online(x: torch.Tensor, block_size: int = ONLINE_BLOCK,
                   num_warps: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension with :func:`softmax_kernel_online`: the row is
    walked in blocks of ``block_size``, twice, so any row length works."""
    rows, n_cols = _check_input(x)
    check_power_of_two("block_size", block_size)
    block = min(block_size, triton.next_power_of_2(n_cols))
    return _launch_rows(softmax_kernel_online, x, rows, n_cols, block, num_warps)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a contiguous tensor, in one kernel.

    Rows up to :data:`MAX_FUSED_BLOCK` elements stay in registers (read once); longer
    rows take the online kernel (read twice).
    """
    _, n_cols = _check_input(x)
    if triton.next_power_of_2(n_cols) <= MAX_FUSED_BLOCK:
        return softmax_v1(x)
    return softmax_online(x)
