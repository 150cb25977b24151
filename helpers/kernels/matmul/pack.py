"""Copying a matmul's operands into rows that start on whole 16- or 128-byte boundaries,
both in one launch, into buffers kept between calls.

Why copy at all is :mod:`~helpers.kernels.matmul.plan`'s story (a row of 1,999 fp16
values rules out 16-byte loads; one that starts mid-line makes every load touch a line
more). This module makes the copy cheap, because at small sizes it is paid on every call:

* **One launch for both operands.** The programs of one grid are split between A's tiles
  and B's. On an H100 a launch costs a few microseconds of its own, as much as copying a
  megabyte.
* **One layout for the load and the store.** The source rows are misaligned (that is why
  they are copied), so each thread loads 2 bytes at a time, 32 threads reading 64
  contiguous bytes. If Triton knew the destination's row stride to be a multiple of 16
  it would store 16 bytes a thread, in another layout, and move every tile through shared
  memory between the two: measured on an H100 80GB HBM3 (fp16, 333 x 777 x 1999, both
  operands, cold L2), that took 15.6 us against 8.4 us with the stride left unspecialised
  (``do_not_specialize``), which keeps the load's layout for the store.
* **Built once per plan, launched directly.** :func:`packer` allocates the destination
  buffers and compiles the kernel on a shape's first call; each later call only launches
  the compiled kernel on the new operands, through its launcher
  (:func:`~helpers.kernels.launch.lean`). Per-call Python work was what made the copy
  slow: on the H200 machine, a version that looked its buffers up and checked its
  arguments on every call spent 106 us of host time a call, against about 16 us of GPU
  time for the whole product at 333 x 777 x 1999 (measured while building this module).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..launch import lean

TILE_ROWS, TILE_COLS = 16, 256      # one program's piece of an operand: 4,096 values


@triton.jit
def _copy_tile(src, dst, rows, cols, src_stride, dst_stride, tile,
               TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    col_tiles = tl.cdiv(cols, TILE_C)
    r = (tile // col_tiles) * TILE_R + tl.arange(0, TILE_R)
    c = (tile % col_tiles) * TILE_C + tl.arange(0, TILE_C)
    inside = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(src + r[:, None] * src_stride + c[None, :], mask=inside)
    tl.store(dst + r[:, None] * dst_stride + c[None, :], x, mask=inside)


@triton.jit(do_not_specialize=["a_stride", "a_out_stride", "b_stride", "b_out_stride"])
def pack_kernel(a, a_out, a_rows, a_cols, a_stride, a_out_stride, a_tiles,
                b, b_out, b_rows, b_cols, b_stride, b_out_stride,
                TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    """Programs ``0 .. a_tiles - 1`` copy tiles of A, the rest tiles of B."""
    pid = tl.program_id(0)
    if pid < a_tiles:
        _copy_tile(a, a_out, a_rows, a_cols, a_stride, a_out_stride, pid, TILE_R, TILE_C)
    else:
        _copy_tile(b, b_out, b_rows, b_cols, b_stride, b_out_stride, pid - a_tiles,
                   TILE_R, TILE_C)


def _capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph (no synchronising)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _tiles(x: torch.Tensor) -> int:
    return triton.cdiv(x.shape[0], TILE_ROWS) * triton.cdiv(x.shape[1], TILE_COLS)


def packer(a: torch.Tensor | None, a_cols: int, b: torch.Tensor | None, b_cols: int,
           row_bytes: int):
    """The copy of one shape's operands, built once: ``copy(a, b) -> (a_run, b_run)``.

    ``a`` and ``b`` (either may be ``None``: taken as it is) are copied, in one launch,
    into rows that start every ``row_bytes`` bytes, and returned as views of ``a_cols``
    and ``b_cols`` columns (at least their own; the columns past their own are left
    unset). ``copy`` takes later operands of the same shape, strides and alignment. Its
    destination buffers belong to it and are rewritten by each call, in stream order:
    a plan keeps one ``copy`` and hands out only the product.
    """
    given = [(x, cols) for x, cols in ((a, a_cols), (b, b_cols)) if x is not None]
    for x, cols in given:
        if x.dim() != 2 or x.stride(1) != 1 or cols < x.shape[1]:
            raise ValueError(f"packer() copies row-major 2-D operands into at least their own "
                             f"columns; got shape {tuple(x.shape)}, strides {x.stride()}, "
                             f"cols={cols}")
    if not given:
        return lambda a, b: (a, b)
    per_row = {x.element_size(): row_bytes // x.element_size() for x, _ in given}
    outs = [torch.empty((x.shape[0], triton.cdiv(cols, per_row[x.element_size()])
                         * per_row[x.element_size()]), device=x.device, dtype=x.dtype)
            for x, cols in given]
    views = [out[:, :cols] for out, (_, cols) in zip(outs, given)]
    first, last = given[0][0], given[-1][0]
    tiles_first = _tiles(first) if len(given) == 2 else 0
    grid = (tiles_first + _tiles(last), 1, 1)
    shape_first = (first.shape[0], first.shape[1], first.stride(0), outs[0].stride(0),
                   tiles_first)
    shape_last = (last.shape[0], last.shape[1], last.stride(0), outs[-1].stride(0))
    out_first, out_last = outs[0], outs[-1]
    launch, usual, checked = None, None, False

    def copy(a, b):
        nonlocal launch, usual, checked
        sources = [x for x, wanted in ((a, a_given), (b, b_given)) if wanted]
        args = (sources[0], out_first, *shape_first, sources[-1], out_last, *shape_last)
        if launch is not None and checked:
            launch(*args, TILE_ROWS, TILE_COLS)
        elif launch is not None and _capturing():
            usual(*args, TILE_ROWS, TILE_COLS)     # the check below would synchronise
        elif launch is not None:          # the first direct launch must copy what it was given
            checked = True
            for out in outs:              # NaN equals nothing: a launch that wrote nothing
                out.fill_(float("nan"))   # cannot pass
            try:
                launch(*args, TILE_ROWS, TILE_COLS)
                copied = all(torch.equal(view[:, :x.shape[1]], x)
                             for view, x in zip(views, sources))
            except Exception:             # noqa: BLE001 - a launcher that fails
                copied = False
            if not copied:                # another Triton's launcher: the usual way from now
                launch = usual
                launch(*args, TILE_ROWS, TILE_COLS)
        else:
            kernel = pack_kernel[grid](*args, TILE_R=TILE_ROWS, TILE_C=TILE_COLS, num_warps=4)
            if runtime.is_gpu():          # the interpreter compiles nothing to keep
                usual = kernel[grid]
                try:
                    launch = lean(kernel, grid, first.get_device())
                except (AttributeError, TypeError, ValueError):
                    launch = usual
        return (views[0] if a_given else a), (views[-1] if b_given else b)

    a_given, b_given = a is not None, b is not None
    return copy
