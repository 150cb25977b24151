"""Lesson 01's second set of kernels: how fast each level of memory delivers, and in what order.

1. ``read_loop``: read a buffer ``passes`` times over, in **one** launch, and keep one sum
   per program. When the buffer fits in L2, every pass after the first is served by L2,
   so the launch time stops mattering and the rate is L2's own. The loads carry
   ``cache_modifier=".cg"`` ("cache global": cache in L2, not in the SM's L1), so a
   program that meets its own blocks again on the next pass cannot be served by L1.
2. Copies of an ``M x N`` row-major matrix that move the same bytes in different orders:

   * ``copy_rows``: each program copies ``BLOCK`` neighbours of one row. The 32 threads
     of a warp touch 32 neighbouring words: their loads **coalesce** into a few 32-byte
     sectors, every byte of which is used.
   * ``copy_cols``: each program copies ``BLOCK`` elements of one column. Neighbouring
     threads touch words ``N`` elements apart: one sector per thread, of which 4 bytes (one
     fp32) are used.
   * ``transpose_strips``: ``y = x.T`` from strips of a row: coalesced reads, strided
     writes (column ``j`` of ``y`` is written down a column).
   * ``transpose_tiles``: ``y = x.T`` by 2-D tiles. Triton picks the register layout of
     each load and store from its addresses: the tile is read along rows, and the compiler
     rearranges it through shared memory so that the store runs along the rows of ``y``.
     Both sides coalesce.

Their napkin math is simple: every copy and transpose reads ``M N`` elements and writes
``M N`` (:func:`bytes_moved`); ``read_loop`` reads ``passes`` times the buffer and writes
one fp32 per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dtypes import FLOAT_DTYPES
from .checks import check_num_warps, check_power_of_two, check_tensor

# read_loop: each program reads BLOCK fp32 (8 KiB) per step, 16 values per thread with 4
# warps: four 16-byte loads in flight per thread. Eight programs per SM keep 32 warps and
# 64 KiB of loads in flight on each SM, enough to cover L2's latency.
READ_BLOCK = 2048
READ_WARPS = 4
PROGRAMS_PER_SM = 8

# The copies: a program moves BLOCK elements (4 KiB of fp32); the tiled transpose a
# TILE x TILE tile.
BLOCK = 1024
TILE = 64
NUM_WARPS = 4
MAX_GRID_Y = 65535                    # CUDA's limit on the second grid axis


# --------------------------------------------------------------------------------------
# References.
# --------------------------------------------------------------------------------------


def read_loop_reference(x: torch.Tensor, programs: int, passes: int,
                        block: int = READ_BLOCK) -> torch.Tensor:
    """What ``read_loop`` returns: program ``p`` sums blocks ``p, p + programs, ...`` of
    ``x`` (the last block padded with zeros), ``passes`` times over, in fp64 here."""
    n_blocks = triton.cdiv(x.numel(), block)
    padded = torch.zeros(n_blocks * block, dtype=torch.float64, device=x.device)
    padded[: x.numel()] = x.double().flatten()
    per_block = padded.view(n_blocks, block).sum(dim=1)
    out = torch.zeros(programs, dtype=torch.float64, device=x.device)
    out.index_add_(0, torch.arange(n_blocks, device=x.device) % programs, per_block)
    return passes * out


def transpose_reference(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


def bytes_moved(m: int, n: int, dtype) -> int:
    """A copy or a transpose of an ``m x n`` matrix: read every element once, write it once."""
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


# --------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def read_loop_kernel(x_ptr, out_ptr, n_elements, passes, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    n_blocks = tl.cdiv(n_elements, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(passes):                          # the whole buffer, pass after pass
        for b in range(pid, n_blocks, programs):     # this program's share of each pass
            offs = b * BLOCK + tl.arange(0, BLOCK)   # 32-bit: the launcher caps the size
            # ".cg": cached in L2 only. From the second pass on, a buffer that fits in L2
            # is read from there, never from the SM's own L1.
            acc += tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0,
                           cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))     # 4 bytes out per program: nothing


@triton.jit
def copy_rows_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(axis=1)
    cols = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    # Neighbouring lanes, neighbouring addresses: a warp's 32 loads fill whole sectors.
    offs = row.to(tl.int64) * n_cols + cols
    mask = cols < n_cols
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def copy_cols_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    col = tl.program_id(axis=1)
    rows = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    # Neighbouring lanes, addresses n_cols elements apart: each load and each store of a
    # warp touches 32 different sectors and uses 4 of every 32 bytes it moves on chip.
    offs = rows.to(tl.int64) * n_cols + col
    mask = rows < n_rows
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def transpose_strips_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(axis=1)
    cols = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=mask)   # along a row: coalesced
    # x[row, c] goes to y[c, row]: down a column of y, n_rows elements apart.
    tl.store(y_ptr + cols.to(tl.int64) * n_rows + row, v, mask=mask)


@triton.jit
def transpose_tiles_kernel(x_ptr, y_ptr, n_rows, n_cols, TILE: tl.constexpr):
    rows = tl.program_id(axis=0) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(axis=1) * TILE + tl.arange(0, TILE)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    # The load's addresses run along the rows of x, the store's along the rows of y (down
    # the tile's columns). The compiler gives each its own coalesced register layout and
    # moves the tile between the two through shared memory.
    tile = tl.load(x_ptr + rows[:, None].to(tl.int64) * n_cols + cols[None, :], mask=mask)
    tl.store(y_ptr + cols[None, :].to(tl.int64) * n_rows + rows[:, None], tile, mask=mask)


# --------------------------------------------------------------------------------------
# Launchers.
# --------------------------------------------------------------------------------------


def read_loop(x: torch.Tensor, passes: int, programs: int, *, block: int = READ_BLOCK,
              num_warps: int = READ_WARPS, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read ``x`` ``passes`` times with ``programs`` programs in one launch; one fp32 sum per
    program (compare with :func:`read_loop_reference`)."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    check_power_of_two("block", block, minimum=16)
    check_num_warps(num_warps)
    if x.numel() >= 2**31 - block:
        raise ValueError(f"x has {x.numel()} elements; read_loop indexes with 32-bit offsets")
    if not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be a whole number of at least 1, got {passes!r}")
    if not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs must be a whole number of at least 1, got {programs!r}")
    if out is None:
        out = torch.empty(programs, device=x.device, dtype=torch.float32)
    read_loop_kernel[(programs,)](x, out, x.numel(), passes, BLOCK=block, num_warps=num_warps)
    return out


def _matrix(x: torch.Tensor) -> tuple[int, int]:
    check_tensor(x, "x", ndim=2)
    return x.shape


def _launch_strips(kernel, x, y, block, num_warps, long_axis):
    m, n = x.shape
    along, across = (n, m) if long_axis == "cols" else (m, n)
    if across > MAX_GRID_Y:
        raise ValueError(f"a {m} x {n} matrix needs {across} programs on grid axis 1, which "
                         f"holds at most {MAX_GRID_Y}")
    if x.numel():
        kernel[(triton.cdiv(along, block), across)](x, y, m, n, BLOCK=block,
                                                     num_warps=num_warps)
    return y


def copy_rows(x, *, block: int = BLOCK, num_warps: int = NUM_WARPS, out=None):
    """Copy an ``M x N`` matrix by strips of rows (coalesced)."""
    _matrix(x)
    check_power_of_two("block", block)
    y = torch.empty_like(x) if out is None else out
    return _launch_strips(copy_rows_kernel, x, y, block, num_warps, "cols")


def copy_cols(x, *, block: int = BLOCK, num_warps: int = NUM_WARPS, out=None):
    """Copy an ``M x N`` matrix by strips of columns (strided: one sector per element)."""
    _matrix(x)
    check_power_of_two("block", block)
    y = torch.empty_like(x) if out is None else out
    return _launch_strips(copy_cols_kernel, x, y, block, num_warps, "rows")


def _transposed_out(x, out):
    m, n = x.shape
    return torch.empty((n, m), device=x.device, dtype=x.dtype) if out is None else out


def transpose_strips(x, *, block: int = BLOCK, num_warps: int = NUM_WARPS, out=None):
    """``x.T`` as a new row-major matrix, by strips: reads coalesced, writes strided."""
    _matrix(x)
    check_power_of_two("block", block)
    return _launch_strips(transpose_strips_kernel, x, _transposed_out(x, out), block,
                          num_warps, "cols")


def transpose_tiles(x, *, tile: int = TILE, num_warps: int = NUM_WARPS, out=None):
    """``x.T`` as a new row-major matrix, by square tiles: both sides coalesced."""
    m, n = _matrix(x)
    check_power_of_two("tile", tile)
    y = _transposed_out(x, out)
    if x.numel():
        transpose_tiles_kernel[(triton.cdiv(m, tile), triton.cdiv(n, tile))](
            x, y, m, n, TILE=tile, num_warps=num_warps)
    return y


# The copies and transposes of the coalescing measurement, by name.
ORDERS = {
    "copy_rows": copy_rows,
    "copy_cols": copy_cols,
    "transpose_strips": transpose_strips,
    "transpose_tiles": transpose_tiles,
}
