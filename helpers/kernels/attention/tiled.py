"""FlashAttention-2 in plain PyTorch: the algorithm over blocks, before any kernel.

Lesson 06 shows the algorithm working here first, where every intermediate can be
printed, and only then as a Triton kernel (:mod:`helpers.kernels.attention.forward`,
:mod:`helpers.kernels.attention.backward`) that does exactly these steps with each
block in SRAM and registers.

Tensors are four-dimensional here: ``q`` is ``(batch, heads, seq_q, d)``, ``k`` and ``v``
are ``(batch, kv_heads, seq_k, d)`` with ``heads`` a multiple of ``kv_heads`` (grouped-query
attention: each K/V head serves ``heads // kv_heads`` query heads). The public functions
of :mod:`helpers.kernels.attention` also take ``(batch, seq, d)`` and check their inputs.

* :func:`forward`: Q blocks outer, K/V blocks inner. Each Q block keeps a running
  maximum ``m``, a running sum ``l`` and an unnormalised output ``acc``; every new K/V
  block may raise the maximum, and then the old sum and output are rescaled by
  ``exp(m_old - m_new)`` before the block's terms are added (the online softmax). The
  ``N x N`` score matrix never exists: only one ``block_m x block_n`` piece at a time.
  It returns the output and the log-sum-exp ``lse = m + log(l)`` of every row.
* :func:`backward`: recomputes each block of probabilities from Q, K and the saved
  lse (``P = exp(S - lse)``, no second softmax pass), and accumulates dQ, dK and dV.
  ``delta = rowsum(dO * O)`` replaces the softmax's Jacobian: ``dS = P * (dP - delta)``.

Everything is computed in fp32 (the kernels' accumulators are fp32 too) and the outputs
are rounded once to the inputs' dtype.
"""

from __future__ import annotations

import math

import torch


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with one head per query head: kv head ``h // group`` serves query head ``h``."""
    group = heads // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def causal_diagonal(causal, seq_q: int, seq_k: int) -> int | None:
    """Where the causal mask's diagonal lies: query ``i`` sees keys ``j <= i + diagonal``;
    None when nothing is masked.

    ``True`` or ``"top_left"``: 0, the first query sees the first key, as
    ``scaled_dot_product_attention(is_causal=True)``. ``"bottom_right"``: ``seq_k - seq_q``,
    the last query sees every key, as FlashAttention since 2.1: new queries appended after a
    cache of keys (chunked prefill, decoding). With more queries than keys, the first
    ``seq_q - seq_k`` queries then see no key at all."""
    if isinstance(causal, str):
        if causal in ("top_left", "bottom_right"):
            return 0 if causal == "top_left" else seq_k - seq_q
    elif type(causal).__name__ in ("bool", "bool_"):        # Python's, NumPy's
        return 0 if causal else None
    raise ValueError(f"causal={causal!r}: pass False, True (the same as 'top_left') or "
                     "'bottom_right'")


