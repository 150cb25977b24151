"""Probe: the drawn matmul sweep's rows one at a time, each appended to
$OUT/rows_<seed>_<precompile>.jsonl as it finishes (what ran survives a timeout).

    PYTHONPATH=$PWD python3 tests/gpu/matmul_sample.py SEED COUNT
    PRECOMPILE=0 TRITON_CACHE_DIR=/tmp/tc0 python3 ...   # candidates compiled one at a time
"""
import json, os, sys, time
import torch
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import matmul, precompile

precompile.ENABLED = os.environ.get("PRECOMPILE", "1") == "1"

seed, count = int(sys.argv[1]), int(sys.argv[2])
sms = torch.cuda.get_device_properties(0).multi_processor_count
out = open(os.path.join(os.environ["OUT"], f"rows_{seed}_{int(precompile.ENABLED)}.jsonl"), "a")
t0 = time.time()
for i, s in enumerate(ms.draw(seed, sms, max(count, 4))[:count]):
    r = ms._time_row(s, matmul, seed + i)
    out.write(json.dumps(r) + "\n"); out.flush()
    print(f"{time.time()-t0:6.0f}s {s.family:6s} {s.dtype} {s.M}x{s.N}x{s.K} al={int(s.aligned)} "
          f"vs={r['vs_cublas']:.2f} lin={r['linear_vs_f_linear']:.2f} {r['choice']}", flush=True)
