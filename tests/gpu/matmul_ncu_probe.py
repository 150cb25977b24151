"""Probe, under Nsight Compute: is the course's matmul held back by L2 bandwidth where cuBLAS
is not? One launch each of cuBLAS and the persistent kernel (128 x 256 and 128 x 128 tiles)
at 4096^3 fp16 and 1615 x 1024 x 4096, after a warm-up.

    ncu --clock-control none --profile-from-start off --metrics <list> \\
        python3 tests/gpu/matmul_ncu_probe.py
"""
import torch

from helpers.kernels.matmul import persistent
from helpers.kernels.matmul.config import TileConfig

for M, N, K in ((4096, 4096, 4096), (1615, 1024, 4096)):
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    runs = {"cublas": lambda: a @ b}
    for bm, bn, w, s in ((128, 256, 8, 3), (128, 128, 8, 4)):
        cfg = TileConfig(bm, bn, 64, num_warps=w, num_stages=s, options=persistent.NEITHER)
        run = persistent.launch(a, b, cfg)[1]
        runs[f"p{bm}x{bn}"] = (lambda run=run: run(a, b))
    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()         # ncu --profile-from-start off: these launches only
    for name, fn in runs.items():
        print(M, N, K, name, flush=True)
        fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
