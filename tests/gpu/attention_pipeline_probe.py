"""Probe: does the attention forward gain from overlapping the softmax with the next
QK^T, and from visiting a causal head's longest query tiles first?

The course forward runs each K tile's work in order: S = Q K^T on the tensor cores, then
the softmax on S (CUDA cores and the MUFU unit), then P V. The tensor cores sit idle while
the softmax runs. FlashAttention-3 overlaps the two inside a warp group: it issues the
next tile's Q K^T before the softmax of this one, and waits for it only after. In Triton
the same order can be written by hand: the loop carries the next tile's scores, and a
``tl.dot`` whose result is first used at the loop's end may stay in flight (wgmma is
asynchronous) while the softmax instructions after it run.

Causal heads are uneven: the query tile at the end of a sequence visits every key tile,
the first one a single tile. The grid launches query tiles in order, so the longest come
last and the GPU's last wave is a few long programs. ``REVERSE`` launches them longest
first (as FlashAttention-2 and -3 do).

Batch 4, 16 heads, bf16, 8,192 and 4,096 tokens, d = 64 and 128, causal and not; all
K/V (and Q, O) tiles through rank-4 tensor descriptors; do_bench medians of three
interleaved rounds; beside the course forward (the tuner's choice) and SDPA's default.

    PYTHONPATH=$PWD [PROBE_SET=lazy] python3 tests/gpu/attention_pipeline_probe.py
                                                         # -> $OUT/attention_pipe.json

A third variant, ``LAZY`` (FlashAttention-4's), keeps a row's old maximum until a tile's
exceeds it by 8 (a factor of 2^8 in P, harmless in fp32 sums and a bf16 P), and skips the
``acc`` rescale for the whole tile when no row's did: Nsight Compute counted 3 non-fused
FP32 instructions to every fused one in the course forward, the rescale's multiplies among
them.

Measured on an H200 (triton 3.6, torch 2.11), TFLOP/s, 8,192 tokens, d = 128, non-causal
/ causal; every variant's best setting:

* in order, 128 x 64 tiles, 4 warps, 2 stages: 516 / 479 (SDPA's default, cuDNN: 638 /
  569); d = 64, 128 x 64, 4 warps, 3 stages: 408 / 372 (the course's pointer kernel: 424 /
  398);
* the next QK^T issued before the softmax: 454 / 420 at best, and 135 with 128 x 64 tiles,
  4 warps, 2 stages (registers spilled): slower at every setting, d = 64 and 4,096 tokens
  too. Triton waits for the early product before the softmax runs, so the order costs
  registers and gains no overlap: compiled for sm_90 without a GPU (Triton 3.7.1,
  ``triton.compile`` with ``GPUTarget("cuda", 90, 32)``, 128 x 64 tiles, 4 warps, 2
  stages), the TTGIR puts ``ttng.warp_group_dot_wait {pendings = 0}`` on the next tile's
  scores right after their ``warp_group_dot``, before the softmax's first ``tt.reduce``;
* longest tiles first: within 1-2% of in order either way (473 against 479 at 8k, 428
  against 409 at 4k, 401 against 422 with 64 x 64 tiles): no consistent gain;
* the lazy rescale: 486 / 452 against 523 / 494 in the same run; slower at every setting,
  d = 64 too. The tile-wide test needs a reduction across the warps (shared memory and a
  barrier) every tile, which costs more than the multiplies it saves.

Nsight Compute on the course forward (``tests/gpu/attention_ncu_probe.py``, the descriptor
setting): tensor pipe active 59% of the cycles, the MUFU (``exp2``) 32%, FMA 17%, ALU 18%,
5.3 cycles between a warp's instructions: neither the tensor cores nor the softmax's units
are saturated; the warps wait on one another's turns.
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from helpers.kernels import attention as ak
from helpers.kernels.attention import tuning

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, rows, cols, qk_scale, MASKED: tl.constexpr,
                LAZY: tl.constexpr):
    if MASKED:
        s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_max = tl.max(s, 1) * qk_scale
    if LAZY:
        # Keep the old maximum unless some row's grew past it by 8 (a factor of 2^8 in
        # p, harmless in fp32 sums and a bf16 P): then no acc rescale at all this tile.
        grow = (m_max > m_i + 8.0).to(tl.int32)
        if tl.max(grow, 0) > 0:
            m_new = tl.maximum(m_i, m_max)
            alpha = tl.math.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
    else:
        m_new = tl.maximum(m_i, m_max)
        alpha = tl.math.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    p = tl.math.exp2(s * qk_scale - m_i[:, None])
    l_i = l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, rows, lo, hi, qk_scale,
          BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
          LAZY: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, k.T)
        v = desc_v.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, rows,
                                    start_n + tl.arange(0, BLOCK_N), qk_scale, MASKED, LAZY)
    return acc, l_i, m_i


@triton.jit
def _keys_pipelined(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, rows, lo, hi, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Unmasked tiles lo .. hi (at least one): the next tile's scores issued before this
    tile's softmax."""
    k = desc_k.load([b, h_kv, lo, 0]).reshape(BLOCK_N, HEAD_DIM)
    s = tl.dot(q, k.T)
    for start_n in range(lo, hi - BLOCK_N, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k_next = desc_k.load([b, h_kv, start_n + BLOCK_N, 0]).reshape(BLOCK_N, HEAD_DIM)
        s_next = tl.dot(q, k_next.T)
        v = desc_v.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, rows, rows, qk_scale, False, False)
        s = s_next
    v = desc_v.load([b, h_kv, hi - BLOCK_N, 0]).reshape(BLOCK_N, HEAD_DIM)
    acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, rows, rows, qk_scale, False, False)
    return acc, l_i, m_i


