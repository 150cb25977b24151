"""Probe: stream-K with wide (128 x 256) tiles after its hand-over stopped spilling registers
(255 registers and 96 bytes spilled before, 184 and none after: ptxas -v on the kernel
compiled for sm_90a), beside the persistent kernel and cuBLAS, in interleaved rounds.

    PYTHONPATH=$PWD python3 tests/gpu/streamk_wide_probe.py     # $OUT/streamk_wide.json
"""
import json
import os

import torch

from helpers import bench
from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig

SHAPES = [(1615, 1024, 4096), (2256, 984, 3072), (2520, 1704, 7040), (2418, 4096, 4096),
          (472, 4408, 1792), (4096, 4096, 4096)]
rows = []
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    want = a.float() @ b.float()
    fns, row = {"cublas": lambda: a @ b}, {"shape": [M, N, K]}
    for bm, bn, s in ((128, 256, 3), (128, 128, 4)):
        cfg = TileConfig(bm, bn, 64, num_warps=8, num_stages=s, options=persistent.NEITHER)
        for kind, mod in (("p", persistent), ("sk", streamk)):
            run = mod.launch(a, b, cfg)[1]
            err = ((run(a, b).float() - want).abs().max() / want.abs().max()).item()
            row[f"{kind} {bm}x{bn} error"] = round(err, 5)
            fns[f"{kind} {bm}x{bn}"] = (lambda run=run: run(a, b))
    times = bench.time_rounds(fns, rounds=3)
    row.update({name: round(t["ms"] * 1e3, 1) for name, t in times.items()})
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "streamk_wide.json"), "w"), indent=1)
