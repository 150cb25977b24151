"""Probe: a FlashAttention backward that adds dQ with atomics, against the course's.

The course's backward (:mod:`helpers.kernels.attention.backward`) splits dK/dV and dQ into
two kernels that need no atomics, so each recomputes ``S = Q K^T`` and ``dP = dO V^T``:
seven matmuls of the forward's size where the algorithm needs five. FlashAttention-2's
CUDA kernel and FlashAttention-3 keep one K/V tile per program and add each block's
``dS K`` into an fp32 dQ in HBM with atomics instead: five matmuls, and a stream of atomic
adds, (keys / BLOCK_N) x queries x d floats a head, that L2 absorbs.

Here: that kernel (``fused``), with dQ accumulated by ``tl.atomic_add`` (relaxed), then
scaled and cast; the course's three kernels; SDPA's default backward (cuDNN on Hopper),
each alone, medians of three interleaved rounds of do_bench. bf16, batch x length = 16k
tokens, 16 heads.

    PYTHONPATH=$PWD python3 tests/gpu/attention_bwd_probe.py      # $OUT/attention_bwd.json

Measured on an H200 (triton 3.6, torch 2.11), TFLOP/s by the 2.5x-forward convention:
the atomic version loses almost everywhere. Best fused setting / the course's / cuDNN:
d = 128 non-causal 347 / 387 / 550 at 4k and 364 / 409 / 535 at 16k (64 x 128, 8 warps,
dQ by TMA reduction); causal 302 / 309 / 476 at 4k, 362 / 350 / 531 at 16k; d = 64 causal
at 16k 311 / 276 / 449, the one clear win, non-causal 309 / 351 / 444. Every setting
spills: ptxas (sm_90a) gives 255 registers and 0.5-10 KB of spill stores for d = 128
(the course's dK/dV kernel at its own 64 x 64 setting spills 3 KB too), and per-element
``tl.atomic_add`` is an ``atom.global`` a float (TMA reduction: one bulk op a block, about
as fast here). Two fewer matmuls do not pay for the registers a third accumulator takes.
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from helpers.kernels import attention as ak
from helpers.kernels.attention.backward import attention_bwd_preprocess_kernel
from helpers.kernels.attention.forward import load_rows

LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def _grads_from_rows(dk, dv, k, v, q_head, do_head, dq_head, batch_head, lse_row, delta_row,
                     stride_qm, stride_dqm, cols, start, stop, seq_q, diag, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA_DQ: tl.constexpr,
                     KEYS_ACROSS: tl.constexpr):
    dims = tl.arange(0, BLOCK_D)
    in_head = dims[None, :] < HEAD_DIM
    for start_m in range(start, stop, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + tl.arange(0, BLOCK_M)
        offsets = rows[:, None] * stride_qm + dims[None, :]
        q = load_rows(q_head + offsets, rows, seq_q, in_head, MASKED, BLOCK_D == HEAD_DIM)
        do = load_rows(do_head + offsets, rows, seq_q, in_head, MASKED, BLOCK_D == HEAD_DIM)
        if MASKED:
            lse = tl.load(lse_row + rows, mask=rows < seq_q, other=0.0)
            delta = tl.load(delta_row + rows, mask=rows < seq_q, other=0.0)
        else:
            lse = tl.load(lse_row + rows)
            delta = tl.load(delta_row + rows)
        if KEYS_ACROSS:
            # Queries down, keys across: K and V are the B operands, read from shared
            # memory; P and dS are transposed through shared memory for dV and dK.
            p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None] * LOG2_E)
            if CAUSAL and MASKED:
                p = tl.where(cols[None, :] <= rows[:, None] + diag, p, 0.0)
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
            dp = tl.dot(do, tl.trans(v))
            ds = (p * (dp - delta[:, None])).to(q.dtype)
            dk = tl.dot(tl.trans(ds), q, dk)
            dq = tl.dot(ds, k)
        else:
            p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :] * LOG2_E)
            if CAUSAL and MASKED:
                p_t = tl.where(cols[:, None] <= rows[None, :] + diag, p_t, 0.0)
            dv = tl.dot(p_t.to(do.dtype), do, dv)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
            dk = tl.dot(ds_t, q, dk)
            dq = tl.dot(tl.trans(ds_t), k)
        if TMA_DQ:       # one bulk reduction from shared memory; rows past the head clipped
            dq_head.atomic_add([batch_head, start_m, 0], dq.reshape(1, BLOCK_M, BLOCK_D))
        elif MASKED:
            tl.atomic_add(dq_head + rows[:, None] * stride_dqm + dims[None, :], dq,
                          mask=(rows[:, None] < seq_q) & in_head, sem="relaxed")
        else:
            tl.atomic_add(dq_head + rows[:, None] * stride_dqm + dims[None, :], dq,
                          mask=in_head, sem="relaxed")
    return dk, dv


@triton.jit
def fused_bwd_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, sm_scale,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_ab, stride_ah, stride_am,
                     heads, seq_q, seq_k, diag,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                     TMA_DQ: tl.constexpr, KEYS_ACROSS: tl.constexpr):
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
        band_start = tl.minimum(tl.maximum(pid_n * BLOCK_N - diag, 0) // BLOCK_M * BLOCK_M,
                                seq_q)
        band_end = tl.cdiv(tl.maximum(pid_n * BLOCK_N + BLOCK_N - diag, 0), BLOCK_M) * BLOCK_M
        band_end = tl.maximum(tl.minimum(band_end, seq_q), band_start)
    else:
        band_start = 0
        band_end = 0
    tail_start = tl.maximum(band_end, full_blocks_end)
    for g in range(GROUP):
        head = h_kv * GROUP + g
        batch_head = b * heads + head
        q_head = Q + b * stride_qb + head * stride_qh
        do_head = DO + b * stride_qb + head * stride_qh
        if TMA_DQ:
            dq_head = DQ_ACC
        else:
            dq_head = DQ_ACC + b * stride_ab + head * stride_ah
        lse_row = LSE + batch_head * seq_q
        delta_row = DELTA + batch_head * seq_q
        dk, dv = _grads_from_rows(dk, dv, k, v, q_head, do_head, dq_head,
                                  (batch_head).to(tl.int32), lse_row, delta_row,
                                  stride_qm, stride_am, cols, band_start, band_end, seq_q,
                                  diag, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA_DQ, KEYS_ACROSS)
        dk, dv = _grads_from_rows(dk, dv, k, v, q_head, do_head, dq_head,
                                  (batch_head).to(tl.int32), lse_row, delta_row,
                                  stride_qm, stride_am, cols, band_end, full_blocks_end,
                                  seq_q, diag, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False,
                                  CAUSAL, TMA_DQ, KEYS_ACROSS)
        dk, dv = _grads_from_rows(dk, dv, k, v, q_head, do_head, dq_head,
                                  (batch_head).to(tl.int32), lse_row, delta_row,
                                  stride_qm, stride_am, cols, tail_start, seq_q, seq_q, diag,
                                  qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA_DQ, KEYS_ACROSS)
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=in_tile)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=in_tile)


def fused_backward(do, q, k, v, o, lse, causal, block_m, block_n, num_warps, num_stages,
                   tma_dq=False, keys_across=False):
    batch, heads, seq_q, d = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    sm_scale = d ** -0.5
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    width_d = triton.next_power_of_2(d)
    dq_acc = torch.zeros((batch, heads, seq_q, width_d), dtype=torch.float32, device=q.device)
    acc_arg = dq_acc
    if tma_dq:
        acc_arg = TensorDescriptor(dq_acc, [batch * heads, seq_q, width_d],
                                   [seq_q * width_d, width_d, 1], [1, block_m, width_d])
    delta = torch.empty_like(lse)
    width = dict(HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d))
    attention_bwd_preprocess_kernel[(triton.cdiv(seq_q, 64), batch * heads)](
        o, do, delta, *q.stride()[:3], heads, seq_q, **width, BLOCK_M=64)
    fused_bwd_kernel[(triton.cdiv(seq_k, block_n), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, acc_arg, sm_scale, *q.stride()[:3], *k.stride()[:3],
        *dq_acc.stride()[:3], heads, seq_q, seq_k, 0, GROUP=heads // kv_heads, **width,
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, TMA_DQ=tma_dq, KEYS_ACROSS=keys_across,
        num_warps=num_warps,
        num_stages=num_stages)
    return (dq_acc[..., :d] * sm_scale).to(q.dtype), dk, dv


# (block_m, block_n, warps, stages, dQ by TMA reduction, queries down / keys across)
SPACE = [(64, 128, 8, 2, True, False), (32, 128, 8, 2, True, False),
         (32, 128, 8, 3, True, False), (64, 64, 4, 2, True, False),
         (32, 64, 4, 2, True, False), (32, 128, 8, 2, False, False),
         (32, 128, 8, 2, True, True), (64, 64, 4, 2, True, True), (128, 128, 8, 2, True, True)]


def flops(b, h, n, d, causal):
    return 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)


def main():
    out = os.environ.get("OUT", ".")
    rows = []
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (False, True):
                b, h = max(1, 16384 // n), 16
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                               for _ in range(4))
                o, lse = ak.flash_attention_forward(q, k, v, causal=causal)
                want = ak.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                sd = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                fns = {"sdpa": lambda: torch.autograd.grad(sd, (qg, kg, vg), do,
                                                           retain_graph=True),
                       "ours": lambda: ak.flash_attention_backward(do, q, k, v, o, lse,
                                                                   causal=causal)}
                for cfg in SPACE:
                    try:
                        got = fused_backward(do, q, k, v, o, lse, causal, *cfg)
                    except Exception as e:
                        print("skip", cfg, type(e).__name__, str(e)[:80])
                        continue
                    errs = [(g.float() - w.float()).abs().max().item()
                            for g, w in zip(got, want)]
                    if max(errs) > 5e-2:
                        print("WRONG", cfg, errs)
                        continue
                    fns["fused %dx%d w%d s%d tma%d across%d" % cfg] = (
                        lambda c=cfg: fused_backward(do, q, k, v, o, lse, causal, *c))
                taken = {key: [] for key in fns}
                for _ in range(3):
                    for key, fn in fns.items():
                        taken[key].append(do_bench(fn, warmup=10, rep=40))
                work = flops(b, h, n, d, causal)
                tf = {key: round(work / statistics.median(t) / 1e9, 1)
                      for key, t in taken.items()}
                best = max((val, key) for key, val in tf.items() if key.startswith("fused"))
                row = dict(d=d, n=n, causal=causal, batch=b, tflops=tf, best_fused=best)
                print(json.dumps(dict(d=d, n=n, causal=causal, sdpa=tf["sdpa"],
                                      ours=tf["ours"], best_fused=best)), flush=True)
                rows.append(row)
                with open(os.path.join(out, "attention_bwd.json"), "w") as f:
                    json.dump(rows, f, indent=1)
    print(json.dumps(rows[-1]["tflops"]))


if __name__ == "__main__":
    main()
