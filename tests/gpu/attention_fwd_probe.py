"""Probe: two questions about the attention forward on Hopper, one run.

1. Does a forward whose scores are scaled inside the exponent's FMA (``exp2(s * c - m)``,
   as Triton's tutorial writes it) beat the course kernel's ``s = QK^T * c`` then
   ``exp2(s - m)``? One FP32 multiply an element fewer on the CUDA cores, which share the
   SM's issue slots with the tensor cores' softmax neighbours.
2. How far is the fixed settings table from the best of a small space, per head dimension,
   length and causal mask? (What a tuner keyed on them would gain.)

Batch x length = 16k tokens, 16 heads, bf16; medians of three interleaved rounds of
do_bench (cold L2) beside SDPA's default.

    PYTHONPATH=$PWD python3 tests/gpu/attention_fwd_probe.py      # $OUT/attention_fwd.json

Measured on an H200 (triton 3.6, torch 2.11): (1) no. The FMA form is 0-6% slower at the
table's setting in 14 of 16 cases and within 1% in the other two. (2) A few per cent: the
best of the space beats the table by 0-3% (d = 64 causal 4k: 375 against 364 TFLOP/s with
64 x 64 tiles; d = 128 causal 512: 244 against 238 with 64 x 32); SDPA's default stays
ahead by 12-30% at d = 128 (633 against at most 483 at 4k non-causal). (The probe leaves
out 128 x 128 with 3 stages at d = 128: its 229 KB of shared memory is over its 220 KB cut.)
Issuing the next tile's QK^T before this tile's softmax (FlashAttention-3's overlap inside
a warpgroup) does not survive Triton 3.6: its TTGIR waits on each wgmma right after issuing
it (``warp_group_dot_wait {pendings = 0}``), and ``tl.range(warp_specialize=True)`` is not
applied at 8 warps and fails to compile at 4.
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
from helpers.kernels.attention import forward as fw
from helpers.kernels.attention.forward import LN_2, LOG2_E, load_rows


@triton.jit
def _visit_fma(acc, l_i, m_i, q, k_head, v_head, stride_kn, stride_vn,
               rows, start, stop, seq_k, diag, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    dims = tl.arange(0, BLOCK_D)
    in_head = dims[None, :] < HEAD_DIM
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_rows(k_head + cols[:, None] * stride_kn + dims[None, :], cols, seq_k,
                      in_head, MASKED, BLOCK_D == HEAD_DIM)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = cols[None, :] < seq_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + diag)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        rescale = tl.math.exp2(m_i - m_new)
        l_i = l_i * rescale + tl.sum(p, 1)
        v = load_rows(v_head + cols[:, None] * stride_vn + dims[None, :], cols, seq_k,
                      in_head, MASKED, BLOCK_D == HEAD_DIM)
        acc = acc * rescale[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def fwd_fma(Q, K, V, O, LSE, sm_scale,
            stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
            heads, seq_q, seq_k, diag,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    b = (batch_head // heads).to(tl.int64)
    h = (batch_head % heads).to(tl.int64)
    h_kv = h // GROUP
    q_head = Q + b * stride_qb + h * stride_qh
    k_head = K + b * stride_kb + h_kv * stride_kh
    v_head = V + b * stride_vb + h_kv * stride_vh
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    in_tile = (rows[:, None] < seq_q) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_head + rows[:, None] * stride_qm + dims[None, :], mask=in_tile, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2_E
    full_tiles_end = (seq_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        band = tl.maximum(pid_m * BLOCK_M + diag, 0) // BLOCK_N * BLOCK_N
        unmasked_end = tl.minimum(band, full_tiles_end)
        stop = tl.minimum(tl.maximum(pid_m * BLOCK_M + BLOCK_M + diag, 0), seq_k)
    else:
        unmasked_end = full_tiles_end
        stop = seq_k
    acc, l_i, m_i = _visit_fma(acc, l_i, m_i, q, k_head, v_head, stride_kn, stride_vn,
                               rows, 0, unmasked_end, seq_k, diag, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _visit_fma(acc, l_i, m_i, q, k_head, v_head, stride_kn, stride_vn,
                               rows, unmasked_end, stop, seq_k, diag, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL)
    saw_keys = m_i > float("-inf")
    o = tl.where(saw_keys[:, None], acc / l_i[:, None], 0.0)
    lse = tl.where(saw_keys, (m_i + tl.math.log2(l_i)) * LN_2, float("inf"))
    tl.store(LSE + batch_head.to(tl.int64) * seq_q + rows, lse, mask=rows < seq_q)
    o_head = O + b * stride_ob + h * stride_oh
    tl.store(o_head + rows[:, None] * stride_om + dims[None, :], o.to(O.dtype.element_ty),
             mask=in_tile)


def run(kernel, q, k, v, causal, block_m, block_n, num_warps, num_stages):
    batch, heads, seq_q, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    diag = 0 if causal else None
    kernel[(triton.cdiv(seq_q, block_m), batch * heads)](
        q, k, v, o, lse, d ** -0.5, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *o.stride()[:3], heads, seq_q, k.shape[2], diag or 0,
        GROUP=heads // k.shape[1], HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, num_warps=num_warps,
        num_stages=num_stages)
    return o, lse


SPACE = [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4),
         (128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (128, 32, 4, 3),
         (256, 64, 8, 2)]


def flops(b, h, n, d, causal):
    return 4 * b * h * n * n * d / (2 if causal else 1)


def main():
    out = os.environ.get("OUT", ".")
    rows = []
    for d in (64, 128):
        for n in (512, 1024, 4096, 16384):
            for causal in (False, True):
                b, h = max(1, 16384 // n), 16
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                table = ak.forward_config(d, torch.bfloat16, seq_q=n)
                ref, _ = run(fw.attention_fwd_kernel, q, k, v, causal, **table)
                fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v,
                                                                      is_causal=causal)}
                for cfg in SPACE:
                    bm, bn, w, s = cfg
                    smem = (bm * d + 2 * s * bn * d) * 2
                    if smem > 220 * 1024 or bm % bn:
                        continue
                    for name, kern in (("ours", fw.attention_fwd_kernel), ("fma", fwd_fma)):
                        try:
                            got, _ = run(kern, q, k, v, causal, bm, bn, w, s)
                        except Exception as e:          # out of resources
                            print("skip", cfg, type(e).__name__)
                            continue
                        err = (got.float() - ref.float()).abs().max().item()
                        assert err < 2e-2, (name, cfg, err)
                        fns[f"{name} {bm}x{bn} w{w} s{s}"] = (
                            lambda kern=kern, c=cfg: run(kern, q, k, v, causal, *c))
                taken = {key: [] for key in fns}
                for _ in range(3):
                    for key, fn in fns.items():
                        taken[key].append(do_bench(fn, warmup=10, rep=40))
                work = flops(b, h, n, d, causal)
                tf = {key: round(work / statistics.median(t) / 1e9, 1)
                      for key, t in taken.items()}
                tag = f"{table['block_m']}x{table['block_n']} w{table['num_warps']} " \
                      f"s{table['num_stages']}"
                row = dict(d=d, n=n, causal=causal, batch=b, table=tag, tflops=tf,
                           table_ours=tf.get("ours " + tag), table_fma=tf.get("fma " + tag),
                           best_ours=max((v, key) for key, v in tf.items()
                                         if key.startswith("ours")),
                           best_fma=max((v, key) for key, v in tf.items()
                                        if key.startswith("fma")))
                print(json.dumps({key: row[key] for key in row if key != "tflops"}),
                      "sdpa", tf["sdpa"], flush=True)
                rows.append(row)
                with open(os.path.join(out, "attention_fwd.json"), "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
