"""Probe: why stream-K loses where its tiles are fewer than the SMs (H200: 1615 x 1024 x 4096,
128 x 128 tiles, 33 us against the persistent kernel's 31, when sharing K steps over 132
programs should take about 20). The course's kernel beside a copy of it without the
hand-over (helpers store nothing, owners wait for nobody: wrong sums, the steps' own
time) and one that walks its steps forwards; each timed with a cold L2 (do_bench) and
warm (50 calls back to back between two events).

    PYTHONPATH=$PWD python3 tests/gpu/streamk_probe.py      # $OUT/streamk.json
"""
import json
import os

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig
from helpers.kernels.matmul.ladder import grouped_tile
from helpers.kernels.matmul.streamk import _steps, stream_k_tiles


@triton.jit
def sk_variant(a_desc, b_desc, c_desc, ws_ptr, flags_ptr, M, N, K, SK_TILES,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, FIXUP: tl.constexpr,
               FORWARD: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    whole = num_pid_m * num_pid_n - SK_TILES
    for tile in tl.range(pid, whole, NUM_SMS):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, steps, acc,
                     BLOCK_K, False, False)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
    total = SK_TILES * steps
    first = pid * total // NUM_SMS
    stop = (pid + 1) * total // NUM_SMS
    box = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    # A cursor that rises either way: the position forwards, minus it backwards.
    if FORWARD:
        cursor, limit = first, stop
    else:
        cursor, limit = -stop, -first
    while cursor < limit:
        if FORWARD:
            t = cursor // steps
            k_first = cursor - t * steps
            k_stop = tl.minimum(stop - t * steps, steps)
        else:
            t = (-cursor - 1) // steps
            k_stop = -cursor - t * steps
            k_first = tl.maximum(first - t * steps, 0)
        pid_m, pid_n = grouped_tile(whole + t, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_first, k_stop, acc,
                     BLOCK_K, False, False)
        if k_stop < steps:
            if FIXUP:
                tl.store(ws_ptr + pid * BLOCK_M * BLOCK_N + box, acc)
                tl.debug_barrier()
                tl.atomic_xchg(flags_ptr + pid, 1)
        else:
            if FIXUP:
                tile_start = t * steps
                p = pid - 1
                while (p >= 0) & ((p + 1) * total // NUM_SMS > tile_start):
                    if (p + 1) * total // NUM_SMS > p * total // NUM_SMS:
                        while tl.atomic_cas(flags_ptr + p, 1, 0) != 1:
                            pass
                        acc += tl.load(ws_ptr + p * BLOCK_M * BLOCK_N + box,
                                       cache_modifier=".cg")
                    p -= 1
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
        if FORWARD:
            cursor = t * steps + k_stop
        else:
            cursor = -(t * steps + k_first)


def warm_us(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / calls * 1e3


SHAPES = [(1615, 1024, 4096), (2256, 984, 3072), (4096, 4096, 4096), (2520, 1704, 7040)]
out = []
sms = persistent.sm_count(torch.device("cuda"))
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    row = {"shape": [M, N, K]}
    fns = {"cublas": lambda: a @ b}
    for bm, bn, w, s in ((128, 128, 8, 4), (128, 256, 8, 3)):
        cfg = TileConfig(bm, bn, 64, num_warps=w, num_stages=s, options=persistent.NEITHER)
        fns[f"p {bm}x{bn}"] = persistent.launch(a, b, cfg)[1]
        fns[f"sk {bm}x{bn}"] = streamk.launch(a, b, cfg)[1]
        cfg = streamk.fitted(cfg)
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        ws = torch.empty(sms * bm * bn, device="cuda", dtype=torch.float32)
        flags = torch.zeros(sms, device="cuda", dtype=torch.int32)
        for fix in (1, 0):
            for fwd in (0, 1):
                if fwd and not fix:
                    continue
                def v(fix=fix, fwd=fwd, cfg=cfg, tiles=tiles, ws=ws, flags=flags):
                    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
                    descs = persistent.descriptors(a, b, c, cfg)
                    sk_variant[(sms,)](*descs, ws, flags, M, N, K, stream_k_tiles(tiles, sms),
                                       BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                       BLOCK_K=64, GROUP_M=8, NUM_SMS=sms, FIXUP=fix,
                                       FORWARD=fwd, num_warps=cfg.num_warps,
                                       num_stages=cfg.num_stages)
                    return c
                name = f"skv {bm}x{bn} fix={fix} fwd={fwd}"
                err = ((v().float() - ref).abs().max() / ref.abs().max()).item()
                row[name + " err"] = round(err, 4)
                fns[name] = v
    for name, fn in fns.items():
        takes_operands = name[:2] in ("p ", "sk") and not name.startswith("skv")
        f = (lambda fn=fn: fn(a, b)) if takes_operands else fn
        row[name] = [round(do_bench(f, rep=50) * 1e3, 1), round(warm_us(f), 1)]
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "streamk.json"), "w"), indent=1)
