"""Lesson 07's tail shapes under Nsight Compute: why stream-K, which shares the last wave's
work evenly, still trails cuBLAS there.

A tail shape has a tile count just past a whole number of waves (:mod:`.matmul_shapes`
draws them). The persistent kernel pays a part-empty last wave; stream-K spreads every
tile's K steps over all the SMs and hands partial tiles on. Timings say only that both lose
to cuBLAS. The counters say where the time goes: the bytes each kernel reads from DRAM and
asks of L2, how often its tensor pipes are busy, how many programs it launched, and, in
cuBLAS's kernel name, the tile it chose (``nvjet_sm90_tst_128x160_...``: 128 x 160, a width
that is no power of two).

This experiment draws one tail shape afresh (fp16 or bf16, rows on 16 bytes, so that every
kernel takes it as given; the seed is in the record) and profiles one launch each of the
persistent kernel and stream-K on 128 x 256 and on 128 x 128 tiles, and of
``torch.matmul``, the way :mod:`.tiling_ncu` profiles lesson 04's ladder (its ``collect``:
a driver process per kernel under ``ncu --clock-control none --profile-from-start off``).
Only the matmul kernel is profiled: where the persistent kernel's launch first copies B onto
whole 128-byte lines (:func:`~helpers.kernels.matmul.persistent.pads_b`), that copy is left
out of its row, while the timed records include it.
"""

from __future__ import annotations

import random
import time

import torch

from .. import runtime
from ..kernels.matmul import persistent, streamk
from ..kernels.matmul.config import TileConfig
from . import experiment
from . import matmul_shapes as ms
from . import tiling_ncu as ncu

WIDE = TileConfig(128, 256, 64, num_warps=8, num_stages=3, options=persistent.NEITHER)
NARROW = TileConfig(128, 128, 64, num_warps=8, num_stages=4, options=persistent.NEITHER)
# (key, label, kernel, tile): the rungs, in the order the table shows them.
RUNGS = [("persistent_wide", "persistent, 128 x 256", "matmul_kernel_persistent", WIDE),
         ("streamk_wide", "stream-K, 128 x 256", "matmul_kernel_streamk", WIDE),
         ("persistent_narrow", "persistent, 128 x 128", "matmul_kernel_persistent", NARROW),
         ("streamk_narrow", "stream-K, 128 x 128", "matmul_kernel_streamk", NARROW),
         ("cublas", "torch.matmul (cuBLAS)", None, None)]
METRICS = (*ncu.METRICS, "lts__t_bytes.sum", "lts__t_sector_hit_rate.pct", "launch__grid_size")
WARMUP = 3
SMOKE = dict(shape=(96, 160, 128), dtype="fp16")      # CPU mode: each rung checked, no ncu

DRIVER = '''\
import sys
import helpers
from helpers.experiments import tail_ncu
tail_ncu.drive(sys.argv[1], sys.argv[2], sys.argv[3])
'''


def tail_shape(seed: int, sms: int) -> tuple[int, int, int, str]:
    """The first tail shape of ``seed``'s draw whose rows lie on 16 bytes (K and N multiples
    of 8): (M, N, K, dtype)."""
    for s in ms.draw(seed, sms):
        if s.family == "tail" and s.K % 8 == 0 and s.N % 8 == 0:
            return s.M, s.N, s.K, s.dtype
    raise ValueError(f"seed {seed} drew no tail shape on 16-byte rows")


def tiles_of(shape) -> dict:
    """Output tiles each rung's tile makes of an (M, N, K) product (None for cuBLAS, whose
    tile the record reads from its kernel's name)."""
    M, N = shape[0], shape[1]
    return {k: None if t is None else -(-M // t.block_m) * -(-N // t.block_n)
            for k, _, _, t in RUNGS}


def inputs(shape, dtype: str):
    from ..dtypes import torch_dtype

    M, N, K = shape
    g = torch.Generator(device=runtime.device()).manual_seed(0)
    a = torch.randn(M, K, device=runtime.device(), generator=g).to(torch_dtype(dtype))
    b = torch.randn(K, N, device=runtime.device(), generator=g).to(torch_dtype(dtype))
    return a, b


def launcher(rung: str, a, b, sms: int | None = None):
    """``run()``: the rung's product of ``a`` and ``b``, built once (compiled, no tuner)."""
    _, _, _, tile = {r[0]: r for r in RUNGS}[rung]
    if tile is None:
        return lambda: torch.matmul(a, b)
    if rung.startswith("streamk"):
        run = streamk.launch(a, b, tile, sms=sms)[1]
    else:
        run = persistent.launch(a, b, tile)[1]
    return lambda: run(a, b)


def check(rung: str, shape, dtype: str, sms: int | None = None) -> float:
    """Relative error of the rung's product against fp32 ``torch.matmul``; refuse a wrong one."""
    a, b = inputs(shape, dtype)
    ref = torch.matmul(a.float(), b.float())
    err = ((launcher(rung, a, b, sms)().float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{rung} is wrong at {shape}: relative error {err:.3g}")
    return err


def drive(rung: str, shape: str, dtype: str) -> None:
    """The driver's body: build and warm the rung up, then one launch in a profiler range."""
    a, b = inputs([int(x) for x in shape.split("x")], dtype)
    run = launcher(rung, a, b)
    for _ in range(WARMUP):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


@experiment("tail_ncu")
def tail_ncu(seed: int | None = None, shape=None, dtype: str = "bf16",
             smoke: bool = False) -> dict:
    """Nsight Compute counters of the persistent kernel, stream-K and cuBLAS on a freshly
    drawn tail shape (about a minute)."""
    if smoke:
        return tail_ncu(**SMOKE)
    start = time.perf_counter()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if runtime.is_gpu() else 132
    if shape is None:
        seed = random.SystemRandom().randrange(2**31) if seed is None else seed
        *shape, dtype = tail_shape(seed, sms)
    for key, *_ in RUNGS:             # the same launches, checked here first (both modes)
        check(key, shape, dtype, sms=None if runtime.is_gpu() else 4)
    runtime.require_gpu("profiling with Nsight Compute")
    label = "x".join(map(str, shape))
    out = ncu.collect(ncu.find_ncu(), [(k, lab, None, {}) for k, lab, _, _ in RUNGS], label,
                      dtype, driver_source=DRIVER, kernels={k: kern for k, _, kern, _ in RUNGS},
                      metrics=METRICS, shape=list(shape))
    tiles = tiles_of(shape)
    for row in out["rows"]:
        row["tiles"] = tiles[row["rung"]]
    out.update(seed=seed, sms=sms, seconds=round(time.perf_counter() - start, 1))
    return out
