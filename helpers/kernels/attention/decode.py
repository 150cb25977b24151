"""Attention for a few queries against many keys: the split-KV forward (FlashDecoding).

Decoding appends one token (or a few, with speculative decoding) to a long cache of keys.
The forward kernel of :mod:`helpers.kernels.attention.forward` gives each program a block
of 64-128 query rows of one head; with one query there is one program per head, 32 of
them for a 32-head model at batch 1, on a GPU of 132 SMs, each streaming the whole cache.
The work is all in the keys, so the keys are what gets split:

* :func:`attention_decode_split_kernel`: one program per (batch, K/V head, split of the
  keys). Its rows are every query of every query head that shares the K/V head (grouped-
  query attention: 4 heads x 1 query for a 32/8 model), so each K/V tile is read from HBM
  once for all of them. It runs the online softmax over its own keys only and writes a
  partial output, normalised by its own sum, and its log-sum-exp (fp32, base 2).
* :func:`attention_decode_combine_kernel`: one program a row, the splits' results merged through
  their log-sum-exps: ``lse = log2(sum_s 2^lse_s)`` and ``o = sum_s 2^(lse_s - lse) o_s``,
  the same rescaling the online softmax does between tiles, done once between splits.

Each K and V byte is read once; the partial results are ``splits x rows x d`` fp32, small
next to the cache, written to a workspace kept per stream (:func:`workspace`). The causal
mask works as in the forward kernel (query ``i`` sees keys ``j <= i + diag``); a split in
which a row sees no key gives ``lse_s = -inf`` (weight 0), and a row that sees no key at
all gets output 0 and ``lse = +inf``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import lean

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)

MAX_ROWS = 128          # query heads per K/V head x queries: one tile of rows at most
MAX_SPLITS = 64         # a row's partial results merge as one tile of at most this many


@triton.jit
def attention_decode_split_kernel(Q, K, V, WORK, sm_scale,
                                  stride_qb, stride_qh, stride_qm,
                                  stride_kb, stride_kh, stride_kn,
                                  stride_vb, stride_vh, stride_vn,
                                  kv_heads, seq_q, seq_k, diag, keys_per_split, lse_at,
                                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                  BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                                  BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    batch_kv_head = tl.program_id(0)
    split = tl.program_id(1)
    b = (batch_kv_head // kv_heads).to(tl.int64)
    h_kv = (batch_kv_head % kv_heads).to(tl.int64)
    # Row r is query position r % seq_q of query head h_kv * GROUP + r // seq_q.
    r = tl.arange(0, BLOCK_R)
    pos = r % seq_q
    row_ok = r < GROUP * seq_q
    dims = tl.arange(0, BLOCK_D)
    in_head = dims[None, :] < HEAD_DIM
    q_rows = Q + b * stride_qb + (h_kv * GROUP + r // seq_q) * stride_qh + pos * stride_qm
    q = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & in_head, other=0.0)
    k_head = K + b * stride_kb + h_kv * stride_kh
    v_head = V + b * stride_vb + h_kv * stride_vh

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2_E
    start = split * keys_per_split
    stop = tl.minimum(start + keys_per_split, seq_k)
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        key_ok = cols < stop
        k = tl.load(k_head + cols[:, None] * stride_kn + dims[None, :],
                    mask=key_ok[:, None] & in_head, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        visible = key_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= pos[:, None] + diag)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key of this split yet shifts by 0: no -inf - (-inf).
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        rescale = tl.math.exp2(m_i - shift)
        l_i = l_i * rescale + tl.sum(p, 1)
        v = tl.load(v_head + cols[:, None] * stride_vn + dims[None, :],
                    mask=key_ok[:, None] & in_head, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])
        m_i = m_new

    # The workspace: every split's partial outputs, then their log-sum-exps from lse_at.
    O_PART, LSE_PART = WORK, WORK + lse_at
    saw_keys = m_i > float("-inf")
    part = (batch_kv_head * tl.num_programs(1) + split).to(tl.int64) * BLOCK_R + r
    tl.store(LSE_PART + part, tl.where(saw_keys, m_i + tl.math.log2(l_i), float("-inf")))
    tl.store(O_PART + part[:, None] * BLOCK_D + dims[None, :],
             tl.where(saw_keys[:, None], acc / l_i[:, None], 0.0))


@triton.jit
def attention_decode_combine_kernel(WORK, O, LSE,
                                    stride_ob, stride_oh, stride_om,
                                    kv_heads, seq_q, splits, lse_at,
                                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                                    BLOCK_S: tl.constexpr):
    """One row a program: its ``splits`` partial results loaded as one tile and merged."""
    O_PART, LSE_PART = WORK, WORK + lse_at
    batch_kv_head = tl.program_id(0)
    r = tl.program_id(1)                   # the row, as in the split kernel
    s = tl.arange(0, BLOCK_S)
    split_ok = s < splits
    part = (batch_kv_head.to(tl.int64) * splits + s) * BLOCK_R + r
    lse_s = tl.load(LSE_PART + part, mask=split_ok, other=float("-inf"))
    # The largest split lse, then every split weighted by 2^(lse_s - max).
    m = tl.max(lse_s, 0)
    weight = tl.math.exp2(lse_s - tl.where(m == float("-inf"), 0.0, m))
    dims = tl.arange(0, BLOCK_D)
    o_s = tl.load(O_PART + part[:, None] * BLOCK_D + dims[None, :], mask=split_ok[:, None],
                  other=0.0)
    total = tl.sum(weight, 0)
    saw_keys = m > float("-inf")
    o = tl.where(saw_keys, tl.sum(weight[:, None] * o_s, 0) / total, 0.0)
    lse = tl.where(saw_keys, (m + tl.math.log2(total)) * LN_2, float("inf"))
    b = (batch_kv_head // kv_heads).to(tl.int64)
    h = (batch_kv_head % kv_heads).to(tl.int64) * GROUP + r // seq_q
    pos = r % seq_q
    tl.store(LSE + (b * (kv_heads * GROUP) + h) * seq_q + pos, lse)
    tl.store(O + b * stride_ob + h * stride_oh + pos * stride_om + dims,
             o.to(O.dtype.element_ty), mask=dims < HEAD_DIM)


def rows(heads: int, kv_heads: int, seq_q: int) -> int:
    """The query rows one program holds: every query of the heads sharing a K/V head."""
    return heads // kv_heads * seq_q


def split_keys(programs: int, seq_k: int, block_n: int, target: int) -> tuple[int, int]:
    """``(splits, keys_per_split)``: as many splits as ``programs`` (batch x K/V heads)
    times them fit in ``target`` programs (at least one, at most ``MAX_SPLITS``), each
    split a whole number of ``block_n`` tiles.

    Rounded down, not up: ``target`` is what the GPU runs at once (one wave), and every
    split streams as many keys as the others, so a program past the wave streams its keys
    while most SMs wait. At batch 8 with 8 K/V heads, rounding up gave 5 splits, 320
    programs for 264 places; 4 splits (256) took 0.93-0.94x the kernel time at 8k-128k keys
    (``tests/gpu/decode_split_probe.py``, an H200: 931 against 997 us at 128k keys)."""
    tiles = triton.cdiv(seq_k, block_n)
    want = max(1, min(tiles, MAX_SPLITS, target // programs))
    keys_per_split = triton.cdiv(tiles, want) * block_n
    return triton.cdiv(seq_k, keys_per_split), keys_per_split


# Launch plans by shapes, strides, dtype, device, mask and settings: the splits, the grids
# and, after a plan's first launch on a GPU, each compiled kernel's own launcher. A call
# then skips Triton's binding of the arguments to a specialization (the host's time, not
# the GPU's, paces a decoding step against a short cache).
_plans: dict = {}
MAX_PLANS = 256

# The splits' partial results go to a workspace kept per device and stream, grown as
# needed, not allocated for each call: on the lent H200 machine a ``torch.empty`` cost the
# host 8 us and a launch 9 us, and a decoding step made four of one and two of the other
# (``tests/gpu/host_parts_probe.py``). Reuse is safe on one stream: a call's split kernel
# is queued after the previous call's combine kernel, which read the workspace. Another
# stream gets its own; under CUDA-graph capture each call allocates (the graph's memory).
_workspaces: dict = {}
MAX_WORKSPACES = 16


def workspace(device: torch.device, numel: int) -> torch.Tensor:
    """At least ``numel`` float32s for the current stream of ``device`` to write the
    splits' partial results into (a fresh tensor off the GPU, or under graph capture).
    Kept until the process ends: at most a wave of programs (two per SM) times a tile of
    rows (``MAX_ROWS``) times a head held 256 wide, 35 MB on 132 SMs, per stream."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.empty(numel, dtype=torch.float32, device=device)
    index = torch.cuda.current_device() if device.index is None else device.index
    key = (index, triton.runtime.driver.active.get_current_stream(index))
    work = _workspaces.get(key)
    if work is None or work.numel() < numel:
        if len(_workspaces) >= MAX_WORKSPACES:
            _workspaces.clear()
        work = _workspaces[key] = torch.empty(numel, dtype=torch.float32, device=device)
    return work


