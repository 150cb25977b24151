"""Probe: at short sequences (512-1k tokens), is ours behind cuDNN on the GPU or on the
host? For each case: the cold-L2 median of a whole call (do_bench, as the attention record
times it), the GPU time of its kernels (torch.profiler, back to back) and the host's time
to issue one call (200 calls issued, then one synchronize), ours and SDPA's default.

    PYTHONPATH=$PWD python3 tests/gpu/attention_short_probe.py     # $OUT/attention_short.json
"""
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from helpers.experiments.attention_decode import kernel_us
from helpers.kernels import attention as ak


def host_us(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return round(issued, 1)


rows = []
for d in (64, 128):
    for seq in (512, 1024, 4096):
        for causal in (True, False):
            q, k, v = (torch.randn(4, 16, seq, d, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            fns = {
                "ours fwd": lambda: ak.flash_attention_forward(q, k, v, causal=causal)[0],
                "sdpa fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                "ours fwd+bwd": lambda: torch.autograd.grad(
                    ak.flash_attention(q, k, v, causal=causal), (q, k, v), do),
                "sdpa fwd+bwd": lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), do),
            }
            row = {"d": d, "seq": seq, "causal": causal}
            for name, fn in fns.items():
                total, names = kernel_us(fn)
                row[name] = {"wall_us": round(do_bench(fn, rep=50) * 1e3, 1),
                             "kernels_us": round(total, 1), "host_us": host_us(fn),
                             "kernels": names}
            print(json.dumps({k: (v if not isinstance(v, dict) else
                                  {kk: vv for kk, vv in v.items() if kk != "kernels"})
                              for k, v in row.items()}), flush=True)
            rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "attention_short.json"), "w"),
          indent=1)