def causal_mask(rows: torch.Tensor, cols: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    """True where query ``i`` may see key ``j``: ``j <= i + diagonal``
    (:func:`causal_diagonal`; 0 aligns the mask at the top left)."""
    return cols[None, :] <= (rows[:, None] + diagonal if diagonal else rows[:, None])


def forward(q, k, v, causal: bool, sm_scale: float, block_m: int = 64, block_n: int = 64):
    """``(o, lse)`` for 4-D inputs, block by block. ``lse`` is fp32, natural log."""
    batch, heads, seq_q, _ = q.shape
    seq_k = k.shape[2]
    diag = causal_diagonal(causal, seq_q, seq_k)
    k, v = expand_kv(k, heads).float(), expand_kv(v, heads).float()
    o = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    for i0 in range(0, seq_q, block_m):
        rows = torch.arange(i0, min(i0 + block_m, seq_q), device=q.device)
        q_block = q[:, :, i0:i0 + block_m].float()
        m = torch.full(q_block.shape[:-1], -math.inf, device=q.device)  # running maximum
        l = torch.zeros_like(m)                                          # running sum
        acc = torch.zeros_like(q_block)                                  # unnormalised output
        # Causal: key blocks past what this block's last row sees are never visited.
        stop = seq_k if diag is None else max(0, min(seq_k, i0 + block_m + diag))
        for j0 in range(0, stop, block_n):
            cols = torch.arange(j0, min(j0 + block_n, seq_k), device=q.device)
            s = q_block @ k[:, :, j0:j0 + block_n].transpose(-1, -2) * sm_scale
            if diag is not None and j0 + block_n > i0 + diag:   # blocks across the diagonal
                s = s.masked_fill(~causal_mask(rows, cols, diag), -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            # A row that has seen only -inf so far keeps m = -inf; shift by 0 instead,
            # so that exp(-inf - (-inf)) never makes a NaN.
            shift = torch.where(m_new == -math.inf, 0.0, m_new)
            rescale = torch.exp(m - shift)            # exp(m_old - m_new) <= 1
            p = torch.exp(s - shift[..., None])
            l = l * rescale + p.sum(dim=-1)
            acc = acc * rescale[..., None] + p @ v[:, :, j0:j0 + block_n]
            m = m_new
        # A row that sees no key (l = 0) gets output 0 and lse +inf: the backward's
        # recomputed P = exp(S - lse) is then exactly 0.
        o[:, :, i0:i0 + block_m] = acc / torch.where(l == 0, 1.0, l)[..., None]
        lse[:, :, i0:i0 + block_m] = torch.where(l == 0, math.inf, m + torch.log(l))
    return o.to(q.dtype), lse


def backward(do, q, k, v, o, lse, causal: bool, sm_scale: float,
             block_m: int = 64, block_n: int = 64):
    """``(dq, dk, dv)`` for 4-D inputs, recomputing each probability block from ``lse``."""
    heads, seq_q, seq_k = q.shape[1], q.shape[2], k.shape[2]
    diag = causal_diagonal(causal, seq_q, seq_k)
    qf, dof = q.float(), do.float()
    kf, vf = expand_kv(k, heads).float(), expand_kv(v, heads).float()
    delta = (dof * o.float()).sum(dim=-1)             # rowsum(dO * O): one number a row
    dq = torch.zeros_like(qf)
    dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
    for i0 in range(0, seq_q, block_m):
        rows = torch.arange(i0, min(i0 + block_m, seq_q), device=q.device)
        qi, doi = qf[:, :, i0:i0 + block_m], dof[:, :, i0:i0 + block_m]
        lse_i = lse[:, :, i0:i0 + block_m, None]
        delta_i = delta[:, :, i0:i0 + block_m, None]
        stop = seq_k if diag is None else max(0, min(seq_k, i0 + block_m + diag))
        for j0 in range(0, stop, block_n):
            cols = torch.arange(j0, min(j0 + block_n, seq_k), device=q.device)
            kj, vj = kf[:, :, j0:j0 + block_n], vf[:, :, j0:j0 + block_n]
            s = qi @ kj.transpose(-1, -2) * sm_scale
            if diag is not None and j0 + block_n > i0 + diag:
                s = s.masked_fill(~causal_mask(rows, cols, diag), -math.inf)
            p = torch.exp(s - lse_i).nan_to_num(0.0)  # the forward's probabilities, again
            dv[:, :, j0:j0 + block_n] += p.transpose(-1, -2) @ doi
            dp = doi @ vj.transpose(-1, -2)
            ds = p * (dp - delta_i)                   # the softmax's backward, per element
            dq[:, :, i0:i0 + block_m] += ds @ kj * sm_scale
            dk[:, :, j0:j0 + block_n] += ds.transpose(-1, -2) @ qi * sm_scale
    # Grouped-query attention: a K/V head's gradient sums over the query heads it serves.
    batch, kv_heads = k.shape[:2]
    dk = dk.view(batch, kv_heads, -1, seq_k, k.shape[-1]).sum(dim=2)
    dv = dv.view(batch, kv_heads, -1, seq_k, v.shape[-1]).sum(dim=2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