def _plan_key(q, k, v, diagonal, block_n, num_warps, num_stages, target_programs) -> tuple:
    # Triton compiles a kernel for pointers on 16-byte boundaries or not: so is the plan.
    aligned = tuple(t.data_ptr() % 16 == 0 for t in (q, k, v))
    return (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, aligned,
            diagonal, block_n, num_warps, num_stages, target_programs)


def launch(q, k, v, o, lse, diagonal: int | None, sm_scale: float, *, block_n: int,
           num_warps: int, num_stages: int, target_programs: int) -> int:
    """Fill ``o`` and ``lse`` for checked 4-D tensors; returns the number of splits.
    ``o`` is contiguous and ``lse`` too (the public launcher makes them)."""
    key = _plan_key(q, k, v, diagonal, block_n, num_warps, num_stages, target_programs)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = _plan(q, k, v, diagonal, block_n, num_warps, num_stages,
                                   target_programs)
    work = workspace(q.device, plan["work"])
    split_args = (q, k, v, work, sm_scale, *plan["split_args"])
    combine_args = (work, o, lse, *plan["combine_args"])
    if plan["runners"] is not None:
        plan["runners"][0](*split_args)
        plan["runners"][1](*combine_args)
        return plan["splits"]
    options = dict(num_warps=num_warps, num_stages=num_stages)
    split = attention_decode_split_kernel[plan["split_grid"]](*split_args, **options)
    combine = attention_decode_combine_kernel[plan["combine_grid"]](*combine_args,
                                                                    num_warps=4)
    # Compiled (not interpreted), each launch returned its kernel: keep their launchers.
    if hasattr(split, "run") and hasattr(combine, "run"):
        plan["runners"] = (lean(split, plan["split_grid"], q.get_device()),
                           lean(combine, plan["combine_grid"], q.get_device()))
    return plan["splits"]