@triton.jit
def fwd(Q, K, V, O, LSE, sm_scale, batch, heads, seq,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PIPE: tl.constexpr,
        REVERSE: tl.constexpr, LAZY: tl.constexpr):
    pid_m = tl.program_id(0)
    if REVERSE:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    h_kv = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * LOG2_E
    desc_q = tl.make_tensor_descriptor(Q, [batch, heads, seq, HEAD_DIM], [sqb, sqh, sqm, 1],
                                       [1, 1, BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, [batch, heads // GROUP, seq, HEAD_DIM],
                                       [skb, skh, skn, 1], [1, 1, BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, [batch, heads // GROUP, seq, HEAD_DIM],
                                       [svb, svh, svn, 1], [1, 1, BLOCK_N, HEAD_DIM])
    q = desc_q.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    unmasked_end = pid_m * BLOCK_M if CAUSAL else seq
    if PIPE:
        if unmasked_end > 0:
            acc, l_i, m_i = _keys_pipelined(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, rows, 0,
                                            unmasked_end, qk_scale, BLOCK_N, HEAD_DIM)
    else:
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, rows, 0,
                              unmasked_end, qk_scale, BLOCK_N, HEAD_DIM, False, LAZY)
    if CAUSAL:
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, rows, unmasked_end,
                              unmasked_end + BLOCK_M, qk_scale, BLOCK_N, HEAD_DIM, True, LAZY)
    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(LSE + bh * seq + rows, (m_i + tl.math.log2(l_i)) * LN_2)
    desc_o = tl.make_tensor_descriptor(O, [batch, heads, seq, HEAD_DIM], [sob, soh, som, 1],
                                       [1, 1, BLOCK_M, HEAD_DIM])
    desc_o.store([b, h, pid_m * BLOCK_M, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))


def run(q, k, v, causal, bm, bn, w, s, pipe, reverse, lazy=False):
    batch, heads, seq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    fwd[(triton.cdiv(seq, bm), batch * heads)](
        q, k, v, o, lse, d ** -0.5, batch, heads, seq, *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *o.stride()[:3], GROUP=heads // k.shape[1], HEAD_DIM=d, BLOCK_M=bm,
        BLOCK_N=bn, CAUSAL=causal, PIPE=pipe, REVERSE=reverse, LAZY=lazy, num_warps=w,
        num_stages=s)
    return o


TILES = [(128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2),
         (128, 128, 8, 3), (64, 64, 4, 3)]


def variants(causal):
    """(tiles, pipelined, reversed, lazy) to time. PROBE_SET=lazy: three settings with and
    without the lazy rescale (the first probe's sweep, pipelined and reversed, left out)."""
    if os.environ.get("PROBE_SET") == "lazy":
        return [(c, False, False, lazy) for c in TILES[:4] for lazy in (False, True)]
    return [(c, pipe, rev, False) for c in TILES for pipe in (False, True)
            for rev in ((False, True) if causal else (False,))]


def main():
    out = os.environ.get("OUT", ".")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    b, h = 4, 16
    for n in (8192, 4096):
        for d in (128, 64):
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v,
                                                                      is_causal=causal),
                       "course": lambda: ak.flash_attention_forward(q, k, v, causal)}
                ak.flash_attention_forward(q, k, v, causal)      # the tuner's first call
                notes = {}
                for cfg, pipe, reverse, lazy in variants(causal):
                    name = (f"{cfg[0]}x{cfg[1]} w{cfg[2]} s{cfg[3]}" + (" pipe" if pipe else "")
                            + (" rev" if reverse else "") + (" lazy" if lazy else ""))
                    try:
                        got = run(q, k, v, causal, *cfg, pipe, reverse, lazy)
                        torch.cuda.synchronize()
                    except Exception as e:      # noqa: BLE001 - out of resources
                        notes[name] = f"{type(e).__name__}: {str(e)[:160]}"
                        continue
                    err = (got.float() - ref.float()).abs().max().item()
                    if not err < 2e-2:
                        notes[name] = f"wrong: {err}"
                        continue
                    fns[name] = (lambda c=cfg, p=pipe, r=reverse, z=lazy:
                                 run(q, k, v, causal, *c, p, r, z))
                taken = {key: [] for key in fns}
                for _ in range(3):
                    for key, fn in fns.items():
                        taken[key].append(do_bench(fn, warmup=10, rep=50))
                work = 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {key: round(work / statistics.median(t) / 1e9, 1)
                      for key, t in taken.items()}
                row = dict(n=n, d=d, causal=causal, sdpa=tf["sdpa"], course=tf["course"],
                           chosen=tuning.chosen("forward", q, k, causal), tflops=tf,
                           notes=notes)
                print(json.dumps({key: row[key] for key in ("n", "d", "causal", "sdpa",
                                                            "course", "chosen")}), flush=True)
                for key, val in sorted(tf.items(), key=lambda kv: -kv[1])[:12]:
                    print(f"   {val:7.1f}  {key}")
                for key, note in notes.items():
                    print(f"   skipped {key}: {note}")
                rows.append(row)
                with open(os.path.join(out, "attention_pipe.json"), "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
