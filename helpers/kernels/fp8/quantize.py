"""Quantising to FP8: an amax per group, a scale, a divide, a clamp and a cast.

The spec is :func:`helpers.kernels.fp8.formats.quantize_reference`. Three ways, by where
a group's amax can be found:

* :func:`quantize_groups_kernel`: groups of a fixed size (``1 x 128``, ``128 x 128``). One
  program holds whole groups in registers, a tile of ``TILE_M`` rows by 128 columns: the
  amax is a ``tl.max`` over the tile's rows (1 x 128: one amax a row) or over all of it
  (128 x 128), and the same registers are scaled, cast and stored. One read, one write
  of a quarter (bf16 to fp8: half) the size, plus the scales: a bandwidth-bound copy.
* :func:`quantize_rows_kernel`: one scale a row. A program owns whole rows, so the amax
  needs no other program: a loop over K finds it, a second loop reads the rows again
  (from L2, if it still holds them) and scales. One launch, no atomics.
* :func:`amax_kernel` then :func:`quantize_scaled_kernel`: one scale for the tensor, which
  no program holds, so its amax takes a pass of its own: every program reduces its share
  of the tiles in registers and folds the result into the amax with ``tl.atomic_max``
  (amax is never negative, so the float's order is its bits' order and the atomic is exact
  in any order). The scale is ``amax / max``; the second pass reads ``x`` again, from
  DRAM: two reads and a write. Per-tensor scaling pays for its single scale with that
  pass (or, in training, uses the amax of a previous step instead: *delayed* scaling,
  :func:`quantize_delayed`, one read).

Saturation: ``x / scale`` is clamped to ``[-max, max]`` before the cast, so a value past
the range (there is none right after a fresh amax, but a delayed scale can be stale)
becomes the largest number, never inf or NaN. A group of zeros gets the scale 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..checks import check_tensor
from .formats import format_of, group_shape, scale_shape

TILE_K = 128        # columns a program holds; a fixed group's width must divide into it
ROWS_1X128 = 16     # rows a program holds for 1 x 128 groups (16 groups, 16 amaxes)
ROW_TILE_K = 1024   # values of a row a program loads at a time (one scale a row)
AMAX_PROGRAMS = 1024  # programs of the per-tensor amax: each reduces many tiles itself


@triton.jit
def round_to_format(v, MANTISSA_BITS: tl.constexpr, SMALLEST_NORMAL: tl.constexpr):
    """``v`` (fp32, within the format's range) rounded to the nearest FP8 value, ties to
    even, still in fp32: the cast that follows is then exact.

    A GPU's conversion (``cvt.rn.satfinite``) rounds to nearest by itself; Triton's
    interpreter (3.7) truncates instead (1.99 becomes 1.0 in e4m3, measured), so in CPU
    mode the kernels round first (``SOFTWARE_ROUNDING``), and both modes agree with torch.
    Normal numbers: keep ``MANTISSA_BITS`` of fp32's 23, adding half a step (less one, plus
    the kept last bit: ties to even) before the cut; a carry moves into the exponent as it
    should. Below the smallest normal the step is fixed: fp32's magic-number rounding.
    """
    CUT: tl.constexpr = 23 - MANTISSA_BITS
    KEEP: tl.constexpr = 0xFFFFFFFF - ((1 << CUT) - 1)      # sign, exponent, kept mantissa
    bits = v.to(tl.uint32, bitcast=True)
    bits = bits + ((1 << (CUT - 1)) - 1) + ((bits >> CUT) & 1)
    normal = (bits & KEEP).to(tl.float32, bitcast=True)
    step = SMALLEST_NORMAL * (0.5 ** MANTISSA_BITS)
    magic = 12582912.0                                   # 1.5 * 2^23
    tiny = ((v / step + magic) - magic) * step
    return tl.where(tl.abs(v) < SMALLEST_NORMAL, tiny, normal)


@triton.jit
def quantize_groups_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sm, stride_sk,
                           FMT_MAX: tl.constexpr, MANTISSA_BITS: tl.constexpr,
                           SMALLEST_NORMAL: tl.constexpr, SOFTWARE_ROUNDING: tl.constexpr,
                           GROUP_M: tl.constexpr, TILE_M: tl.constexpr,
                           GROUP_K: tl.constexpr):
    """Groups of ``GROUP_M x GROUP_K`` (``GROUP_M`` 1: one amax a row of the tile)."""
    pid_m, pid_k = tl.program_id(axis=0), tl.program_id(axis=1)
    rows = pid_m * TILE_M + tl.arange(0, TILE_M)
    cols = pid_k * GROUP_K + tl.arange(0, GROUP_K)
    inside = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=inside,
                other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)                       # one a row
    if GROUP_M > 1:
        amax = tl.max(amax, axis=0)                        # one for the whole tile
        # div_rn: rounded as torch divides (`/` compiles to an approximate division)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, FMT_MAX), 1.0)
        q = x / scale
        tl.store(s_ptr + pid_m * stride_sm + pid_k * stride_sk, scale)
    else:
        scale = tl.where(amax > 0, tl.math.div_rn(amax, FMT_MAX), 1.0)
        q = x / scale[:, None]
        tl.store(s_ptr + rows * stride_sm + pid_k * stride_sk, scale, mask=rows < M)
    q = tl.minimum(tl.maximum(q, -FMT_MAX), FMT_MAX)       # saturate: never inf or NaN
    if SOFTWARE_ROUNDING:
        q = round_to_format(q, MANTISSA_BITS, SMALLEST_NORMAL)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :],
             q.to(q_ptr.dtype.element_ty), mask=inside)


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sm,
                         FMT_MAX: tl.constexpr, MANTISSA_BITS: tl.constexpr,
                         SMALLEST_NORMAL: tl.constexpr, SOFTWARE_ROUNDING: tl.constexpr,
                         TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """One scale a row: a program owns ``TILE_M`` whole rows, so no other program shares
    their amax. A first loop over K finds it, a second reads the rows again, scales,
    clamps, casts and stores. The second read can come from L2, since the program read the
    same bytes a moment before; whether it does depends on how many rows are in flight at
    once (16 KiB a row of 8,192 bf16 values, up to 16 programs an SM). Measured on an H200
    at 8192 x 8192 bf16: 76 us, against 59 us for 1 x 128 groups, which read once.
    """
    rows = tl.program_id(axis=0) * TILE_M + tl.arange(0, TILE_M)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_qm
    amax = tl.zeros((TILE_M,), dtype=tl.float32)
    for k in range(0, K, TILE_K):
        cols = k + tl.arange(0, TILE_K)
        inside = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    scale = tl.where(amax > 0, tl.math.div_rn(amax, FMT_MAX), 1.0)
    tl.store(s_ptr + rows * stride_sm, scale, mask=rows < M)
    for k in range(0, K, TILE_K):
        cols = k + tl.arange(0, TILE_K)
        inside = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale[:, None], -FMT_MAX), FMT_MAX)
        if SOFTWARE_ROUNDING:
            q = round_to_format(q, MANTISSA_BITS, SMALLEST_NORMAL)
        tl.store(q_rows + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _tile(tile, col_tiles, M, K, TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """Rows, columns and in-bounds mask of tile number ``tile``, row-major over the tiles."""
    rows = (tile // col_tiles) * TILE_M + tl.arange(0, TILE_M)
    cols = (tile % col_tiles) * TILE_K + tl.arange(0, TILE_K)
    return rows, cols, (rows < M)[:, None] & (cols < K)[None, :]


@triton.jit
def amax_kernel(x_ptr, amax_ptr, M, K, stride_xm, TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """Fold ``|x|``'s maximum into ``amax_ptr``. Program ``p`` of ``P`` takes tiles ``p``,
    ``p + P``, ``p + 2P``, ..., keeping an elementwise maximum in registers, and reduces it
    to one number at the end: one ``tl.atomic_max`` a program, not one a tile (thousands of
    atomics on one address queue behind each other in L2)."""
    pid, programs = tl.program_id(axis=0), tl.num_programs(axis=0)
    col_tiles = tl.cdiv(K, TILE_K)
    best = tl.zeros((TILE_M, TILE_K), dtype=tl.float32)
    for tile in range(pid, tl.cdiv(M, TILE_M) * col_tiles, programs):
        rows, cols, inside = _tile(tile, col_tiles, M, K, TILE_M, TILE_K)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :],
                    mask=inside, other=0.0)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    tl.atomic_max(amax_ptr, tl.max(tl.max(best, axis=1), axis=0))


@triton.jit
def quantize_scaled_kernel(x_ptr, q_ptr, amax_ptr, s_ptr, M, K, stride_xm, stride_qm,
                           FMT_MAX: tl.constexpr, MANTISSA_BITS: tl.constexpr,
                           SMALLEST_NORMAL: tl.constexpr, SOFTWARE_ROUNDING: tl.constexpr,
                           TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """``q = clamp(x / scale)`` with the tensor's one scale, ``amax / max`` (1 for a tensor
    of zeros), which the first program also stores."""
    rows = tl.program_id(axis=0) * TILE_M + tl.arange(0, TILE_M)
    cols = tl.program_id(axis=1) * TILE_K + tl.arange(0, TILE_K)
    inside = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=inside,
                other=0.0).to(tl.float32)
    amax = tl.load(amax_ptr)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, FMT_MAX), 1.0)
    if (tl.program_id(axis=0) == 0) & (tl.program_id(axis=1) == 0):
        tl.store(s_ptr, scale)
    q = tl.minimum(tl.maximum(x / scale, -FMT_MAX), FMT_MAX)
    if SOFTWARE_ROUNDING:
        q = round_to_format(q, MANTISSA_BITS, SMALLEST_NORMAL)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :],
             q.to(q_ptr.dtype.element_ty), mask=inside)


@triton.jit
def quantize_delayed_kernel(x_ptr, q_ptr, s_ptr, amax_ptr, M, K, stride_xm, stride_qm,
                            FMT_MAX: tl.constexpr, MANTISSA_BITS: tl.constexpr,
                            SMALLEST_NORMAL: tl.constexpr, SOFTWARE_ROUNDING: tl.constexpr,
                            TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """Delayed scaling: ``q = clamp(x / scale)`` with a scale chosen before this tensor was
    seen, and this tensor's amax folded into ``amax_ptr`` on the way, for the next scale.
    One read and one write. Tiles are shared out as in :func:`amax_kernel`: each program
    keeps its elementwise maximum in registers and adds one atomic at the end."""
    pid, programs = tl.program_id(axis=0), tl.num_programs(axis=0)
    col_tiles = tl.cdiv(K, TILE_K)
    scale = tl.load(s_ptr)
    best = tl.zeros((TILE_M, TILE_K), dtype=tl.float32)
    for tile in range(pid, tl.cdiv(M, TILE_M) * col_tiles, programs):
        rows, cols, inside = _tile(tile, col_tiles, M, K, TILE_M, TILE_K)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :],
                    mask=inside, other=0.0).to(tl.float32)
        best = tl.maximum(best, tl.abs(x))
        q = tl.minimum(tl.maximum(x / scale, -FMT_MAX), FMT_MAX)    # a stale scale saturates
        if SOFTWARE_ROUNDING:
            q = round_to_format(q, MANTISSA_BITS, SMALLEST_NORMAL)
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :],
                 q.to(q_ptr.dtype.element_ty), mask=inside)
    tl.atomic_max(amax_ptr, tl.max(tl.max(best, axis=1), axis=0))


def quantize(x: torch.Tensor, granularity: str = "1x128", fmt="e4m3"):
    """``(q, scale)`` as :func:`~helpers.kernels.fp8.formats.quantize_reference` gives them,
    by the kernels above. ``x`` is 2-D with contiguous rows (fp32, fp16 or bf16)."""
    fmt = format_of(fmt)
    check_tensor(x, "x", dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=2,
                 contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x's rows must be contiguous (stride 1 along them); got strides "
                         f"{x.stride()}. Pass x.contiguous().")
    M, K = x.shape
    gm, gk = group_shape(granularity, (M, K))
    rounding = {"FMT_MAX": fmt.max, "MANTISSA_BITS": fmt.mantissa_bits,
                "SMALLEST_NORMAL": fmt.smallest_normal, "SOFTWARE_ROUNDING": runtime.is_cpu()}
    q = torch.empty((M, K), device=x.device, dtype=fmt.dtype)
    sm, sk = scale_shape(granularity, (M, K))
    # 1 x 128 scales column-major (a transposed view): the matmul reads one K block's
    # scales for a tile's rows side by side (helpers.kernels.fp8.persistent).
    scale = (torch.ones((sk, sm), device=x.device, dtype=torch.float32).T
             if granularity == "1x128" else
             torch.ones((sm, sk), device=x.device, dtype=torch.float32))
    if x.numel() == 0:
        return q, scale
    if granularity in ("1x128", "128x128"):
        tile_m = ROWS_1X128 if gm == 1 else gm
        grid = (triton.cdiv(M, tile_m), triton.cdiv(K, gk))
        quantize_groups_kernel[grid](x, q, scale, M, K, x.stride(0), q.stride(0),
                                     *scale.stride(), GROUP_M=gm, TILE_M=tile_m, GROUP_K=gk,
                                     **rounding)
        return q, scale
    if granularity == "row":
        tile_k = min(ROW_TILE_K, triton.next_power_of_2(K))
        tile_m = ROW_TILE_K // tile_k          # short rows: several a program
        quantize_rows_kernel[(triton.cdiv(M, tile_m),)](
            x, q, scale, M, K, x.stride(0), q.stride(0), scale.stride(0), TILE_M=tile_m,
            TILE_K=tile_k, **rounding)
        return q, scale
    amax = torch.zeros(1, device=x.device, dtype=torch.float32)
    tile_m = 16 if runtime.is_cpu() else 32
    grid = (triton.cdiv(M, tile_m), triton.cdiv(K, TILE_K))
    amax_kernel[(min(grid[0] * grid[1], AMAX_PROGRAMS),)](x, amax, M, K, x.stride(0),
                                                          TILE_M=tile_m, TILE_K=TILE_K)
    quantize_scaled_kernel[grid](x, q, amax, scale, M, K, x.stride(0), q.stride(0),
                                 TILE_M=tile_m, TILE_K=TILE_K, **rounding)
    return q, scale


def quantize_delayed(x: torch.Tensor, scale: torch.Tensor, fmt="e4m3"):
    """Per-tensor quantisation with a **delayed** scale: ``(q, amax)``.

    ``scale`` (a one-element fp32 tensor on ``x``'s device) was chosen before ``x`` was
    seen, from the amax of earlier steps (``amax / fmt.max``, as Transformer Engine's
    ``DelayedScaling`` keeps a short history of them); ``q = clamp(x / scale)``, so a value
    past ``scale * max`` saturates to the largest number, never inf. ``amax`` is ``x``'s
    own, measured in the same pass, for the history. One read of ``x`` and one write,
    against :func:`quantize`'s two reads for a fresh per-tensor scale. The scale's value is
    not checked (that would wait for the GPU): a scale of 0, negative or NaN gives values
    that mean nothing."""
    fmt = format_of(fmt)
    check_tensor(x, "x", dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=2,
                 contiguous=False)
    check_tensor(scale, "scale", dtypes=(torch.float32,), contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x's rows must be contiguous (stride 1 along them); got strides "
                         f"{x.stride()}. Pass x.contiguous().")
    if scale.numel() != 1:
        raise ValueError(f"a delayed scale is one number for the whole tensor; got scale of "
                         f"shape {tuple(scale.shape)}. For scales per row or block, use "
                         f"quantize(x, granularity), which finds them itself.")
    M, K = x.shape
    q = torch.empty((M, K), device=x.device, dtype=fmt.dtype)
    amax = torch.zeros(1, device=x.device, dtype=torch.float32)
    if x.numel() == 0:
        return q, amax
    tile_m = 16 if runtime.is_cpu() else 32
    tiles = triton.cdiv(M, tile_m) * triton.cdiv(K, TILE_K)
    quantize_delayed_kernel[(min(tiles, AMAX_PROGRAMS),)](
        x, q, scale, amax, M, K, x.stride(0), q.stride(0), TILE_M=tile_m, TILE_K=TILE_K,
        FMT_MAX=fmt.max, MANTISSA_BITS=fmt.mantissa_bits, SMALLEST_NORMAL=fmt.smallest_normal,
        SOFTWARE_ROUNDING=runtime.is_cpu())
    return q, amax
