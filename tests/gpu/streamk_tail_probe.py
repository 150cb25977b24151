"""Probe: stream-K on tail shapes whose tiles are fewer than the SMs, or just past a wave,
where the drawn record kept v6 or the persistent kernel over it (H200 record 1882377512:
3048 x 688 x 6144 kept v6 at 0.68x cuBLAS, 448 x 4632 x 5760 the persistent kernel at
0.70x). Beside cuBLAS and the persistent kernel: the course's stream-K, and
``tests/gpu/streamk_probe.py``'s copy of it without the hand-over (``FIXUP=0``: wrong sums,
the K steps' own time). Medians of three interleaved rounds, cold L2. A few tail shapes are
drawn afresh (seed printed), beside the record's.

Its H200 figures (seed 1599211839) are in ``helpers.kernels.matmul.streamk._add_handed_over``
and ``tuned._streamk_plans``. Read the ``no hand-over`` copy as a rough guide only: it is not
the course's kernel, and on two drawn shapes it ran slower than the kernel with its
hand-over (1888 x 3456 x 1536: 122.5 us against 43.3), so it is no lower bound.

    PYTHONPATH=$PWD python3 tests/gpu/streamk_tail_probe.py          # $OUT/streamk_tail.json
    NCU=1 ncu --clock-control none --profile-from-start off --metrics <list> \\
        python3 tests/gpu/streamk_tail_probe.py                       # one launch each
"""
import json
import os
import random

import torch
import triton

from helpers import bench
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig

here = os.path.dirname(os.path.abspath(__file__))
source = open(os.path.join(here, "streamk_probe.py")).read()
source = source[:source.index("def warm_us")]           # the kernel, not the probe's run
probe = {"__name__": "streamk_variant", "__file__": os.path.join(here, "streamk_probe.py")}
exec(compile(source, probe["__file__"], "exec"), probe)

NCU = os.environ.get("NCU") == "1"
sms = persistent.sm_count(torch.device("cuda"))
RECORD = [(3048, 688, 6144), (448, 4632, 5760), (4432, 904, 4352), (1624, 2600, 2304),
          (488, 4432, 4864)]
seed = int(os.environ.get("SEED", random.SystemRandom().randrange(2**31)))
rng = random.Random(seed)
FRESH = [ms._tail(rng, sms)[1:] for _ in range(3)]
SHAPES = [(3048, 688, 6144)] if NCU else RECORD + FRESH + [(4096, 4096, 4096)]


def variant(a, b, cfg, fix):
    M, K = a.shape
    N = b.shape[1]
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    ws = torch.empty(sms * cfg.block_m * cfg.block_n, device="cuda", dtype=torch.float32)
    flags = torch.zeros(sms, device="cuda", dtype=torch.int32)

    def run():
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        probe["sk_variant"][(sms,)](*persistent.descriptors(a, b, c, cfg), ws, flags, M, N, K,
                                    streamk.stream_k_tiles(tiles, sms), BLOCK_M=cfg.block_m,
                                    BLOCK_N=cfg.block_n, BLOCK_K=64, GROUP_M=8, NUM_SMS=sms,
                                    FIXUP=fix, FORWARD=0, num_warps=cfg.num_warps,
                                    num_stages=cfg.num_stages)
        return c
    return run


out = []
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    row = {"shape": [M, N, K], "seed": seed}
    fns = {"cublas": lambda: a @ b}
    for bm, bn, s in ((128, 256, 3), (128, 128, 4)):
        cfg = TileConfig(bm, bn, 64, num_warps=8, num_stages=s, options=persistent.NEITHER)
        row[f"tiles {bm}x{bn}"] = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        p_run = persistent.launch(a, b, cfg)[1]
        sk_run = streamk.launch(a, b, cfg)[1]
        fns[f"p {bm}x{bn}"] = (lambda r=p_run: r(a, b))
        fns[f"sk {bm}x{bn}"] = (lambda r=sk_run: r(a, b))
        fitted = streamk.fitted(cfg)
        fns[f"sk {bm}x{bn} no hand-over"] = variant(a, b, fitted, 0)
    for name, fn in fns.items():
        got = fn()
        if "no hand-over" not in name:
            row[name + " err"] = round(((got.float() - ref).abs().max()
                                        / ref.abs().max()).item(), 5)
    torch.cuda.synchronize()
    if NCU:
        torch.cuda.profiler.start()         # ncu --profile-from-start off: these launches only
        for name, fn in fns.items():
            print(M, N, K, name, flush=True)
            fn()
            torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        continue
    times = bench.time_rounds(fns, rounds=3)
    row.update({name: round(t["ms"] * 1e3, 1) for name, t in times.items()})
    print(json.dumps(row), flush=True)
    out.append(row)
if not NCU:
    with open(os.path.join(os.environ.get("OUT", "."), "streamk_tail.json"), "w") as f:
        json.dump(out, f, indent=1)
    # The hand-over under repetition: the owners add the partials in a fixed order, so every
    # launch must give the same bits; a partial read before its helper wrote it would not.
    for M, N, K in SHAPES[:3]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        for bm, bn, s in ((128, 256, 3), (128, 128, 4)):
            cfg = TileConfig(bm, bn, 64, num_warps=8, num_stages=s, options=persistent.NEITHER)
            run = streamk.launch(a, b, cfg)[1]
            first = run(a, b)
            same = sum(torch.equal(run(a, b), first) for _ in range(300))
            print(f"repeat {M}x{N}x{K} {bm}x{bn}: {same} of 300 launches bit-identical",
                  flush=True)
