"""Probe: on shapes where the tuned matmul lost to cuBLAS (an H200 sample, seed 12345), every
plan it could have run: the persistent kernel and stream-K with each setting of the space,
and a few more settings. One do_bench each, in turn, not interleaved: later rows run on a
GPU whose clock has fallen, so read a ratio only beside its neighbours.

    PYTHONPATH=$PWD python3 tests/gpu/matmul_diag.py      # $OUT/diag.json
"""
import json, os
import torch
from triton.testing import do_bench
from helpers.kernels.matmul import matmul, persistent, streamk
from helpers.kernels.matmul.config import TileConfig
from helpers.kernels.matmul.tuned import last_choice

SHAPES = [(273, 4096, 4096), (2256, 984, 3072), (472, 4408, 1792), (2520, 1704, 7040),
          (1615, 1024, 4096), (2418, 4096, 4096), (4096, 4096, 4096)]
EXTRA = [TileConfig(256, 128, 64, num_warps=8, num_stages=3, options=persistent.NEITHER),
         TileConfig(64, 256, 64, num_warps=4, num_stages=4, options=persistent.NEITHER),
         TileConfig(128, 128, 64, num_warps=8, num_stages=5, options=persistent.NEITHER)]
out = []
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    res = {"shape": [M, N, K], "cublas": do_bench(lambda: a @ b, rep=60) * 1e3}
    matmul(a, b)
    res["tuned"] = do_bench(lambda: matmul(a, b), rep=60) * 1e3
    res["choice"] = {k: v for k, v in (last_choice(a, b) or {}).items() if k != "config"}
    for cfg in persistent.PERSISTENT_SPACE + EXTRA:
        for kind, mod in (("p", persistent), ("sk", streamk)):
            name = f"{kind} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} {dict(cfg.options) if kind == 'p' else ''}"
            try:
                got = mod.launch(a, b, cfg)
                run = got[1]
                err = ((run(a, b).float() - ref).abs().max() / ref.abs().max()).item()
                res[name] = round(do_bench(lambda: run(a, b), rep=60) * 1e3, 1) if err < 1e-2 else f"err {err}"
            except Exception as e:
                res[name] = f"fail {type(e).__name__}: {str(e)[:80]}"
    print(json.dumps(res), flush=True)
    out.append(res)
json.dump(out, open(os.path.join(os.environ["OUT"], "diag.json"), "w"), indent=1)
