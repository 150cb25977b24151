"""Lesson 08's grouped GEMM: every expert's matmul in one launch, and the combine.

After the dispatch (:func:`helpers.kernels.moe.dispatch`) the token copies sit sorted by
expert: rows ``offsets[e] : offsets[e + 1]`` of the sorted order belong to expert ``e``,
``counts[e]`` of them, some experts with hundreds of rows and some with none. A
per-expert loop launches one small matmul per expert: at 128 experts that is 128 launches
of a few hundred rows each, too little work per launch to fill 132 SMs, and the GPU idles
between them. A grouped GEMM launches **one** grid for all experts:

* Each expert's rows are cut into tiles of ``BLOCK_M`` rows; an expert with 300 rows and
  ``BLOCK_M = 128`` owns 3 row tiles, the last one 44 rows full. :func:`expert_of_tile`
  is the index arithmetic: from a program's row-tile number to its expert and rows, by a
  prefix sum of tiles per expert, computed by every program from ``counts`` (E numbers,
  a few hundred bytes from L2). No host round trip: the grid is sized for the worst case,
  ``R // BLOCK_M + E`` row tiles, and programs past the last real tile return at once.
* Rows of a tile past its expert's end are *padding*: they are computed (the tensor
  cores work on whole tiles) and never stored. :func:`helpers.kernels.moe.padding_rows`
  counts them; a skewed router makes more of them.
* The first GEMM (:func:`grouped_swiglu`) **gathers** its rows straight from the
  unsorted tokens (``rows[r]`` is the token of sorted row ``r``), so the sorted copy of
  the activations is never written, and computes the gate and up projections in one
  pass with two accumulators, applying ``silu(gate) * up`` before the store: the
  ``R x 2I`` intermediate never reaches HBM.
* The second GEMM (:func:`grouped_matmul`) is the down projection on sorted rows.
* :func:`combine` un-permutes: token ``t``'s output is the routing-weighted sum of its
  ``top_k`` rows, gathered by ``position``; a fixed order, so the result is the same
  every run (no atomics).

On a GPU the tile sizes are autotuned per shape (lesson 07); in CPU mode one small
setting runs in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..matmul.config import TileConfig
from ..matmul.ladder import grouped_tile
from . import grouped_tma
from .grouped_tma import fused_gate_up
from .tiles import CPU_CONFIG, KEYS, bucket, expert_of_tile


@triton.jit
def grouped_gemm_kernel(a_ptr, rows_ptr, b_ptr, b2_ptr, c_ptr, pre_ptr, counts_ptr, R, N, K, E,
                        stride_am, stride_ak, stride_be, stride_bk, stride_bn,
                        stride_cm, stride_cn, R_BUCKET,
                        E_POW2: tl.constexpr, GATHER: tl.constexpr, SWIGLU: tl.constexpr,
                        SAVE_PRE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """``C[r] = A[rows[r]] @ B[e]`` for every sorted row ``r`` of expert ``e``.

    With ``SWIGLU``, ``C[r] = silu(A[rows[r]] @ B[e]) * (A[rows[r]] @ B2[e])``: the gate
    and up projections share each loaded tile of A. With ``SAVE_PRE`` (training) the two
    projections before the SwiGLU are stored too, side by side in ``pre`` (``R x 2N``):
    the backward needs both (:mod:`helpers.kernels.moe.backward`).
    """
    max_tiles_m = tl.minimum(R, R // BLOCK_M + E)        # the worst case, see the module
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), max_tiles_m, tl.cdiv(N, BLOCK_N),
                                GROUP_M)
    expert, start, end = expert_of_tile(pid_m, counts_ptr, E, E_POW2, BLOCK_M)
    if start >= end:
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    real = offs_m < end
    # Padding rows re-read a real row, so every load of A stays unmasked (whole 16-byte
    # vectors); their results are dropped at the store.
    if GATHER:
        src = tl.load(rows_ptr + tl.where(real, offs_m, start))
    else:
        src = tl.where(real, offs_m, start)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN_N:      # whole tiles: tell the compiler the columns are contiguous (16-byte loads)
        cols = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    else:           # the last tile's extra columns re-read column N - 1 and are not stored
        cols = tl.minimum(offs_n, N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + src.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_off = expert.to(tl.int64) * stride_be + offs_k[:, None] * stride_bk \
        + cols[None, :] * stride_bn
    b_ptrs = b_ptr + b_off
    b2_ptrs = b2_ptr + b_off
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        if SWIGLU:
            if EVEN_K:
                b2 = tl.load(b2_ptrs)
            else:
                b2 = tl.load(b2_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc2 = tl.dot(a, b2, acc2)
            b2_ptrs += BLOCK_K * stride_bk
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    keep = real[:, None] & (offs_n[None, :] < N)
    if SAVE_PRE:
        pre_ptrs = pre_ptr + offs_m.to(tl.int64)[:, None] * (2 * N) + offs_n[None, :]
        tl.store(pre_ptrs, acc.to(pre_ptr.dtype.element_ty), mask=keep)
        tl.store(pre_ptrs + N, acc2.to(pre_ptr.dtype.element_ty), mask=keep)
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc2               # silu(gate) * up, still in fp32
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=keep)


@triton.jit
def combine_kernel(y_ptr, position_ptr, weight_ptr, out_ptr, T, H, TOP_K,
                   stride_ym, stride_yh, stride_om, stride_oh,
                   BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """``out[t] = sum_j weight[t, j] * y[position[t, j]]``; a dropped copy has position -1."""
    offs_t = tl.program_id(axis=0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.program_id(axis=1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_t, in_h = offs_t < T, offs_h < H
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for j in range(0, TOP_K):
        pos = tl.load(position_ptr + offs_t * TOP_K + j, mask=in_t, other=-1)
        w = tl.load(weight_ptr + offs_t * TOP_K + j, mask=in_t, other=0.0)
        kept = pos >= 0
        y = tl.load(y_ptr + pos.to(tl.int64)[:, None] * stride_ym + offs_h[None, :] * stride_yh,
                    mask=kept[:, None] & in_h[None, :], other=0.0)
        acc += w.to(tl.float32)[:, None] * y.to(tl.float32)
    tl.store(out_ptr + offs_t.to(tl.int64)[:, None] * stride_om + offs_h[None, :] * stride_oh,
             acc.to(out_ptr.dtype.element_ty), mask=in_t[:, None] & in_h[None, :])


# --------------------------------------------------------------------------------------
# Settings: tuned per shape on a GPU, one small one in the interpreter.
# --------------------------------------------------------------------------------------

# GROUP_M = 16 variants of the big tiles: on the 8-expert shape (4,096 tokens, H100) they
# kept more of each expert's weights in L2, 565-570 TFLOP/s against 548-561 with 8.
# SwiGLU keeps two fp32 accumulators, so its tiles are half the area of the plain GEMM's
# for the same registers a thread. Small BLOCK_M for few rows per expert (decode steps,
# many experts): a 128-row tile on a 10-row expert computes 118 rows of padding.
SWIGLU_SPACE = [
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=8, num_stages=3, group_m=16),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 64, 64, num_warps=4, num_stages=4),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4),
    TileConfig(64, 128, 64, num_warps=8, num_stages=4),
    TileConfig(64, 256, 64, num_warps=8, num_stages=3),
    TileConfig(32, 64, 64, num_warps=4, num_stages=4),
    TileConfig(16, 64, 128, num_warps=4, num_stages=4),
]
MATMUL_SPACE = [
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=4),
    TileConfig(128, 256, 64, num_warps=8, num_stages=4, group_m=16),
    TileConfig(256, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
    TileConfig(128, 64, 64, num_warps=4, num_stages=4),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 256, 64, num_warps=8, num_stages=3),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4),
    TileConfig(32, 64, 64, num_warps=4, num_stages=4),
    TileConfig(16, 64, 128, num_warps=4, num_stages=4),
]


def _triton_configs(space) -> list:
    return [c.triton_config() for c in space]


_EVEN = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
                           "EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
grouped_gemm_fixed = _EVEN(grouped_gemm_kernel)
# Keyed on rows (bucketed), the matmul's N and K, the expert count and the variant;
# the dtypes are added by the autotuner itself.
_TUNE_KEY = ["R_BUCKET", "N", "K", "E", "GATHER", "SWIGLU", "SAVE_PRE"]
grouped_swiglu_tuned = triton.autotune(_triton_configs(SWIGLU_SPACE), key=_TUNE_KEY,
                                       cache_results=True)(grouped_gemm_fixed)
grouped_matmul_tuned = triton.autotune(_triton_configs(MATMUL_SPACE), key=_TUNE_KEY,
                                       cache_results=True)(grouped_gemm_fixed)


def _launch(a, rows, b, b2, counts, config, tuned, pre=None):
    """Allocate C (one row per sorted token copy) and launch the grouped GEMM; with
    ``pre`` (``R x 2N``, SwiGLU only) its two projections are stored there too."""
    R = rows.numel() if rows is not None else a.shape[0]
    E, K, N = b.shape
    c = torch.empty((R, N), device=a.device, dtype=a.dtype)
    if R == 0:
        return c
    if config is None and runtime.is_cpu():
        config = CPU_CONFIG
    if config is not None:
        config = TileConfig.of(config)
        if config.split_k != 1 or config.options:
            raise ValueError(f"the grouped GEMM takes a tile, GROUP_M, warps and stages (no "
                             f"split of K, no options); got {config.describe()}")
    kernel = tuned if config is None else grouped_gemm_fixed
    extra = {} if config is None else config.as_dict(KEYS)

    def grid(meta):
        return (min(R, R // meta["BLOCK_M"] + E) * triton.cdiv(N, meta["BLOCK_N"]),)

    kernel[grid](a, rows if rows is not None else counts, b, b2 if b2 is not None else b, c,
                 pre if pre is not None else c, counts, R, N, K, E, *a.stride(), *b.stride(),
                 *c.stride(), bucket(R), E_POW2=triton.next_power_of_2(E),
                 GATHER=rows is not None, SWIGLU=b2 is not None, SAVE_PRE=pre is not None,
                 **extra)
    return c


def grouped_swiglu(x, rows, counts, w_gate, w_up, config: TileConfig | None = None,
                   pre: torch.Tensor | None = None):
    """``silu(x[rows] @ w_gate[e]) * (x[rows] @ w_up[e])`` for each expert's sorted rows.

    ``x`` is ``(T, H)`` (tokens in their own order), ``rows`` the token of each sorted
    row (``R`` int32), ``counts`` rows per expert (``E`` int32, summing to ``R``),
    ``w_gate`` and ``w_up`` ``(E, H, I)``; returns ``(R, I)``. Inputs are checked by
    :func:`helpers.kernels.moe.experts_forward`, which calls this. Given ``pre``, a
    contiguous ``(R, 2I)`` tensor, the gate and up projections are stored there as well.
    Untuned on a Hopper GPU, where ``w_gate`` and ``w_up`` are the halves of one
    ``gate_up`` tensor (the training layer's), the weights may come through the TMA
    instead (:func:`~.grouped_tma.grouped_gather_tma`), where that times faster.
    """
    if w_gate.shape != w_up.shape or w_gate.stride() != w_up.stride():
        raise ValueError(f"w_gate and w_up must have one shape and one layout (the kernel "
                         f"walks both with the same strides); got shapes {tuple(w_gate.shape)}, "
                         f"{tuple(w_up.shape)} and strides {w_gate.stride()}, {w_up.stride()}. "
                         "Make both .contiguous(), or transpose both the same way.")
    if pre is not None and (pre.shape != (rows.numel(), 2 * w_gate.shape[2])
                            or not pre.is_contiguous() or pre.dtype != x.dtype):
        raise ValueError(f"pre must be a contiguous {x.dtype} tensor of shape (R, 2I) = "
                         f"{(rows.numel(), 2 * w_gate.shape[2])}; got {tuple(pre.shape)}, "
                         f"{pre.dtype}")

    def pointer_kernel():
        return _launch(x, rows, w_gate, w_up, counts, config, grouped_swiglu_tuned, pre)

    gate_up = fused_gate_up(w_gate, w_up) if config is None else None
    if gate_up is not None and gate_up.dtype == x.dtype and \
            grouped_tma.gather_supported(x, gate_up, swiglu=True):
        return grouped_tma.tuned_gather(x, rows, counts, gate_up, pointer_kernel, swiglu=True,
                                        pre=pre)
    return pointer_kernel()


def grouped_matmul(a, counts, w, config: TileConfig | None = None):
    """``a[r] @ w[e]`` for each expert's rows of the sorted ``a`` (``(R, K)``); ``w`` is
    ``(E, K, N)``; returns ``(R, N)``. Untuned (``config=None``) on a Hopper GPU, the
    TMA-fed kernel of :mod:`.grouped_tma` runs where it measured faster for the shape."""
    def pointer_kernel():
        return _launch(a, None, w, None, counts, config, grouped_matmul_tuned)

    if config is None and grouped_tma.tma_supported(a, w):
        return grouped_tma.tuned_grouped_matmul(a, counts, w, pointer_kernel)
    return pointer_kernel()


def grouped_gather_matmul(x, rows, counts, w, config: TileConfig | None = None):
    """``x[rows[r]] @ w[e]`` for each expert's sorted rows: :func:`grouped_matmul` reading
    its rows of A straight from the unsorted ``x`` (``(T, K)``), as :func:`grouped_swiglu`
    does; returns ``(R, N)``. Untuned on a Hopper GPU, the weights may come through the
    TMA instead (:func:`~.grouped_tma.grouped_gather_tma`), where that times faster."""

    def pointer_kernel():
        return _launch(x, rows, w, None, counts, config, grouped_matmul_tuned)

    if config is None and grouped_tma.gather_supported(x, w):
        return grouped_tma.tuned_gather(x, rows, counts, w, pointer_kernel)
    return pointer_kernel()


def combine(y, position, weights, block_t: int = 16, block_h: int = 128):
    """``out[t] = sum_j weights[t, j] * y[position[t, j]]``: ``y`` is ``(R, H)`` sorted
    rows, ``position`` and ``weights`` ``(T, top_k)``; returns ``(T, H)`` in ``y``'s dtype."""
    T, top_k = position.shape
    if not (position.is_contiguous() and weights.is_contiguous()) or weights.shape != position.shape:
        raise ValueError(f"position and weights must be contiguous and of one shape (T, top_k); "
                         f"got {tuple(position.shape)} and {tuple(weights.shape)}")
    H = y.shape[1]
    out = torch.empty((T, H), device=y.device, dtype=y.dtype)
    if T == 0:
        return out
    if runtime.is_cpu():
        block_h = min(block_h, 64)
    grid = (triton.cdiv(T, block_t), triton.cdiv(H, block_h))
    combine_kernel[grid](y, position, weights, out, T, H, top_k, *y.stride(), *out.stride(),
                         BLOCK_T=block_t, BLOCK_H=block_h)
    return out


def chosen_config(tuned) -> list[TileConfig]:
    """The settings the tuner picked so far (one per tuned key)."""
    return [TileConfig.from_triton(c) for c in tuned.cache.values()]
