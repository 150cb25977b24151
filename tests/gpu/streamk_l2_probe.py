"""Probe, under Nsight Compute: why stream-K's K steps run slower than the persistent
kernel's on tail shapes, where it should win by its even split.

In the H200 ``matmul_shapes`` record at 8363249 (``candidates_ms`` of each row), 448 x 4632
x 5760 bf16 with 128 x 256 tiles (76 tiles, 90 K steps each) took 60.6 us on the persistent
kernel (76 SMs busy, 90 steps: 0.67 us a step) and 65.0 us on stream-K (132 SMs, 52 steps
each: 1.25 us a step), against cuBLAS's 42.9. An LRU model of a 50 MB L2 with the SMs in
lockstep (``tests/gpu/streamk_l2_model.py``: every program one K step per unit of time,
stream-K's own order of pieces) reads A and B from DRAM about once for both kernels on the
record's tail shapes (448 x 4632 x 5760, 128 x 256: 59.1 MiB for both, 55.8 once), so re-reads from
DRAM should not explain it; L2-to-SM traffic is the other suspect: 132 SMs x 48 KiB a step
in 1.25 us is 5.1 TB/s, as the persistent kernel's 76 SMs pull in 0.67 us (5.4 TB/s), while
a big square (7040^3, all SMs, cuBLAS speed) pulls about 7.8 TB/s. This probe reads the
counters that decide between them: DRAM bytes, L2 bytes and hit rate, tensor-pipe activity.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,lts__t_bytes.sum,\\
    lts__t_sector_hit_rate.pct python3 tests/gpu/streamk_l2_probe.py
    SHAPES=448x4632x5760,7040x7040x7040 python3 tests/gpu/streamk_l2_probe.py   # times only
"""
import os

import torch
from triton.testing import do_bench

from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig

SHAPES = os.environ.get("SHAPES", "448x4632x5760,4432x904x4352,3048x688x6144,7040x7040x7040")
TILES = {"wide": TileConfig(128, 256, 64, num_warps=8, num_stages=3, options=persistent.NEITHER),
         "narrow": streamk.NARROW}

runs = {}
for shape in SHAPES.split(","):
    M, N, K = (int(x) for x in shape.split("x"))
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()
    for tile, cfg in TILES.items():
        for kernel, launch in (("persistent", persistent.launch), ("streamk", streamk.launch)):
            c, run = launch(a, b, cfg)[:2]
            err = float((c.float() - want).abs().max() / want.abs().max())
            runs[f"{shape} {tile} {kernel}"] = (lambda r=run, x=a, y=b: r(x, y), err)
    runs[f"{shape} cublas"] = (lambda x=a, y=b: torch.matmul(x, y), 0.0)

for name, (fn, err) in runs.items():             # times first, outside the profiled range
    us = do_bench(fn, warmup=25, rep=200) * 1e3
    print(f"{name:42s} {us:8.1f} us  rel. error {err:.1e}", flush=True)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for name, (fn, _) in runs.items():               # one launch each, in this order, for ncu
    print("profiled:", name, flush=True)
    fn()
    torch.cuda.synchronize()
torch.cuda.profiler.stop()
