"""The forward pass for a head that is two powers of two wide: 80 = 64 + 16, 96 = 64 + 32,
192 = 128 + 64 (also 48, 144 and 160).

Triton's blocks are powers of two, so :mod:`.forward` holds such a head ``BLOCK_D`` wide,
the next power of two, and masks the rest: at d = 192 a quarter of every ``Q K^T`` and
``P V`` product is zeros times zeros, at d = 80 three eighths. The tensor cores do that
work all the same. cuDNN multiplies the head as it is; so does this kernel, in two
column pieces of widths ``BLOCK_D`` and ``BLOCK_E`` that add up to the head exactly:

* scores: ``S = Q1 K1^T + Q2 K2^T``, two products accumulated into one fp32 tile (the
  second ``tl.dot`` takes the first's result as its accumulator), so the softmax sees
  the same scores as with one product;
* output: ``acc1 += P V1`` and ``acc2 += P V2``, one accumulator per piece, rescaled
  together by the online softmax and stored side by side.

Nothing is masked by column and no product multiplies padding. Everything else (the
online softmax, the saved log-sum-exp) is :mod:`.forward`'s, but for one line: this kernel
scales the scores before the softmax, where :mod:`.forward` folds the scale into the
exponent's multiply-add (measured there only). The causal split into unmasked, diagonal
and skipped tiles is :func:`.causal.key_tile_range`;
:mod:`.forward` imports this module, so the two constants are written out again here.
The kernel takes the same arguments, with ``BLOCK_E`` after ``BLOCK_D``;
:func:`.forward.launch` picks it for a head that :func:`pieces` splits.

Measured on an H200 (``tests/gpu/attention_split_probe.py``: bf16, batch 4, 16 heads, 4,096
tokens, the table's tiles for both kernels), the split forward ran 1.11x / 1.15x as fast as
the padded one at d = 80 (non-causal / causal), 1.10x / 1.11x at d = 96 and 1.11x / 1.07x
at d = 192. That is less than the padding's share of the products (3/8 at d = 80, 1/4 at
192): the softmax's work on each score, which the pieces do not change, is the rest of a
tile's time. With the tuner, against SDPA's default (cuDNN): 1.00x / 0.98x at d = 80,
0.90x / 0.92x at 96, 0.76x / 0.77x at 192 (``helpers/records/attention_decode__H200.json``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .causal import key_tile_range

LOG2_E = tl.constexpr(1.4426950408889634)   # as in .forward: scores in base 2
LN_2 = tl.constexpr(0.6931471805599453)     # and the saved lse back in natural log
LEAST_PIECE = 16    # tl.dot's least K (16 elements, fp16, bf16 and tf32 alike)


def pieces(head_dim: int) -> tuple[int, int] | None:
    """``(BLOCK_D, BLOCK_E)``, two powers of two of at least :data:`LEAST_PIECE` adding up
    to ``head_dim`` (96 -> (64, 32)); None for a power of two, or a head no two such
    pieces make (112 = 64 + 48): the padded kernel of :mod:`.forward` takes those."""
    if head_dim & (head_dim - 1) == 0:
        return None
    first = 1 << (head_dim.bit_length() - 1)       # the largest power of two inside
    second = head_dim - first
    if second < LEAST_PIECE or second & (second - 1):
        return None
    return first, second


@triton.jit
def _load_rows(ptrs, rows, n_rows, MASK_ROWS: tl.constexpr):
    """A piece of a tile of rows: with ``MASK_ROWS``, rows from ``n_rows`` on load as zeros.
    Every column is the head's: no column mask."""
    if MASK_ROWS:
        x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _visit_key_tiles_split(acc1, acc2, l_i, m_i, q1, q2, k_head, v_head, stride_kn,
                           stride_vn, rows, start, stop, seq_k, diag, qk_scale,
                           BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                           BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """:mod:`.forward`'s inner loop with the head in two pieces."""
    dims1 = tl.arange(0, BLOCK_D)
    dims2 = BLOCK_D + tl.arange(0, BLOCK_E)
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + tl.arange(0, BLOCK_N)
        k1 = _load_rows(k_head + cols[:, None] * stride_kn + dims1[None, :], cols, seq_k,
                        MASKED)
        k2 = _load_rows(k_head + cols[:, None] * stride_kn + dims2[None, :], cols, seq_k,
                        MASKED)
        # One score tile from two products: the second accumulates onto the first.
        s = tl.dot(q1, tl.trans(k1))
        s = tl.dot(q2, tl.trans(k2), s) * qk_scale
        if MASKED:
            visible = cols[None, :] < seq_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + diag)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        rescale = tl.math.exp2(m_i - m_new)
        l_i = l_i * rescale + tl.sum(p, 1)
        v1 = _load_rows(v_head + cols[:, None] * stride_vn + dims1[None, :], cols, seq_k,
                        MASKED)
        v2 = _load_rows(v_head + cols[:, None] * stride_vn + dims2[None, :], cols, seq_k,
                        MASKED)
        p = p.to(v1.dtype)
        acc1 = tl.dot(p, v1, acc1 * rescale[:, None])
        acc2 = tl.dot(p, v2, acc2 * rescale[:, None])
        m_i = m_new
    return acc1, acc2, l_i, m_i


