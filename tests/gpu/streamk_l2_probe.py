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

Read on an H200 at 7eb2142 (Nsight Compute, ``--clock-control none``, one launch each;
the ``--csv`` output, SHAPES=448x4632x5760,3048x688x6144,7040x7040x7040). Duration, DRAM
bytes read, L2 bytes (lts__t_bytes), L2 hit rate, tensor pipe active (of active cycles):

    448x4632x5760   wide persistent  58.7 us   58.5 MB  323 MB  76%  93%
                    wide streamk     58.7 us   66.8 MB  424 MB  82%  61%
                    narrow persist.  84.9 us   61.4 MB  391 MB  83%  59%
                    narrow streamk   62.1 us   62.9 MB  451 MB  86%  51%
                    cuBLAS           39.3 us   58.5 MB  262 MB  79%  90%  128x160 tiles, 4x1 cluster
    3048x688x6144   wide persistent  61.2 us   46.1 MB  239 MB  63%  94%
                    wide streamk     56.5 us   55.0 MB  407 MB  76%  66%
                    cuBLAS           36.2 us   45.9 MB  232 MB  67%  89%  64x256 tiles, 1x2 cluster
    7040^3          wide persistent   895 us    971 MB  4.88 GB 66%  95%
                    cuBLAS            911 us    791 MB  5.81 GB 78%  97%  192x192 tiles, 2x1 cluster

On the two tail shapes DRAM is not it: every kernel reads A and B from DRAM about once
(the LRU model was right; at 7040^3, where A and B are 198 MB, four times L2, they are
read 4-5 times over by every kernel). Stream-K asks L2 for 15-70% more bytes than the
persistent kernel on the same tiles (its partial tiles go through L2: at most about 34 MB
at 448 x 4632, 132 partials of 128 KiB written and read; the rest is not yet accounted
for), and its tensor pipes idle 34-49% of their active cycles, while neither L2 (Mem Busy
52-65%) nor DRAM (21-27% of peak) is saturated: its SMs wait, on the hand-over and on loads
they cannot start early enough. At 448 x 4632 cuBLAS asks L2 for a fifth fewer bytes than
the persistent kernel (clusters that multicast one operand, which Triton 3.6 cannot ask
for; at 3048 x 688 the two are level) and picks a tile width, 160, that makes 116 tiles:
one wave.
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
