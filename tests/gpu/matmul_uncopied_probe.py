"""Probe: does v6 on operands not copied at all (element-wise loads, one launch) beat the
plans that copy them first, on small unaligned products? (Issue 27: small unaligned rows
read 0.20-0.62x padded cuBLAS in the first H200 record, where the tuned path pays a copy
launch on every call.)

The tuned path's own first call, with the uncopied plan's gate raised to 2^33 here (so
that shapes past the module's :data:`~helpers.kernels.matmul.plan.UNCOPIED_MAX_WORK`
show whether the gate is in the right place), decisions on disk off. Each row keeps
every candidate plan's time (``candidates_ms``, the tuner's interleaved rounds), the plan
kept, and then ours against cuBLAS as given and padded once, timed in turn.

Shapes: five of the first record's small unaligned rows, and a fresh draw of the
record's "random" family (printed seed), off 16 bytes and up to 2^33 of work.

    PYTHONPATH=$PWD python3 tests/gpu/matmul_uncopied_probe.py     # $OUT/uncopied.json
"""
import json
import os
import random

import torch

from helpers import bench
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import matmul
from helpers.kernels.matmul import plan as plans
from helpers.kernels.matmul import tuned as mt

GATE = 2 ** 33
FROM_RECORD = [(158, 7471, 80), (7580, 134, 113), (379, 2473, 219), (97, 113, 231),
               (655, 655, 655)]
seed = random.SystemRandom().randrange(2 ** 31)
rng = random.Random(seed)
drawn = []
while len(drawn) < 10:
    _, m, n, k = ms._random(rng)
    if (k % 8 or n % 8) and m * n * k <= GATE:
        drawn.append((m, n, k))
print(f"seed {seed}", flush=True)

plans.UNCOPIED_MAX_WORK = GATE
plans.USE_DECISIONS = False
rows = []
for i, (M, N, K) in enumerate(FROM_RECORD + drawn):
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    want = a.float() @ b.float()
    c = matmul(a, b)
    err = ((c.float() - want).abs().max() / want.abs().max()).item()
    choice = mt.last_choice(a, b) or {}
    a_p, b_p = ms.padded_operands(a, b)
    turns = bench.time_rounds({"cublas": lambda: a @ b, "cublas_padded": lambda: a_p @ b_p,
                               "ours": lambda: matmul(a, b)}, rounds=3)
    us = {name: round(s["ms"] * 1e3, 2) for name, s in turns.items()}
    best = min(us["cublas"], us["cublas_padded"])
    row = {"shape": [M, N, K], "dtype": str(dtype), "work": M * N * K,
           "under_gate": M * N * K <= 2 ** 31, "error": err,
           "kept": f"{choice.get('kernel')} {choice.get('layout')}",
           "candidates_us": {k: round(v * 1e3, 2)
                             for k, v in sorted(choice.get("candidates_ms", {}).items(),
                                                key=lambda kv: kv[1])},
           **{f"{k}_us": v for k, v in us.items()}, "vs_best": round(best / us["ours"], 3)}
    print(json.dumps(row), flush=True)
    rows.append(row)
won = [r for r in rows if r["kept"] == "v6 not copied"]
print(f"the uncopied plan kept on {len(won)} of {len(rows)} shapes: "
      + ", ".join("x".join(map(str, r["shape"])) for r in won), flush=True)
json.dump({"seed": seed, "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "uncopied.json"), "w"), indent=1)
