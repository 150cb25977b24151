"""Probe: is the tuned path's kept plan as fast when called later as when the tuner timed
it? (The uncopied-plan probe on an H200 found the best candidate plan timed at 10.3 us and
the same shape's later calls at 38.9 us, 1153 x 64 x 138 bf16, and 8-10 us gaps on four
more shapes; on others the two agreed.)

For each shape: the first call (decisions on disk off, so it tunes here), then in
interleaved rounds: the kept plan's ``run`` called directly, ``matmul_tuned``, lesson 04's
``matmul``, and cuBLAS on padded operands; then the host's microseconds per call
(no synchronisation, 200 calls), and the kernels one call launches (torch.profiler,
CUDA time each).

    PYTHONPATH=$PWD python3 tests/gpu/matmul_kept_plan_probe.py     # $OUT/kept_plan.json
"""
import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from helpers import bench
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import matmul
from helpers.kernels.matmul import plan as plans
from helpers.kernels.matmul import tuned as mt

SHAPES = [(1153, 64, 138, torch.bfloat16), (832, 979, 436, torch.bfloat16),
          (430, 269, 1389, torch.bfloat16), (158, 7471, 80, torch.float16),
          (379, 2473, 219, torch.float16)]
plans.USE_DECISIONS = False
rows = []
for M, N, K, dtype in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    matmul(a, b)
    torch.cuda.synchronize()
    key = mt._plan_key(a, b, None)
    plan = mt._PLANS[key]
    choice = mt.last_choice(a, b)
    a_p, b_p = ms.padded_operands(a, b)
    fns = {"plan": lambda: plan(a, b), "matmul_tuned": lambda: mt.matmul_tuned(a, b),
           "matmul": lambda: matmul(a, b), "cublas_padded": lambda: a_p @ b_p}
    turns = bench.time_rounds(fns, rounds=3)
    row = {"shape": [M, N, K], "dtype": str(dtype),
           "kept": f"{choice['kernel']} {choice['layout']} {choice['config']}",
           "best_candidate_us": round(min(choice["candidates_ms"].values()) * 1e3, 2),
           **{f"{k}_us": round(v["ms"] * 1e3, 2) for k, v in turns.items()},
           **{f"{k}_runs_us": [round(x * 1e3, 2) for x in v["runs"]] for k, v in turns.items()}}
    for name in ("plan", "matmul"):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            fns[name]()
        row[f"{name}_host_us"] = round((time.perf_counter() - start) / 200 * 1e6, 2)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            matmul(a, b)
        torch.cuda.synchronize()
    row["kernels_us"] = {e.key[:60]: round(e.device_time_total / e.count, 2)
                         for e in prof.key_averages() if e.device_time_total > 0}
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "kept_plan.json"), "w"),
          indent=1)
