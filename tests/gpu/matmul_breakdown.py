"""Probe: where a tuned matmul call's time goes, kernel by kernel (torch.profiler), on rows
that lose to cuBLAS, beside cuBLAS (as given and on operands padded once). And stream-K
with each program count, to see whether sharing K steps pays where the tiles are fewer than
the SMs.

    PYTHONPATH=$PWD python3 tests/gpu/matmul_breakdown.py      # $OUT/breakdown.json
"""
import json
import os
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from helpers import bench
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import matmul, persistent, streamk
from helpers.kernels.matmul.config import TileConfig
from helpers.kernels.matmul.tuned import last_choice

UNALIGNED = [(1681, 1681, 1681), (1004, 2666, 4892), (265, 634, 455), (2804, 174, 386),
             (2048, 4100, 4096), (4581, 4581, 4581), (851, 2686, 7296)]
ALIGNED = [(1615, 1024, 4096), (2256, 984, 3072), (273, 4096, 4096)]


def kernels_of(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:60]] += ev.device_time / calls
    return {k: round(v, 2) for k, v in per.items()}


out = []
# UNALIGNED_ONLY=1: the unaligned rows alone.
for M, N, K in UNALIGNED + ([] if os.environ.get("UNALIGNED_ONLY") else ALIGNED):
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    a_p, b_p = ms.padded_operands(a, b)
    matmul(a, b)
    row = {"shape": [M, N, K], "choice": {k: v for k, v in (last_choice(a, b) or {}).items()
                                          if k in ("kernel", "layout", "config")}}
    fns = {"cublas": lambda: a @ b, "cublas_padded": lambda: a_p @ b_p,
           "tuned": lambda: matmul(a, b)}
    if (M, N, K) in ALIGNED:
        for bm, bn, w, s in ((128, 256, 8, 3), (128, 128, 8, 4)):
            cfg = TileConfig(bm, bn, 64, num_warps=w, num_stages=s, options=persistent.NEITHER)
            for sms in (132, 66, 33):
                run = streamk.launch(a, b, cfg, sms=sms)[1]
                fns[f"sk {bm}x{bn} sms={sms}"] = (lambda run=run: run(a, b))
            prun = persistent.launch(a, b, cfg)[1]
            fns[f"p {bm}x{bn}"] = (lambda prun=prun: prun(a, b))
    times = bench.time_rounds(fns, rounds=3)
    row.update({k: round(v["ms"] * 1e3, 1) for k, v in times.items()})
    row["tuned_kernels_us"] = kernels_of(lambda: matmul(a, b))
    row["padded_cublas_kernels_us"] = kernels_of(lambda: a_p @ b_p)
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "breakdown.json"), "w"), indent=1)
