"""Probe: calls back to back, as a training or decoding loop makes them (no L2 flush
between calls), ours against what PyTorch runs, after the kept launches
(:mod:`helpers.kernels.launch`, :mod:`helpers.kernels.attention.kept`).

* the tuned matmul at 1000^3 and 4096 x 4096 x 1024 bf16 (issue 27's loop), and a small
  unaligned product (379 x 2473 x 219 fp16, a copy and a kernel a call);
* a decoding step: one query against 8k and 32k keys, batch 1, GQA 32/8, d = 128, bf16,
  against SDPA's default;
* forward + backward at 512 and 1,024 tokens, batch 4, 16 heads, d = 64, causal, fp16,
  against SDPA's default (cuDNN on Hopper), through autograd.

Each: microseconds a call over 200 calls between two CUDA events, medians of 5 rounds in
turn, and the host's microseconds a call (the loop's own time with no synchronisation).

    PYTHONPATH=$PWD python3 tests/gpu/host_time_probe.py      # $OUT/host_time.json

Measured on an H200 at fb8aecb (µs a call, ours against theirs, GPU-paced; the host's own
time a call in brackets): matmul 1000^3 bf16 13.7 (14.0) against torch 12.8 (12.8), 0.93x;
4096 x 4096 x 1024 50.3 (12.0) against 54.4 (13.6), 1.08x; 379 x 2473 x 219 fp16 26.3 (26.6)
against 14.1 (14.1), 0.54x, a copy and a kernel launched against one; decoding at 8k keys
31.4 (31.4) against SDPA's 22.2 (22.3), 0.71x, at 32k 48.8 (48.9) against 40.1 (31.7),
0.82x; forward + backward at 512 tokens 314 (314) against 209 (209), 0.67x, at 1,024 374
(374) against 274 (274), 0.73x. Where the two times are equal the loop runs at the host's
pace, ours and torch's alike.
"""
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from helpers.kernels import attention as ak
from helpers.kernels.matmul import matmul

CALLS, ROUNDS = 200, 5


def per_call_us(fn) -> tuple[float, float]:
    """(GPU-paced microseconds a call, host microseconds a call) over CALLS calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / CALLS * 1e6
    end.synchronize()
    return start.elapsed_time(end) / CALLS * 1e3, host


def compare(label: str, fns: dict) -> dict:
    for fn in fns.values():     # first calls: tuning, compiling, keeping
        fn()
        fn()
    taken = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            taken[name].append(per_call_us(fn))
    row = {"case": label}
    for name, runs in taken.items():
        row[f"{name}_us"] = round(statistics.median(r[0] for r in runs), 2)
        row[f"{name}_host_us"] = round(statistics.median(r[1] for r in runs), 2)
    names = list(fns)
    row["ours_vs_theirs"] = round(row[f"{names[1]}_us"] / row[f"{names[0]}_us"], 3)
    print(json.dumps(row), flush=True)
    return row


rows = []
for M, N, K, dtype in ((1000, 1000, 1000, torch.bfloat16), (4096, 4096, 1024, torch.bfloat16),
                       (379, 2473, 219, torch.float16)):
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    rows.append(compare(f"matmul {M}x{N}x{K} {dtype}",
                        {"ours": lambda: matmul(a, b), "torch": lambda: torch.matmul(a, b)}))
for keys in (8192, 32768):
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows.append(compare(f"decode 1 query x {keys} keys",
                        {"ours": lambda: ak.flash_attention_forward(q, k, v, "bottom_right"),
                         "sdpa": lambda: F.scaled_dot_product_attention(q, k, v,
                                                                        enable_gqa=True)}))
for seq in (512, 1024):
    q, k, v = (torch.randn(4, 16, seq, 64, device="cuda", dtype=torch.float16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def ours():
        ak.flash_attention(q, k, v, True).backward(do)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    rows.append(compare(f"forward+backward {seq} tokens causal", {"ours": ours, "sdpa": sdpa}))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "host_time.json"), "w"),
          indent=1)
