"""Probe: does the attention forward gain from the TMA and Triton's warp specialisation?

The course forward loads its tiles through pointers and runs in one warp group's turn:
loads, QK^T, softmax, PV one after another (the software pipeline overlaps only the loads).
Triton 3.5 and later can warp-specialise a loop on Hopper (``tl.range(...,
warp_specialize=True)``: a producer warp issues the TMA loads, consumer warps compute),
but only for tiles read through tensor descriptors made on the device. This probe times,
side by side in one process, a forward that reads Q, K and V through descriptors, with and
without warp specialisation, for a small space of tiles, beside the course forward (the
tuner's choice, through ``flash_attention_forward``) and SDPA's default.

Batch 4, 16 heads, 8,192 tokens, bf16, d = 64 and 128, causal and not; do_bench medians
of three interleaved rounds (cold L2).

    PYTHONPATH=$PWD python3 tests/gpu/attention_ws_probe.py      # $OUT/attention_ws.json

Measured on an H200 (triton 3.6, torch 2.11), TFLOP/s, SDPA's default being cuDNN:

* d = 128, non-causal: SDPA 607, course (tuned, pointers) 492; rank-4 descriptors without
  warp specialisation, 128 x 64 tiles, 4 warps, 2 stages: 524; rank-2 descriptors with
  warp specialisation, 128 x 128, 4 warps, 1-2 stages: 529-534 (best of all).
* d = 128, causal: SDPA 552, course 446, rank-4 descriptors 128 x 64 w4 s2: 487.
* d = 64: SDPA 472 / 439 (non-causal / causal), course 425 / 400, descriptors at best
  408 / 377: the pointer kernel stays ahead.
* Warp specialisation is not usable as a course setting: it compiles only over rank-2
  descriptors (rank 4 fails in ``NVGPUWarpSpecialization``: "unsupported op type" in
  ``WSDataPartition``), only without the causal mask (with it, Triton 3.6 aborts the whole
  process on an MLIR assertion), and two of its settings gave NaN (128 x 64 with 3 or 4
  stages, 4 warps). Its gain over rank-4 descriptors is 1-2%. So the course forward takes
  rank-4 descriptors without it (``helpers/kernels/attention/forward.py``, ``TMA``).
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

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile(desc, b, h_kv, row, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
          RANK4: tl.constexpr):
    # Rank 4: (batch, heads, keys, d) at (b, h_kv, row); rank 2: (all rows, d) at row.
    if RANK4:
        x = desc.load([b, h_kv, row, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        x = desc.load([row, 0])
    return x


@triton.jit
def _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, kv_row, rows, lo, hi, qk_scale,
          BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
          WS: tl.constexpr, RANK4: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _tile(desc_k, b, h_kv, kv_row + start_n, BLOCK_N, HEAD_DIM, RANK4)
        s = tl.dot(q, k.T) * qk_scale
        if MASKED:
            cols = start_n + tl.arange(0, BLOCK_N)
            s = tl.where(cols[None, :] <= rows[:, None], s, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = _tile(desc_v, b, h_kv, kv_row + start_n, BLOCK_N, HEAD_DIM, RANK4)
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def fwd_tma(Q, K, V, O, LSE, sm_scale, batch, heads, seq, total_q, total_kv,
            sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WS: tl.constexpr,
            RANK4: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * LOG2_E
    if RANK4:
        kv_heads = heads // GROUP
        desc_q = tl.make_tensor_descriptor(Q, [batch, heads, seq, HEAD_DIM], [sqb, sqh, sqm, 1],
                                           [1, 1, BLOCK_M, HEAD_DIM])
        desc_k = tl.make_tensor_descriptor(K, [batch, kv_heads, seq, HEAD_DIM],
                                           [skb, skh, skn, 1], [1, 1, BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(V, [batch, kv_heads, seq, HEAD_DIM],
                                           [svb, svh, svn, 1], [1, 1, BLOCK_N, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(O, [batch, heads, seq, HEAD_DIM], [sob, soh, som, 1],
                                           [1, 1, BLOCK_M, HEAD_DIM])
        q = desc_q.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
        kv_row = 0
    else:
        q_row = bh * seq + pid_m * BLOCK_M
        kv_row = (b * (heads // GROUP) + h // GROUP) * seq
        desc_q = tl.make_tensor_descriptor(Q, [total_q, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_M, HEAD_DIM])
        desc_k = tl.make_tensor_descriptor(K, [total_kv, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(V, [total_kv, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_N, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(O, [total_q, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_M, HEAD_DIM])
        q = desc_q.load([q_row, 0])
    h_kv = h // GROUP
    if CAUSAL:
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, kv_row, rows, 0,
                              pid_m * BLOCK_M, qk_scale, BLOCK_N, HEAD_DIM, False, WS, RANK4)
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, kv_row, rows,
                              pid_m * BLOCK_M, pid_m * BLOCK_M + BLOCK_M, qk_scale, BLOCK_N,
                              HEAD_DIM, True, WS, RANK4)
    else:
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, b, h_kv, kv_row, rows, 0,
                              seq, qk_scale, BLOCK_N, HEAD_DIM, False, WS, RANK4)
    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(LSE + bh * seq + rows, (m_i + tl.math.log2(l_i)) * LN_2)
    if RANK4:
        desc_o.store([b, h, pid_m * BLOCK_M, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        desc_o.store([pid_m * BLOCK_M + bh * seq, 0], o)


def run_tma(q, k, v, causal, bm, bn, w, s, ws, rank4=True):
    batch, heads, seq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    fwd_tma[(triton.cdiv(seq, bm), batch * heads)](
        q, k, v, o, lse, d ** -0.5, batch, heads, seq, batch * heads * seq,
        batch * k.shape[1] * seq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *o.stride()[:3], GROUP=heads // k.shape[1], HEAD_DIM=d, BLOCK_M=bm,
        BLOCK_N=bn, CAUSAL=causal, WS=ws, RANK4=rank4, num_warps=w, num_stages=s)
    return o


# (block_m, block_n, warps, stages, warp-specialised, rank-4 descriptors). Warp
# specialisation is tried only without the causal mask: Triton 3.6 aborts the process
# (an MLIR assertion) compiling it over the causal kernel's two loops.
PLAIN = [(128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3),
         (128, 128, 8, 3), (64, 64, 4, 3)]
SPECIALISED = [(128, 128, 4, 2), (128, 64, 4, 2), (128, 128, 4, 3), (128, 64, 4, 4),
               (128, 128, 4, 1), (128, 128, 8, 2)]


def space(causal):
    out = [(*c, False, r) for c in PLAIN for r in (True, False)]
    if not causal:
        out += [(*c, True, r) for c in SPECIALISED for r in (True, False)]
    return out


def main():
    out = os.environ.get("OUT", ".")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    b, h, n = 4, 16, 8192
    for d in (128, 64):
        for causal in (False, True):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                   "course": lambda: ak.flash_attention_forward(q, k, v, causal)}
            ak.flash_attention_forward(q, k, v, causal)      # the tuner's first call
            notes = {}
            for *cfg, ws, rank4 in space(causal):
                name = (f"tma{4 if rank4 else 2} {cfg[0]}x{cfg[1]} w{cfg[2]} s{cfg[3]}"
                        + (" ws" if ws else ""))
                try:
                    got = run_tma(q, k, v, causal, *cfg, ws, rank4)
                    torch.cuda.synchronize()
                except Exception as e:      # noqa: BLE001 - out of resources, refused
                    notes[name] = f"{type(e).__name__}: {str(e)[:160]}"
                    continue
                err = (got.float() - ref.float()).abs().max().item()
                if not err < 2e-2:
                    notes[name] = f"wrong: {err}"
                    continue
                fns[name] = (lambda c=cfg, ws=ws, r=rank4:
                             run_tma(q, k, v, causal, *c, ws, r))
            taken = {key: [] for key in fns}
            for _ in range(3):
                for key, fn in fns.items():
                    taken[key].append(do_bench(fn, warmup=10, rep=60))
            work = 4 * b * h * n * n * d / (2 if causal else 1)
            tf = {key: round(work / statistics.median(t) / 1e9, 1) for key, t in taken.items()}
            best = max((val, key) for key, val in tf.items() if key.startswith("tma"))
            best_ws = max(((val, key) for key, val in tf.items() if key.endswith("ws")),
                          default=None)
            row = dict(d=d, causal=causal, sdpa=tf["sdpa"], course=tf["course"], best=best,
                       best_ws=best_ws, tflops=tf, notes=notes)
            print(json.dumps({key: row[key] for key in ("d", "causal", "sdpa", "course", "best",
                                                        "best_ws")}), flush=True)
            for key, val in sorted(tf.items(), key=lambda kv: -kv[1]):
                print(f"   {val:7.1f}  {key}")
            for key, note in notes.items():
                print(f"   skipped {key}: {note}")
            rows.append(row)
            with open(os.path.join(out, "attention_ws.json"), "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
