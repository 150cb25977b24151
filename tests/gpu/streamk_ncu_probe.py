"""Probe, under Nsight Compute: the stream-K kernel beside the persistent one where the
tiles are fewer than the SMs (1615 x 1024 x 4096 and 2256 x 984 x 3072 fp16, 128 x 128
tiles), and beside a copy of stream-K without the hand-over (tests/gpu/streamk_probe.py).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section WarpStateStats python3 tests/gpu/streamk_ncu_probe.py
"""
import os

import torch
import triton

from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig

here = os.path.dirname(os.path.abspath(__file__))
source = open(os.path.join(here, "streamk_probe.py")).read()
source = source[:source.index("def warm_us")]           # the kernel, not the probe's run
probe = {"__name__": "streamk_variant", "__file__": os.path.join(here, "streamk_probe.py")}
exec(compile(source, probe["__file__"], "exec"), probe)

sms = persistent.sm_count(torch.device("cuda"))
for M, N, K in ((1615, 1024, 4096), (2256, 984, 3072)):
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    cfg = TileConfig(128, 128, 64, num_warps=8, num_stages=4, options=persistent.NEITHER)
    p_run = persistent.launch(a, b, cfg)[1]
    sk_run = streamk.launch(a, b, cfg)[1]
    fitted = streamk.fitted(cfg)
    tiles = triton.cdiv(M, 128) * triton.cdiv(N, 128)
    ws = torch.empty(sms * 128 * 128, device="cuda", dtype=torch.float32)
    flags = torch.zeros(sms, device="cuda", dtype=torch.int32)

    def no_handover():
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        probe["sk_variant"][(sms,)](*persistent.descriptors(a, b, c, fitted), ws, flags, M, N,
                                    K, streamk.stream_k_tiles(tiles, sms), BLOCK_M=128,
                                    BLOCK_N=128, BLOCK_K=64, GROUP_M=8, NUM_SMS=sms, FIXUP=0,
                                    FORWARD=0, num_warps=8, num_stages=fitted.num_stages)

    runs = {"p": lambda: p_run(a, b), "sk": lambda: sk_run(a, b), "sk no hand-over": no_handover}
    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in runs.items():
        print(M, N, K, name, flush=True)
        fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
