"""Probe: a timeline of stream-K's programs. Each program writes the GPU's clock
(``%globaltimer``, ns) and its SM (``%smid``) at the start and end of every piece of K steps
it runs (a whole tile with ``SK_TILES=0``: the persistent kernel's order), so the slow part of
a launch shows as programs that start late, pieces that run slow or owners that wait. The
kernel is the course's (``helpers.kernels.matmul.streamk``) with its hand-over in a copy
whose parts can be left out: ``sk race`` reads the partials without waiting for the flags
(wrong when a helper is late: timing only), ``sk no loads`` waits and reads nothing,
``sk evict_last`` keeps the helpers' partials in L2 ahead of other lines.

What it showed on an H200 (fp16, warm L2, the last of five launches):

* 3048 x 688 x 6144, 128 x 256 tiles: the persistent order ran 72 tiles on 72 SMs at 629 ns a
  K step; stream-K ran all 132 SMs at 789 ns a step, and its last owner finished 52.4 us
  after the start against 61.0 us. Its owners spent a median 6.3 us from the end of their K
  steps to C's store (1.67 partials each), 0.6 of it in the acquire (``sk no loads``).
* 4096^3, 128 x 256: 182-183 us in the persistent order, 192-194 us as stream-K: per step
  712 against 728 ns, and 4.5 us an owner for its one partial.
* Evicting the partials last changed nothing, so they are not read back from DRAM.

    PYTHONPATH=$PWD python3 tests/gpu/streamk_timeline_probe.py     # $OUT/timeline_*.json
"""
import json
import os

import torch
import triton
import triton.language as tl

from helpers.kernels.matmul import persistent, streamk
from helpers.kernels.matmul.config import TileConfig
from helpers.kernels.matmul.ladder import grouped_tile
from helpers.kernels.matmul.streamk import _async_proxy_fence, _steps, stream_k_tiles, workspace_box
from triton.tools.tensor_descriptor import TensorDescriptor

EVENTS = 8      # pieces recorded per program
FIELDS = 9      # tile, k_first, k_stop, start ns, loop end ns, end ns, sm, acquired ns, added ns


@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _sm():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _note(log, pid, n, tile, k_first, k_stop, t0, t1, t2, ta, tb,
          EVENTS: tl.constexpr, FIELDS: tl.constexpr):
    if n < EVENTS:
        base = log + (pid * EVENTS + n) * FIELDS
        tl.store(base + 0, tile.to(tl.int64))
        tl.store(base + 1, k_first.to(tl.int64))
        tl.store(base + 2, k_stop.to(tl.int64))
        tl.store(base + 3, t0)
        tl.store(base + 4, t1)
        tl.store(base + 5, t2)
        tl.store(base + 6, _sm().to(tl.int64))
        tl.store(base + 7, ta)
        tl.store(base + 8, tb)


@triton.jit
def _handover_probe(acc, ws_desc, flags_ptr, pid, tile_start, total,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SMS: tl.constexpr,
                    MODE: tl.constexpr):
    """The course's _add_handed_over with parts left out, to time them: MODE 1 reads the
    partials without waiting for the flags (a race: timing only), MODE 2 waits and reads
    nothing."""
    HALVES: tl.constexpr = BLOCK_M * BLOCK_N > 128 * 128
    W: tl.constexpr = BLOCK_N // 2 if HALVES else BLOCK_N
    if HALVES:
        left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, W)), (0, 2, 1)))
    else:
        left, right = acc, acc
    p = pid - 1
    while (p >= 0) & ((p + 1) * total // NUM_SMS > tile_start):
        if (p + 1) * total // NUM_SMS > p * total // NUM_SMS:
            if MODE != 1:
                while tl.atomic_cas(flags_ptr + p, 1, 0, sem="acquire", scope="gpu") != 1:
                    pass
            else:
                tl.atomic_xchg(flags_ptr + p, 0, sem="relaxed", scope="gpu")
            if MODE != 2:
                _async_proxy_fence()
                left += ws_desc.load([p * BLOCK_M, 0])
                if HALVES:
                    right += ws_desc.load([p * BLOCK_M, W])
        p -= 1
    if HALVES:
        acc = tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (BLOCK_M, BLOCK_N))
    else:
        acc = left
    return acc