def kept_call(q, k, v, o, lse, diagonal: int | None, sm_scale: float, *, block_n: int,
              num_warps: int, num_stages: int, target_programs: int):
    """After :func:`launch` ran this call's plan compiled: ``call(q, k, v) -> (o, lse)``
    for later tensors of the same shapes, strides, dtype, device and alignment (3-D or
    4-D, as these were; their checks passed once for all), with nothing but the outputs'
    allocation, the workspace's lookup and the two compiled launches. ``None`` before that
    (or in the interpreter), or where the launches do not give the call's ``o`` and ``lse``
    again.
    ``q``, ``k``, ``v``, ``o``, ``lse``: the caller's tensors (3-D ones count as one head).

    A decoding step against a short cache takes about 11 us of GPU time; the call's checks
    and lookups took longer than that on the host (measured on the lent H200 machine: 49 us
    of host time a call, against 23 us for SDPA's)."""
    q4, k4, v4 = (x.unsqueeze(1) for x in (q, k, v)) if q.dim() == 3 else (q, k, v)
    plan = _plans.get(_plan_key(q4, k4, v4, diagonal, block_n, num_warps, num_stages,
                                target_programs))
    if plan is None or plan["runners"] is None:
        return None
    split, combine = plan["runners"]
    split_args, combine_args = plan["split_args"], plan["combine_args"]
    n_work = plan["work"]
    device, dtype = q.device, q.dtype
    o_shape, lse_shape = q.shape, q.shape[:-1]     # contiguous, as the launcher made them
    f32 = torch.float32

    def call(q, k, v):
        o = torch.empty(o_shape, dtype=dtype, device=device)
        lse = torch.empty(lse_shape, dtype=f32, device=device)
        # Two allocations, not views of one: slicing a tensor costs the host more than
        # allocating one (about 1.9 us a view against 1.8 us, on the course's CPU machine).
        work = workspace(device, n_work)
        # A tensor argument is its address: the 3-D tensors are the 4-D views' own.
        split(q, k, v, work, sm_scale, *split_args)
        combine(work, o, lse, *combine_args)
        return o, lse

    # Once, into buffers of NaN (which equals nothing): the call's outputs again.
    o_again, lse_again = (torch.full_like(x, float("nan")) for x in (o, lse))
    work = workspace(device, n_work)
    try:
        split(q, k, v, work, sm_scale, *split_args)
        combine(work, o_again, lse_again, *combine_args)
    except Exception:   # noqa: BLE001 - a launcher that fails: the usual path serves
        return None
    return call if torch.equal(o_again, o) and torch.equal(lse_again, lse) else None


def _plan(q, k, v, diagonal, block_n, num_warps, num_stages, target_programs) -> dict:
    """What every launch of this plan passes besides the tensors and the scale."""
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    block_r = max(16, triton.next_power_of_2(rows(heads, kv_heads, seq_q)))
    block_d = triton.next_power_of_2(head_dim)
    splits, keys_per_split = split_keys(batch * kv_heads, seq_k, block_n, target_programs)
    group, causal = heads // kv_heads, diagonal is not None
    # The workspace: the partial outputs (fp32, a row of block_d for each row of each
    # split), then their log-sum-exps, from lse_at on.
    lse_at = batch * kv_heads * splits * block_r * block_d
    return {
        "splits": splits, "runners": None,
        "work": lse_at + batch * kv_heads * splits * block_r,
        "split_grid": (batch * kv_heads, splits, 1),      # three axes: a launcher's grid
        "split_args": (q.stride(0), q.stride(1), q.stride(2),
                       k.stride(0), k.stride(1), k.stride(2),
                       v.stride(0), v.stride(1), v.stride(2),
                       kv_heads, seq_q, seq_k, diagonal or 0, keys_per_split, lse_at,
                       group, head_dim, block_d, block_r, block_n, causal),
        "combine_grid": (batch * kv_heads, rows(heads, kv_heads, seq_q), 1),
        "combine_args": (heads * seq_q * head_dim, seq_q * head_dim, head_dim,
                         kv_heads, seq_q, splits, lse_at, group, head_dim, block_d, block_r,
                         triton.next_power_of_2(splits)),
    }
