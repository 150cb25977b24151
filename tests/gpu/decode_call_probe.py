"""Probe: why the H200 decode record's first case (batch 1, one query, 8k keys) reads an
81 us call around 10.6 us of kernels, where the H100 record read 25.6 us: is it the call
path's host time, or the order of measurement (the first case of the process, or a call
timed right after a torch.profiler session)?

Times ours and SDPA's default in a fresh process, before any profiler session, then after
the experiment's own kernel_us (a profiler session), then again; and the host's
microseconds per call (200 calls, no synchronisation).

    PYTHONPATH=$PWD python3 tests/gpu/decode_call_probe.py
"""
import time

import torch
import torch.nn.functional as F

from helpers import bench
from helpers.experiments import attention_decode as ad
from helpers.kernels import attention as ak

g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 32, 1, 128, device="cuda", generator=g).bfloat16()
k, v = (torch.randn(1, 8, 8192, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
fns = {"ours": lambda: ak.flash_attention_forward(q, k, v, "bottom_right"),
       "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}


def host_us(fn, calls=200):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    out = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return round(out, 1)


for name, fn in fns.items():
    fn()
print("fresh      ", {n: round(bench.time_ms(f) * 1e3, 1) for n, f in fns.items()},
      "host us", {n: host_us(f) for n, f in fns.items()}, flush=True)
for name, fn in fns.items():
    print(f"kernel_us {name}", ad.kernel_us(fn), flush=True)
for turn in range(3):
    print(f"after profiler {turn}", {n: round(bench.time_ms(f) * 1e3, 1) for n, f in fns.items()},
          "host us", {n: host_us(f) for n, f in fns.items()}, flush=True)
