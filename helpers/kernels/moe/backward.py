"""The MoE layer's backward pass: grouped GEMMs again, three of them, and one new shape.

The forward (:mod:`helpers.kernels.moe.grouped`) computes, for sorted row ``r`` of expert
``e`` (token ``t = rows[r]``, routing weight ``s_r``):

    g, u = x[t] @ Wg[e], x[t] @ Wu[e]        pre = [g | u]   (saved for the backward)
    h    = silu(g) * u
    y    = h @ Wd[e]
    out[t] = sum over t's copies of s_r * y[r]

Given ``dout = dL/dout`` (``T x H``), the chain rule walks it back, one line a kernel:

1. :func:`swiglu_backward`: ``acc = dout[t] @ Wd[e]^T``, a grouped GEMM whose B is the
   down weights read transposed (through strides, no copy), gathering its rows of A from
   ``dout`` as the forward gathers from ``x``; then one elementwise pass does the SwiGLU's
   backward: with ``dh = s_r * acc`` and ``sig = sigmoid(g)``,
   ``dg = dh * u * sig * (1 + g * (1 - sig))`` and ``du = dh * silu(g)``, stored side by
   side as ``dpre`` (``R x 2I``). The same pass gives the routing weight's gradient,
   ``ds_r = <dout[t], y[r]> = <acc[r], h[r]>``, so ``y`` need not be kept. Doing that pass
   in the GEMM's epilogue, on the tile still in registers, saves writing and reading
   ``acc`` (``R x I``) but measured slower on the H200 at the 8-expert shape (T = 4096):
   2.77 ms against 1.72 ms for the same GEMM without it. The epilogue's loads and stores
   of ``g``, ``u``, ``dg``, ``du`` run while the SM's tensor cores idle (one 128 x 128
   tile a SM fills its shared memory, so no other tile overlaps them); as a separate
   pass they stream at memory speed.
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
from . import grouped_tma
from .grouped import CPU_CONFIG, KEYS, _triton_configs, bucket, grouped_gather_matmul

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
def swiglu_backward_kernel(acc_ptr, pre_ptr, scale_ptr, dpre_ptr, ds_ptr, R, N, stride_ds,
                           BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """For sorted row ``r``, from ``acc = dout[rows[r]] @ Wd[e]^T`` (``R x N``, ``N = I``)
    and ``pre = [g | u]``: ``dpre = [dg | du]`` and this column block's share of ``ds``.

    Elementwise, one ``BLOCK_R x BLOCK_N`` block a program, everything in fp32.
    """
    offs_r = tl.program_id(axis=0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(axis=1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_r = offs_r < R
    keep = in_r[:, None] & (offs_n[None, :] < N)
    rows64 = offs_r.to(tl.int64)[:, None]
    acc = tl.load(acc_ptr + rows64 * N + offs_n[None, :], mask=keep, other=0.0).to(tl.float32)
    pre_ptrs = pre_ptr + rows64 * (2 * N) + offs_n[None, :]
    g = tl.load(pre_ptrs, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(pre_ptrs + N, mask=keep, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    # ds_r = <dout[t], y[r]> = <dout[t] @ Wd^T, h[r]>: one share a column block, summed on
    # the host in a fixed order (no atomics: the same sum every run).
    tl.store(ds_ptr + offs_r * stride_ds + tl.program_id(axis=1),
             tl.sum(acc * silu * u, axis=1), mask=in_r)
    s = tl.load(scale_ptr + offs_r, mask=in_r, other=0.0).to(tl.float32)
    dh = acc * s[:, None]
    dg = dh * u * sig * (1.0 + g * (1.0 - sig))                  # d silu(g) / dg
    du = dh * silu
    dpre_ptrs = dpre_ptr + rows64 * (2 * N) + offs_n[None, :]
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

# Weight gradients: large tiles of a fixed M x N per expert; the loop length is the
# expert's rows (a few hundred at 128 experts), so deeper pipelines pay less than there.
WEIGHT_GRAD_SPACE = [
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 32, num_warps=4, num_stages=5),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4),
]

_EVEN_MN = triton.heuristics({"EVEN_M": lambda args: args["M"] % args["BLOCK_M"] == 0,
                              "EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
weight_grad_fixed = _EVEN_MN(grouped_weight_grad_kernel)
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


def swiglu_backward(dout, rows, counts, w_down, pre, scale, config=None,
                    block_r: int = 16, block_n: int = 256):
    """Step 1: ``(dpre, ds)``: ``dpre = [dg | du]`` (``R x 2I``, ``pre``'s dtype) and each
    sorted row's routing-weight gradient ``ds`` (``R``, fp32).

    ``dout`` is ``(T, H)``, ``rows`` (``R`` int32) the token of each sorted row, ``counts``
    (``E`` int32) rows per expert, ``w_down`` ``(E, I, H)``, ``pre`` the forward's saved
    ``[g | u]`` and ``scale`` (``R``, fp32) each sorted row's routing weight. ``config``
    is the GEMM's tile setting (tuned when ``None`` on a GPU).
    """
    R, I = rows.numel(), w_down.shape[1]
    dpre = torch.empty((R, 2 * I), device=pre.device, dtype=pre.dtype)
    if R == 0:
        return dpre, torch.zeros(0, device=pre.device, dtype=torch.float32)
    # The GEMM, gathering dout's rows as the forward gathers x's; B is Wd^T, a view.
    acc = grouped_gather_matmul(dout, rows, counts, w_down.transpose(1, 2), config)
    if runtime.is_cpu():
        block_n = min(block_n, 64)
    ds = torch.empty((R, triton.cdiv(I, block_n)), device=pre.device, dtype=torch.float32)
    grid = (triton.cdiv(R, block_r), triton.cdiv(I, block_n))
    swiglu_backward_kernel[grid](acc, pre, scale, dpre, ds, R, I, ds.stride(0),
                                 BLOCK_R=block_r, BLOCK_N=block_n)
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
    dtype. An expert with no rows gets zeros. Untuned on a Hopper GPU, the rows may come
    through the TMA instead (:func:`~.grouped_tma.grouped_weight_grad_tma`), where that
    times faster."""
    (R, M), N = a.shape, b.shape[1]
    if b.shape[0] != R:
        raise ValueError(f"a and b must have one row per sorted copy; got {R} and {b.shape[0]}")
    extra = _setting(config)

    def pointer_kernel():
        c = torch.empty((experts, M, N), device=a.device, dtype=a.dtype)
        kernel = weight_grad_tuned if extra is None else weight_grad_fixed

        def grid(meta):
            return (experts * triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        kernel[grid](a, b, c, offsets, M, N, experts, bucket(R), *a.stride(), *b.stride(),
                     *c.stride(), **(extra or {}))
        return c

    if extra is None and grouped_tma.tma_supported(a) and grouped_tma.rows_usable(a, b) is None:
        return grouped_tma.tuned_weight_grad(a, b, offsets, experts, pointer_kernel)
    return pointer_kernel()