@triton.jit
def sk_timeline(a_desc, b_desc, c_desc, ws_desc, ws_ptr, flags_ptr, log, M, N, K, SK_TILES,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EVENTS: tl.constexpr,
                FIELDS: tl.constexpr, MODE: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    whole = num_pid_m * num_pid_n - SK_TILES
    n = pid * 0
    for tile in tl.range(pid, whole, NUM_SMS):
        t0 = _clock()
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, steps, acc,
                     BLOCK_K, False, False)
        out = acc.to(c_desc.dtype)
        t1 = _clock()
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], out)
        _note(log, pid, n, tile, pid * 0, steps, t0, t1, _clock(), t1, t1, EVENTS, FIELDS)
        n += 1
    total = SK_TILES * steps
    first = pid * total // NUM_SMS
    stop = (pid + 1) * total // NUM_SMS
    box = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    end = stop
    while end > first:
        t0 = _clock()
        t = (end - 1) // steps
        k_stop = end - t * steps
        k_first = tl.maximum(first - t * steps, 0)
        pid_m, pid_n = grouped_tile(whole + t, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_first, k_stop, acc,
                     BLOCK_K, False, False)
        ta = t0 * 0
        tb = t0 * 0
        if k_stop < steps:
            if EVICT:
                tl.store(ws_ptr + pid * BLOCK_M * BLOCK_N + box, acc, eviction_policy="evict_last")
            else:
                tl.store(ws_ptr + pid * BLOCK_M * BLOCK_N + box, acc)
            t1 = _clock()
            tl.debug_barrier()
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release", scope="gpu")
        else:
            acc += 0.0
            t1 = _clock()
            acc = _handover_probe(acc, ws_desc, flags_ptr, pid, t * steps, total,
                                  BLOCK_M, BLOCK_N, NUM_SMS, MODE)
            ta = _clock()
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
        _note(log, pid, n, whole + t, k_first, k_stop, t0, t1, _clock(), ta, tb, EVENTS, FIELDS)
        n += 1
        end = t * steps + k_first


sms = persistent.sm_count(torch.device("cuda"))
SHAPES = [(3048, 688, 6144, 128, 256, 3), (3048, 688, 6144, 128, 128, 4),
          (4096, 4096, 4096, 128, 256, 3), (448, 4632, 5760, 128, 256, 3)]
for M, N, K, bm, bn, stages in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    cfg = streamk.fitted(TileConfig(bm, bn, 64, num_warps=8, num_stages=stages,
                                    options=persistent.NEITHER))
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    ws = torch.empty(sms * bm * bn, device="cuda", dtype=torch.float32)
    flags = torch.zeros(sms, device="cuda", dtype=torch.int32)
    slabs = ws.view(sms * bm, bn)
    ws_desc = TensorDescriptor(slabs, list(slabs.shape), list(slabs.stride()), workspace_box(cfg))
    result = {"shape": [M, N, K], "tile": [bm, bn], "stages": cfg.num_stages, "sms": sms}
    sk = stream_k_tiles(tiles, sms)
    for name, sk_tiles, mode, evict in (("dp", 0, 0, 0), ("sk", sk, 0, 0), ("sk race", sk, 1, 0),
                                         ("sk no loads", sk, 2, 0), ("sk evict_last", sk, 0, 1)):
        flags.zero_()          # a racing variant may leave flags raised
        log = torch.full((sms, EVENTS, FIELDS), -1, device="cuda", dtype=torch.int64)
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)

        def go():
            sk_timeline[(sms,)](*persistent.descriptors(a, b, c, cfg), ws_desc, ws, flags, log,
                                M, N, K,
                                sk_tiles, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8,
                                NUM_SMS=sms, EVENTS=EVENTS, FIELDS=FIELDS, MODE=mode,
                                EVICT=evict, num_warps=8,
                                num_stages=cfg.num_stages)
        for _ in range(5):                  # warm: the last launch is the one kept
            log.fill_(-1)
            torch.cuda._sleep(1_000_000)    # the GPU busy a moment, so the launch queues
            go()
        torch.cuda.synchronize()
        err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        result[name] = {"sk_tiles": sk_tiles, "error": err, "log": log.cpu().tolist()}
        print(M, N, K, bm, bn, name, "error", round(err, 5), flush=True)
    path = os.path.join(os.environ.get("OUT", "."), f"timeline_{M}x{N}x{K}_{bm}x{bn}.json")
    with open(path, "w") as f:
        json.dump(result, f)