@triton.jit
def attention_fwd_split_kernel(Q, K, V, O, LSE, sm_scale,
                               stride_qb, stride_qh, stride_qm,
                               stride_kb, stride_kh, stride_kn,
                               stride_vb, stride_vh, stride_vn,
                               stride_ob, stride_oh, stride_om,
                               heads, seq_q, seq_k, diag,
                               GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               CAUSAL: tl.constexpr):
    tl.static_assert(BLOCK_D + BLOCK_E == HEAD_DIM)
    pid_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    b = (batch_head // heads).to(tl.int64)
    h = (batch_head % heads).to(tl.int64)
    h_kv = h // GROUP
    q_head = Q + b * stride_qb + h * stride_qh
    k_head = K + b * stride_kb + h_kv * stride_kh
    v_head = V + b * stride_vb + h_kv * stride_vh

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims1 = tl.arange(0, BLOCK_D)
    dims2 = BLOCK_D + tl.arange(0, BLOCK_E)
    in_rows = rows[:, None] < seq_q
    q_rows = q_head + rows[:, None] * stride_qm
    q1 = tl.load(q_rows + dims1[None, :], mask=in_rows, other=0.0)
    q2 = tl.load(q_rows + dims2[None, :], mask=in_rows, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    qk_scale = sm_scale * LOG2_E

    unmasked_end, stop = key_tile_range(pid_m * BLOCK_M, seq_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    acc1, acc2, l_i, m_i = _visit_key_tiles_split(
        acc1, acc2, l_i, m_i, q1, q2, k_head, v_head, stride_kn, stride_vn, rows, 0,
        unmasked_end, seq_k, diag, qk_scale, BLOCK_D, BLOCK_E, BLOCK_N, False, CAUSAL)
    acc1, acc2, l_i, m_i = _visit_key_tiles_split(
        acc1, acc2, l_i, m_i, q1, q2, k_head, v_head, stride_kn, stride_vn, rows,
        unmasked_end, stop, seq_k, diag, qk_scale, BLOCK_D, BLOCK_E, BLOCK_N, True, CAUSAL)

    saw_keys = m_i > float("-inf")
    o1 = tl.where(saw_keys[:, None], acc1 / l_i[:, None], 0.0)
    o2 = tl.where(saw_keys[:, None], acc2 / l_i[:, None], 0.0)
    lse = tl.where(saw_keys, (m_i + tl.math.log2(l_i)) * LN_2, float("inf"))
    tl.store(LSE + batch_head.to(tl.int64) * seq_q + rows, lse, mask=rows < seq_q)
    o_rows = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_om
    tl.store(o_rows + dims1[None, :], o1.to(O.dtype.element_ty), mask=in_rows)
    tl.store(o_rows + dims2[None, :], o2.to(O.dtype.element_ty), mask=in_rows)


def constexprs(head_dim: int) -> dict:
    """The split kernel's widths for ``head_dim`` (:func:`pieces` must split it)."""
    first, second = pieces(head_dim)
    return dict(BLOCK_D=first, BLOCK_E=second)
