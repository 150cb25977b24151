"""The FlashAttention-2 backward pass: three Triton kernels, no N x N matrix in HBM.

The forward pass saved only the output O and one log-sum-exp per row. The backward
recomputes every block of probabilities from them, ``P = exp(S - lse)`` with
``S = Q K^T * sm_scale``: no second softmax, no stored P. Per block it needs

* ``dV += P^T dO``                      (a matmul)
* ``dP  = dO V^T``                      (a matmul)
* ``dS  = P * (dP - delta)``            (elementwise; ``delta = rowsum(dO * O)``)
* ``dQ += dS K * sm_scale``             (a matmul)
* ``dK += dS^T Q * sm_scale``           (a matmul)

and recomputing ``S = Q K^T`` is a fifth: five matmuls of the forward's size against its
two, which is why the backward does 2.5x the forward's FLOPs.

``delta`` is the softmax's Jacobian collapsed to one number a row: ``sum_j P_ij dP_ij``,
which equals ``sum_d dO_id O_id``. :func:`attention_bwd_preprocess_kernel` computes it
once from O and dO, so the other kernels read one float a row instead of a block of P.

Each of dK/dV and dQ is a sum over one axis of the score matrix, so the work splits in
two kernels that need no atomics: :func:`attention_bwd_dkdv_kernel` keeps one K/V tile
resident and streams every Q block that sees it (and, for grouped-query attention,
every query head that shares it); :func:`attention_bwd_dq_kernel` keeps one Q tile
resident and streams the K/V tiles, like the forward. Both skip the tiles a causal mask
hides and mask only the diagonal band.

Rows past the end of a sequence are loaded as zeros, and zero rows of Q, dO, K or V
add nothing to any gradient, so only the causal band needs a mask in the arithmetic. So do
the columns past ``HEAD_DIM`` of a head held ``BLOCK_D`` wide (the next power of two), and a
row that saw no key has ``lse = +inf``: its recomputed P is exactly 0.

With ``TMA`` (Hopper), the tiles a kernel walks come through tensor descriptors, as the
forward's do (:func:`.forward.tile_rows`): dK/dV's Q and dO tiles, dQ's K and V tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import lean
from .causal import key_tile_range
from .forward import (allocator_for_descriptors, heads_descriptor, key_value_sources,
                      launcher, tile_rows, use_descriptors)

LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def attention_bwd_preprocess_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_om,
                                    heads, seq_q, HEAD_DIM: tl.constexpr,
                                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(dO * O)`` in fp32; ``dO`` has the same strides as ``O``."""
    pid_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    head_offset = (batch_head // heads).to(tl.int64) * stride_ob \
        + (batch_head % heads).to(tl.int64) * stride_oh
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    offsets = head_offset + rows[:, None] * stride_om + dims[None, :]
    in_tile = (rows[:, None] < seq_q) & (dims[None, :] < HEAD_DIM)
    o = tl.load(O + offsets, mask=in_tile, other=0.0).to(tl.float32)
    do = tl.load(DO + offsets, mask=in_tile, other=0.0).to(tl.float32)
    tl.store(DELTA + batch_head.to(tl.int64) * seq_q + rows, tl.sum(o * do, axis=1),
             mask=rows < seq_q)


@triton.jit
def _dkdv_from_rows(dk, dv, k, v, q_src, do_src, b, h, lse_row, delta_row, stride_qm,
                    cols, start, stop, seq_q, diag, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """dK and dV of one resident K/V tile from the Q blocks of rows ``start .. stop`` of
    query head ``h`` (``q_src``, ``do_src``: the head's start, or descriptors, ``TMA``)."""
    in_head = tl.arange(0, BLOCK_D)[None, :] < HEAD_DIM
    for start_m in range(start, stop, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + tl.arange(0, BLOCK_M)
        q = tile_rows(q_src, b, h, start_m, stride_qm, seq_q, in_head, HEAD_DIM, BLOCK_D,
                      BLOCK_M, MASKED, TMA)
        do = tile_rows(do_src, b, h, start_m, stride_qm, seq_q, in_head, HEAD_DIM, BLOCK_D,
                       BLOCK_M, MASKED, TMA)
        if MASKED:
            lse = tl.load(lse_row + rows, mask=rows < seq_q, other=0.0)
            delta = tl.load(delta_row + rows, mask=rows < seq_q, other=0.0)
        else:
            lse = tl.load(lse_row + rows)
            delta = tl.load(delta_row + rows)
        # Transposed blocks (keys down, queries across): P^T = exp2(K Q^T * c - lse2).
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :] * LOG2_E)
        if CAUSAL and MASKED:
            p_t = tl.where(cols[:, None] <= rows[None, :] + diag, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
                              stride_qb, stride_qh, stride_qm,
                              stride_kb, stride_kh, stride_kn,
                              heads, seq_q, seq_k, diag,
                              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                              BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                              TMA: tl.constexpr = False):
    """One K/V tile per program; Q, dO (same strides as Q), and dK, dV (as K) in HBM.
    ``TMA``: the Q and dO tiles through tensor descriptors (as the forward's K and V)."""
    pid_n = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    kv_heads = heads // GROUP
    b = (batch_kv_head // kv_heads).to(tl.int64)
    h_kv = (batch_kv_head % kv_heads).to(tl.int64)
    kv_offset = b * stride_kb + h_kv * stride_kh
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    kv_offsets = kv_offset + cols[:, None] * stride_kn + dims[None, :]
    in_tile = (cols[:, None] < seq_k) & (dims[None, :] < HEAD_DIM)
    k = tl.load(K + kv_offsets, mask=in_tile, other=0.0)
    v = tl.load(V + kv_offsets, mask=in_tile, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2_E

    full_blocks_end = (seq_q // BLOCK_M) * BLOCK_M
    if CAUSAL:
        # Query i sees key j when j <= i + diag. Rows before the tile's first key's first
        # viewer see none of it: start there, at the diagonal band (in whole Q blocks);
        # rows from its last key's first viewer on see all of it, unmasked.
        band_start = tl.minimum(tl.maximum(pid_n * BLOCK_N - diag, 0) // BLOCK_M * BLOCK_M,
                                seq_q)
        band_end = tl.cdiv(tl.maximum(pid_n * BLOCK_N + BLOCK_N - diag, 0), BLOCK_M) * BLOCK_M
        band_end = tl.maximum(tl.minimum(band_end, seq_q), band_start)
    else:
        band_start = 0
        band_end = 0
    tail_start = tl.maximum(band_end, full_blocks_end)
    if TMA:
        batch = tl.num_programs(1) // kv_heads
        q_desc = heads_descriptor(Q, batch, heads, seq_q, stride_qb, stride_qh, stride_qm,
                                  HEAD_DIM, BLOCK_M)
        do_desc = heads_descriptor(DO, batch, heads, seq_q, stride_qb, stride_qh, stride_qm,
                                   HEAD_DIM, BLOCK_M)
    for g in range(GROUP):                 # every query head that shares this K/V head
        h = h_kv * GROUP + g
        batch_head = b * heads + h
        q_src, do_src = Q + b * stride_qb + h * stride_qh, DO + b * stride_qb + h * stride_qh
        if TMA:
            q_src, do_src = q_desc, do_desc
        lse_row = LSE + batch_head * seq_q
        delta_row = DELTA + batch_head * seq_q
        b32, h32 = b.to(tl.int32), h.to(tl.int32)       # a descriptor's coordinates
        dk, dv = _dkdv_from_rows(dk, dv, k, v, q_src, do_src, b32, h32, lse_row, delta_row,
                                 stride_qm, cols, band_start, band_end, seq_q, diag, qk_scale,
                                 HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA)
        dk, dv = _dkdv_from_rows(dk, dv, k, v, q_src, do_src, b32, h32, lse_row, delta_row,
                                 stride_qm, cols, band_end, full_blocks_end, seq_q, diag,
                                 qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, CAUSAL, TMA)
        dk, dv = _dkdv_from_rows(dk, dv, k, v, q_src, do_src, b32, h32, lse_row, delta_row,
                                 stride_qm, cols, tail_start, seq_q, seq_q, diag, qk_scale,
                                 HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA)
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=in_tile)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=in_tile)


@triton.jit
def _dq_from_tiles(dq, q, do, lse, delta, k_src, v_src, b, h_kv, stride_kn, rows,
                   start, stop, seq_k, diag, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """dQ of one resident Q tile from the K/V tiles of keys ``start .. stop``."""
    in_head = tl.arange(0, BLOCK_D)[None, :] < HEAD_DIM
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tile_rows(k_src, b, h_kv, start_n, stride_kn, seq_k, in_head, HEAD_DIM, BLOCK_D,
                      BLOCK_N, MASKED, TMA)
        v = tile_rows(v_src, b, h_kv, start_n, stride_kn, seq_k, in_head, HEAD_DIM, BLOCK_D,
                      BLOCK_N, MASKED, TMA)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if CAUSAL and MASKED:
            p = tl.where(cols[None, :] <= rows[:, None] + diag, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def attention_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                            stride_qb, stride_qh, stride_qm,
                            stride_kb, stride_kh, stride_kn,
                            heads, seq_q, seq_k, diag,
                            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                            TMA: tl.constexpr = False):
    """One Q tile per program; dO and dQ have Q's strides, V has K's. ``TMA``: the K and
    V tiles through tensor descriptors (as the forward's)."""
    pid_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    b = (batch_head // heads).to(tl.int64)
    h = (batch_head % heads).to(tl.int64)
    q_offset = b * stride_qb + h * stride_qh
    kv_offset = b * stride_kb + (h // GROUP) * stride_kh
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    offsets = q_offset + rows[:, None] * stride_qm + dims[None, :]
    in_tile = (rows[:, None] < seq_q) & (dims[None, :] < HEAD_DIM)
    q = tl.load(Q + offsets, mask=in_tile, other=0.0)
    do = tl.load(DO + offsets, mask=in_tile, other=0.0)
    row_offsets = batch_head.to(tl.int64) * seq_q + rows
    lse = tl.load(LSE + row_offsets, mask=rows < seq_q, other=0.0) * LOG2_E
    delta = tl.load(DELTA + row_offsets, mask=rows < seq_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2_E

    unmasked_end, stop = key_tile_range(pid_m * BLOCK_M, seq_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    k_src, v_src = key_value_sources(K, V, K + kv_offset, V + kv_offset, heads, seq_k,
                                     stride_kb, stride_kh, stride_kn, stride_kb, stride_kh,
                                     stride_kn, GROUP, HEAD_DIM, BLOCK_N, TMA)
    b32, h_kv32 = b.to(tl.int32), (h // GROUP).to(tl.int32)     # a descriptor's coordinates
    dq = _dq_from_tiles(dq, q, do, lse, delta, k_src, v_src, b32, h_kv32, stride_kn, rows,
                        0, unmasked_end, seq_k, diag, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N,
                        False, CAUSAL, TMA)
    dq = _dq_from_tiles(dq, q, do, lse, delta, k_src, v_src, b32, h_kv32, stride_kn, rows,
                        unmasked_end, stop, seq_k, diag, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N,
                        True, CAUSAL, TMA)
    tl.store(DQ + offsets, (dq * sm_scale).to(DQ.dtype.element_ty), mask=in_tile)


def launch(do, q, k, v, o, lse, dq, dk, dv, delta, diagonal: int | None, sm_scale: float,
           *, dkdv: dict, dq_tiles: dict) -> None:
    """Fill ``dq``, ``dk``, ``dv`` (and the scratch ``delta``) for checked 4-D tensors.

    ``q``, ``o``, ``do`` and ``dq`` share one layout, as do ``k``, ``v``, ``dk`` and ``dv``
    (the public launcher makes them contiguous). ``dkdv`` and ``dq_tiles`` each hold
    ``block_m``, ``block_n``, ``num_warps`` and ``num_stages`` for their kernel.
    ``diagonal``: query ``i`` sees keys ``j <= i + diagonal``; None, every key."""
    launch_preprocess(do, o, delta)
    launch_dkdv(do, q, k, v, lse, delta, dk, dv, diagonal, sm_scale, **dkdv)
    launch_dq(do, q, k, v, lse, delta, dq, diagonal, sm_scale, **dq_tiles)


def _shared(q, k, diagonal) -> dict:
    """The launch arguments every backward kernel takes alike."""
    head_dim = q.shape[-1]
    return dict(GROUP=q.shape[1] // k.shape[1], HEAD_DIM=head_dim,
                BLOCK_D=triton.next_power_of_2(head_dim), CAUSAL=diagonal is not None)


def launch_preprocess(do, o, delta):
    """``delta = rowsum(dO * O)``, one float a query row. Each launch returns what Triton's
    launch returns: the compiled kernel, on a GPU."""
    batch, heads, seq_q, head_dim = o.shape
    return attention_bwd_preprocess_kernel[(triton.cdiv(seq_q, 64), batch * heads)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), heads, seq_q, HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=64)


def launch_dkdv(do, q, k, v, lse, delta, dk, dv, diagonal: int | None, sm_scale: float, *,
                block_m: int, block_n: int, num_warps: int, num_stages: int,
                tma: bool = False, compile_only: bool = False):
    """dK and dV, one K/V tile a program (``delta`` already filled); ``tma`` and
    ``compile_only``: as :func:`helpers.kernels.attention.forward.launch` (here the Q and
    dO tiles)."""
    batch, heads, seq_q, _ = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    return launcher(attention_bwd_dkdv_kernel, (triton.cdiv(seq_k, block_n), batch * kv_heads),
             compile_only)(
        q, k, v, do, lse, delta, dk, dv, sm_scale, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), heads, seq_q, seq_k, diagonal or 0,
        **_shared(q, k, diagonal), BLOCK_M=block_m, BLOCK_N=block_n,
        TMA=use_descriptors(tma, q, q, do), num_warps=num_warps, num_stages=num_stages)


def launch_dq(do, q, k, v, lse, delta, dq, diagonal: int | None, sm_scale: float, *,
              block_m: int, block_n: int, num_warps: int, num_stages: int,
              tma: bool = False, compile_only: bool = False):
    """dQ, one Q tile a program (``delta`` already filled); ``tma`` (the K and V tiles)
    and ``compile_only``: as :func:`helpers.kernels.attention.forward.launch`."""
    batch, heads, seq_q, _ = q.shape
    seq_k = k.shape[2]
    return launcher(attention_bwd_dq_kernel, (triton.cdiv(seq_q, block_m), batch * heads),
             compile_only)(
        q, k, v, do, lse, delta, dq, sm_scale, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), heads, seq_q, seq_k, diagonal or 0,
        **_shared(q, k, diagonal), BLOCK_M=block_m, BLOCK_N=block_n,
        TMA=use_descriptors(tma, q, k, v), num_warps=num_warps, num_stages=num_stages)


# The tensors each kernel takes first, in its order; every argument after them is fixed
# by the call's signature.
_TENSORS = {"preprocess": ("O", "DO", "DELTA"),
            "dkdv": ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV"),
            "dq": ("Q", "K", "V", "DO", "LSE", "DELTA", "DQ")}


def kept_call(compiled: tuple, do, q, k, v, o, lse, grads: tuple, diagonal: int | None,
              sm_scale: float, *, dkdv: dict, dq_tiles: dict):
    """After the three launches returned ``compiled`` (preprocess, dK/dV, dQ) for the
    caller's contiguous ``do``, ``q``, ``k``, ``v``, ``o``, ``lse`` (3-D or 4-D) and filled
    ``grads`` (dQ, dK, dV): ``call(do, q, k, v, o, lse) -> (dq, dk, dv)`` for later tensors
    of the same signature (:mod:`~helpers.kernels.attention.kept`), the outputs allocated
    and the compiled kernels launched directly. ``None`` in the interpreter, or where the
    direct launches do not give ``grads`` again."""
    if not all(hasattr(c, "run") for c in compiled):    # the interpreter: nothing compiled
        return None
    q4, k4, v4, do4, o4 = (x.unsqueeze(1) for x in (q, k, v, do, o)) if q.dim() == 3 \
        else (q, k, v, do, o)
    batch, heads, seq_q, head_dim = q4.shape
    kv_heads, seq_k = k4.shape[1], k4.shape[2]
    common = dict(sm_scale=sm_scale, stride_qb=q4.stride(0), stride_qh=q4.stride(1),
                  stride_qm=q4.stride(2), stride_kb=k4.stride(0), stride_kh=k4.stride(1),
                  stride_kn=k4.stride(2), heads=heads, seq_q=seq_q, seq_k=seq_k,
                  diag=diagonal or 0, **_shared(q4, k4, diagonal))
    named = {"preprocess": dict(stride_ob=o4.stride(0), stride_oh=o4.stride(1),
                                stride_om=o4.stride(2), heads=heads, seq_q=seq_q,
                                HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
                                BLOCK_M=64),
             "dkdv": {**common, "BLOCK_M": dkdv["block_m"], "BLOCK_N": dkdv["block_n"],
                      "TMA": use_descriptors(dkdv.get("tma"), q4, q4, do4)},
             "dq": {**common, "BLOCK_M": dq_tiles["block_m"], "BLOCK_N": dq_tiles["block_n"],
                    "TMA": use_descriptors(dq_tiles.get("tma"), q4, k4, v4)}}
    descriptors = named["dkdv"]["TMA"] or named["dq"]["TMA"]
    grids = {"preprocess": (triton.cdiv(seq_q, 64), batch * heads, 1),
             "dkdv": (triton.cdiv(seq_k, dkdv["block_n"]), batch * kv_heads, 1),
             "dq": (triton.cdiv(seq_q, dq_tiles["block_m"]), batch * heads, 1)}
    kernels = {"preprocess": attention_bwd_preprocess_kernel,
               "dkdv": attention_bwd_dkdv_kernel, "dq": attention_bwd_dq_kernel}
    tails, launches = {}, {}
    try:
        for (name, kernel), built in zip(kernels.items(), compiled):
            first = len(_TENSORS[name])
            if tuple(kernel.arg_names[:first]) != _TENSORS[name]:
                return None                 # the kernel's arguments moved: keep nothing
            tails[name] = tuple(named[name][arg] for arg in kernel.arg_names[first:])
            launches[name] = lean(built, grids[name], q4.get_device())
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    pre, pre_tail = launches["preprocess"], tails["preprocess"]
    go_dkdv, dkdv_tail = launches["dkdv"], tails["dkdv"]
    go_dq, dq_tail = launches["dq"], tails["dq"]
    shapes = (q.shape, k.shape, v.shape, lse.shape)
    dtype, device, f32 = q.dtype, q.device, torch.float32

    def into(do, q, k, v, o, lse, dq, dk, dv, delta):
        if descriptors:         # this thread may not have the allocator the first call set
            allocator_for_descriptors()
        pre(o, do, delta, *pre_tail)
        go_dkdv(q, k, v, do, lse, delta, dk, dv, *dkdv_tail)
        go_dq(q, k, v, do, lse, delta, dq, *dq_tail)
        return dq, dk, dv

    def call(do, q, k, v, o, lse):
        return into(do, q, k, v, o, lse, torch.empty(shapes[0], dtype=dtype, device=device),
                    torch.empty(shapes[1], dtype=dtype, device=device),
                    torch.empty(shapes[2], dtype=dtype, device=device),
                    torch.empty(shapes[3], dtype=f32, device=device))

    # The direct launches must give the first grads again, into buffers of NaN (which
    # equals nothing: a launch that wrote nothing cannot pass).
    nan = float("nan")
    try:
        again = into(do, q, k, v, o, lse,
                     *(torch.full(x, nan, dtype=dtype, device=device) for x in shapes[:3]),
                     torch.empty(shapes[3], dtype=f32, device=device))
    except Exception:   # noqa: BLE001 - another Triton's launcher: the usual path serves
        return None
    want = tuple(g.view(x.shape) for g, x in zip(grads, again))
    return call if all(torch.equal(a, b) for a, b in zip(again, want)) else None
