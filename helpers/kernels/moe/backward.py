"""The MoE layer's backward pass: grouped GEMMs again, three of them, and one new shape.

The forward (:mod:`helpers.kernels.moe.grouped`) computes, for sorted row ``r`` of expert
``e`` (token ``t = rows[r]``, routing weight ``s_r``):

    g, u = x[t] @ Wg[e], x[t] @ Wu[e]        pre = [g | u]   (saved for the backward)
    h    = silu(g) * u
    y    = h @ Wd[e]
    out[t] = sum over t's copies of s_r * y[r]

Given ``dout = dL/dout`` (``T x H``), the chain rule walks it back, one line a kernel:

1. :func:`swiglu_backward`: ``dh = s_r * (dout[t] @ Wd[e]^T)``, a grouped GEMM whose B is
   the down weights read transposed (through strides, no copy), gathering its rows of A
   from ``dout`` as the forward gathers from ``x``. Its epilogue is the SwiGLU's backward,
   elementwise on the tile still in registers: with ``sig = sigmoid(g)``,
   ``dg = dh * u * sig * (1 + g * (1 - sig))`` and ``du = dh * silu(g)``, stored side by
   side as ``dpre`` (``R x 2I``). The same tile gives the routing weight's gradient,
   ``ds_r = <dout[t], y[r]> = <dout[t] @ Wd[e]^T, h[r]>``: one partial sum per column tile,
   so ``y`` need not be kept.
2. :func:`grouped_weight_grad` twice: ``dWd[e] = h_e^T @ dy_e`` with ``dy = s * dout[rows]``
   and ``d[Wg|Wu][e] = xs_e^T @ dpre_e`` with ``xs = x[rows]``, both sets of rows written
   out first by :func:`gather_rows` (one pass each). These are the new shape: each expert's output
   is a fixed ``M x N`` weight, and the *reduction* runs over that expert's rows, as many
   as the router sent, zero for an idle expert (whose gradient is then exactly 0). One
   program per tile of one expert's weight; the rows are the loop.
3. ``dx``: ``dpre @ [Wg|Wu]^T`` by the forward's own grouped GEMM (B again a transposed
   view, ``K = 2I``), then every token sums its copies: the forward's combine with
   weights of 1.

The gate and up weights are one tensor here, ``gate_up`` (``E x H x 2I``), as a training
layer stores them (and ``torch._grouped_mm`` users do): then step 2's second GEMM and step
3's are one launch each instead of two. :class:`~helpers.kernels.moe.MoELayer` and
:func:`~helpers.kernels.moe.experts_train` wire these into ``torch.autograd``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..matmul.config import TileConfig
from ..matmul.ladder import grouped_tile
from .grouped import CPU_CONFIG, KEYS, _triton_configs, bucket, expert_of_tile

# --------------------------------------------------------------------------------------
# 1. dh = s * (dout[rows] @ Wd^T), and the SwiGLU's backward in the epilogue.
# --------------------------------------------------------------------------------------


@triton.jit
def _columns(offs, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """A tile's columns for its loads. Whole tiles (``EVEN``): the offsets, with the hint
    that they run contiguous from a multiple of ``BLOCK``, so each thread loads 16 bytes at
    once; without the hint the compiler must assume any gap and loads 2 bytes at a time
    (measured on the H100: the weight gradient ran 8x slower). The last, partial tile
    re-reads column ``n - 1`` instead (its extra columns are never stored)."""
    if EVEN:
        return tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)
    return tl.minimum(offs, n - 1)


@triton.jit
def swiglu_backward_kernel(dout_ptr, rows_ptr, wd_ptr, pre_ptr, scale_ptr, dpre_ptr, ds_ptr,
                           counts_ptr, R, N, K, E,
                           stride_om, stride_ok, stride_we, stride_wk, stride_wn, stride_ds,
                           R_BUCKET,
                           E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                           EVEN_N: tl.constexpr):
    """For sorted row ``r`` of expert ``e``: ``acc = dout[rows[r]] @ Wd[e]^T`` (``N = I``
    columns, ``K = H``), then ``ds`` partials and ``dpre = [dg | du]`` from ``pre = [g | u]``.

    ``wd_ptr`` with its strides is ``Wd^T`` already (``E x H x I``, a view).
    """
    max_tiles_m = tl.minimum(R, R // BLOCK_M + E)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), max_tiles_m, tiles_n, GROUP_M)
    expert, start, end = expert_of_tile(pid_m, counts_ptr, E, E_POW2, BLOCK_M)
    if start >= end:
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    real = offs_m < end
    src = tl.load(rows_ptr + tl.where(real, offs_m, start))     # padding re-reads a real row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = _columns(offs_n, N, BLOCK_N, EVEN_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = dout_ptr + src.to(tl.int64)[:, None] * stride_om + offs_k[None, :] * stride_ok
    b_ptrs = wd_ptr + expert.to(tl.int64) * stride_we + offs_k[:, None] * stride_wk \
        + cols[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:                        # no masks: the loads pipeline as the forward's do
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ok
        b_ptrs += BLOCK_K * stride_wk
    keep = real[:, None] & (offs_n[None, :] < N)
    pre_ptrs = pre_ptr + offs_m.to(tl.int64)[:, None] * (2 * N) + offs_n[None, :]
    g = tl.load(pre_ptrs, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(pre_ptrs + N, mask=keep, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    # ds_r = <dout[t], y[r]> = <dout[t] @ Wd^T, h[r]>: this tile's share, summed on the host.
    # The shares sit one a 16 columns (the narrowest tile): a tile writes its share and zeros
    # over the slots it spans, so every slot of a row is written by whatever tile size runs
    # (the autotuner's trial runs of other sizes leave nothing stale behind).
    partial = tl.sum(acc * silu * u, axis=1)
    SLOTS: tl.constexpr = BLOCK_N // 16
    slot = tl.arange(0, SLOTS)
    shares = tl.where(slot[None, :] == 0, partial[:, None], 0.0)
    tl.store(ds_ptr + offs_m.to(tl.int64)[:, None] * stride_ds + pid_n * SLOTS + slot[None, :],
             shares, mask=real[:, None] & (pid_n * SLOTS + slot[None, :] < stride_ds))
    s = tl.load(scale_ptr + offs_m, mask=real, other=0.0).to(tl.float32)
    dh = acc * s[:, None]
    dg = dh * u * sig * (1.0 + g * (1.0 - sig))                  # d silu(g) / dg
    du = dh * silu
    dpre_ptrs = dpre_ptr + offs_m.to(tl.int64)[:, None] * (2 * N) + offs_n[None, :]
    tl.store(dpre_ptrs, dg.to(dpre_ptr.dtype.element_ty), mask=keep)
    tl.store(dpre_ptrs + N, du.to(dpre_ptr.dtype.element_ty), mask=keep)


# --------------------------------------------------------------------------------------
# 2. Weight gradients: per expert, a reduction over that expert's rows.
# --------------------------------------------------------------------------------------


@triton.jit
def grouped_weight_grad_kernel(a_ptr, b_ptr, c_ptr, offsets_ptr, M, N, E, R_BUCKET,
                               stride_am, stride_ak, stride_bm, stride_bn,
                               stride_ce, stride_cm, stride_cn,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                               EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
    """``C[e] = A_e^T @ B_e``, ``M x N`` an expert, where ``A_e`` and ``B_e`` are expert
    ``e``'s sorted rows ``offsets[e] : offsets[e + 1]`` of ``A`` and ``B``.

    The grid runs every tile of every expert's ``C``, the experts one after another, so
    the rows of one expert are read by its tiles while they are still in L2. Both operands
    are sorted rows already (:func:`gather_rows`): gathering inside this loop, or scaling
    B's rows there, cost the H200 1.3-1.9x the time of the plain loop (measured at both
    lesson shapes), more than one pass that writes the rows out.
    """
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(axis=0)
    expert = pid // (tiles_m * tiles_n)
    pid_m, pid_n = grouped_tile(pid % (tiles_m * tiles_n), tiles_m, tiles_n, GROUP_M)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_in = _columns(offs_m, M, BLOCK_M, EVEN_M)     # A's columns (C's rows)
    n_in = _columns(offs_n, N, BLOCK_N, EVEN_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        offs_r = r0 + tl.arange(0, BLOCK_K)
        valid = offs_r < end
        # A^T's tile: BLOCK_M features (contiguous in memory) by BLOCK_K rows.
        a = tl.load(a_ptr + offs_r.to(tl.int64)[None, :] * stride_am + m_in[:, None] * stride_ak,
                    mask=valid[None, :], other=0.0)
        b = tl.load(b_ptr + offs_r.to(tl.int64)[:, None] * stride_bm + n_in[None, :] * stride_bn,
                    mask=valid[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
    c_ptrs = c_ptr + expert.to(tl.int64) * stride_ce + offs_m.to(tl.int64)[:, None] * stride_cm \
        + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def gather_rows_kernel(src_ptr, rows_ptr, scale_ptr, out_ptr, R, H, stride_s, stride_o,
                       SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """``out[r] = scale[r] * src[rows[r]]`` (``SCALE``) or ``src[rows[r]]``: one pass,
    the product in fp32 and rounded once."""
    offs_r = tl.program_id(axis=0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_h = tl.program_id(axis=1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_r, in_h = offs_r < R, offs_h < H
    src = tl.load(rows_ptr + offs_r, mask=in_r, other=0).to(tl.int64)
    v = tl.load(src_ptr + src[:, None] * stride_s + offs_h[None, :],
                mask=in_r[:, None] & in_h[None, :], other=0.0)
    if SCALE:
        s = tl.load(scale_ptr + offs_r, mask=in_r, other=0.0)
        v = v.to(tl.float32) * s[:, None]
    tl.store(out_ptr + offs_r.to(tl.int64)[:, None] * stride_o + offs_h[None, :],
             v.to(out_ptr.dtype.element_ty), mask=in_r[:, None] & in_h[None, :])


# --------------------------------------------------------------------------------------
# Settings: tuned per shape on a GPU, the interpreter's one small tile in CPU mode.
# --------------------------------------------------------------------------------------

# The SwiGLU backward keeps one accumulator but reads two more tiles (g, u) and writes two
# in its epilogue: the forward SwiGLU's tiles, and the plain GEMM's widest (its loop is the
# plain GEMM's; on the H200 it ran at half the plain GEMM's rate with these five alone).
SWIGLU_BACKWARD_SPACE = [
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 64, 64, num_warps=4, num_stages=4),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4),
    TileConfig(32, 64, 64, num_warps=4, num_stages=4),
]
# Weight gradients: large tiles of a fixed M x N per expert; the loop length is the
# expert's rows (a few hundred at 128 experts), so deeper pipelines pay less than there.
WEIGHT_GRAD_SPACE = [
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 32, num_warps=4, num_stages=5),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4),
]

_EVEN_KN = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
                              "EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
_EVEN_MN = triton.heuristics({"EVEN_M": lambda args: args["M"] % args["BLOCK_M"] == 0,
                              "EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
swiglu_backward_fixed = _EVEN_KN(swiglu_backward_kernel)
weight_grad_fixed = _EVEN_MN(grouped_weight_grad_kernel)
swiglu_backward_tuned = triton.autotune(
    _triton_configs(SWIGLU_BACKWARD_SPACE), key=["R_BUCKET", "N", "K", "E"],
    cache_results=True)(swiglu_backward_fixed)

weight_grad_tuned = triton.autotune(
    _triton_configs(WEIGHT_GRAD_SPACE), key=["M", "N", "E", "R_BUCKET"],
    cache_results=True)(weight_grad_fixed)


def _setting(config):
    """``(kernel to launch, its extra constexprs)``: tuned on a GPU unless ``config``."""
    if config is None and runtime.is_cpu():
        config = CPU_CONFIG
    if config is None:
        return None
    return TileConfig.of(config).as_dict(KEYS)


def swiglu_backward(dout, rows, counts, w_down, pre, scale, config=None):
    """Step 1: ``(dpre, ds)``: ``dpre = [dg | du]`` (``R x 2I``, ``pre``'s dtype) and each
    sorted row's routing-weight gradient ``ds`` (``R``, fp32).

    ``dout`` is ``(T, H)``, ``rows`` (``R`` int32) the token of each sorted row, ``counts``
    (``E`` int32) rows per expert, ``w_down`` ``(E, I, H)``, ``pre`` the forward's saved
    ``[g | u]`` and ``scale`` (``R``, fp32) each sorted row's routing weight.
    """
    R, E = rows.numel(), w_down.shape[0]
    I, H = w_down.shape[1], w_down.shape[2]
    dpre = torch.empty((R, 2 * I), device=pre.device, dtype=pre.dtype)
    if R == 0:
        return dpre, torch.zeros(0, device=pre.device, dtype=torch.float32)
    wd_t = w_down.transpose(1, 2)                      # (E, H, I): Wd^T, a view
    extra = _setting(config)
    kernel = swiglu_backward_tuned if extra is None else swiglu_backward_fixed
    ds = torch.empty((R, triton.cdiv(I, 16)), device=pre.device, dtype=torch.float32)

    def grid(meta):
        return (min(R, R // meta["BLOCK_M"] + E) * triton.cdiv(I, meta["BLOCK_N"]),)

    kernel[grid](dout, rows, wd_t, pre, scale, dpre, ds, counts, R, I, H, E, *dout.stride(),
                 *wd_t.stride(), ds.stride(0), bucket(R), E_POW2=triton.next_power_of_2(E),
                 **(extra or {}))
    return dpre, ds.sum(dim=1)


def gather_rows(src, rows, scale=None, block_r: int = 16, block_h: int = 256):
    """``src[rows]``, each row times ``scale[r]`` (fp32) if given: ``(R, H)`` in ``src``'s
    dtype. ``src`` must have contiguous rows."""
    R, H = rows.numel(), src.shape[1]
    out = torch.empty((R, H), device=src.device, dtype=src.dtype)
    if R == 0:
        return out
    if src.stride(1) != 1:
        raise ValueError(f"gather_rows needs rows stored contiguously; got strides {src.stride()}")
    if runtime.is_cpu():
        block_h = min(block_h, 64)
    grid = (triton.cdiv(R, block_r), triton.cdiv(H, block_h))
    gather_rows_kernel[grid](src, rows, scale if scale is not None else src, out, R, H,
                             src.stride(0), out.stride(0), SCALE=scale is not None,
                             BLOCK_R=block_r, BLOCK_H=block_h)
    return out


def grouped_weight_grad(a, b, offsets, experts: int, config=None):
    """Step 2: ``C[e] = A_e^T @ B_e`` over expert ``e``'s sorted rows ``offsets[e] :
    offsets[e + 1]`` of ``a`` (``R x M``) and ``b`` (``R x N``): ``(E, M, N)`` in ``a``'s
    dtype. An expert with no rows gets zeros."""
    (R, M), N = a.shape, b.shape[1]
    if b.shape[0] != R:
        raise ValueError(f"a and b must have one row per sorted copy; got {R} and {b.shape[0]}")
    c = torch.empty((experts, M, N), device=a.device, dtype=a.dtype)
    extra = _setting(config)
    kernel = weight_grad_tuned if extra is None else weight_grad_fixed

    def grid(meta):
        return (experts * triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    kernel[grid](a, b, c, offsets, M, N, experts, bucket(R), *a.stride(), *b.stride(),
                 *c.stride(), **(extra or {}))
    return c
