"""Lesson 04 (tiling), measured: the matmul ladder, every version of helpers.kernels.matmul
next to cuBLAS.

Four parts, all timed in this one process with :func:`helpers.bench.time_ms` (median,
cold L2; the ladder keeps the fastest of a few such medians), on random inputs (tensor
cores draw less power on zeros and run faster):

* **ladder**: each rung of the lesson (naive, tiled, grouped, pipelined, 8 warps,
  autotuned, TMA, and ``matmul()``, the best of them) at square sizes 512 to 8192, fp16
  and bf16, each timed alternately with ``torch.matmul`` (cuBLAS) on the same inputs
  (:func:`side_by_side`). Autotuned rungs also record the configuration they ran.
* **knobs**: v3 at one size with the tile, ``num_stages`` and ``num_warps`` varied one at a
  time, with what the compiler reports for each: shared memory, registers per thread,
  register spills, or the error when a configuration does not fit.
* **groups**: v3 at its best tile on a large problem with the program order varied,
  from row-major (``GROUP_M = 1``) to groups of 64 rows of tiles.
* **tf32**: fp32 inputs through ``tl.dot``'s default TF32 tensor cores and through true
  fp32 ("ieee"), their errors against an fp64 product and their speed, next to
  ``torch.matmul`` (which multiplies fp32 in full precision unless told otherwise).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch
import triton

from .. import bench, hardware, intensity
from ..dtypes import torch_dtype
from ..kernels import matmul as mm
from ..kernels.matmul.config import TileConfig
from . import experiment

SIZES = (512, 1024, 2048, 4096, 8192)
DTYPES = ("fp16", "bf16")

# The rungs of the ladder: (key, label, version, launch options). The labels are what
# the lesson's tables and plots print.
STEPS = (
    ("v1", "v1 naive (CUDA cores)", "v1", {"block_n": 64, "block_k": 32}),
    ("v2", "v2 tiled, tl.dot", "v2", {"block_m": 128, "block_n": 128, "block_k": 64,
                                      "num_warps": 4, "num_stages": 1}),
    ("v3", "v3 grouped order", "v3", {"block_m": 128, "block_n": 128, "block_k": 64,
                                      "group_m": 8, "num_warps": 4, "num_stages": 1}),
    ("v3_stages", "v3 + 4 pipeline stages", "v3", {"block_m": 128, "block_n": 128,
                                                   "block_k": 64, "group_m": 8,
                                                   "num_warps": 4, "num_stages": 4}),
    ("v3_warps", "v3 + 8 warps, 128x256 tile", "v3", {"block_m": 128, "block_n": 256,
                                                      "block_k": 64, "group_m": 8,
                                                      "num_warps": 8, "num_stages": 3}),
    ("v4", "v4 autotuned", "v4", {}),
    ("v5", "v5 TMA, persistent", "v5", {}),
    ("best", "matmul(): v4 or v5", "best", {}),
)

# The knob sweep: v3 at KNOB_SIZE in fp16, each tile with every stage count and warp count.
KNOB_SIZE = 4096
KNOB_TILES = ((128, 128, 64), (128, 256, 64))
KNOB_STAGES = (1, 2, 3, 4, 5)
KNOB_WARPS = (4, 8)

TF32_SIZE = 4096

# The program-order sweep: v3 with its fastest tile at GROUP_SIZE, GROUP_M from 1
# (row-major order, as in v2) up. Large enough that B (128 MiB in fp16) dwarfs the L2.
GROUP_SIZE = 8192
GROUP_MS = (1, 2, 4, 8, 16, 32, 64)
GROUP_CONFIG = TileConfig(128, 256, 64, num_stages=4, num_warps=8)   # GROUP_M: the sweep's


def _inputs(n: int, dtype, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(n, n, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    b = torch.randn(n, n, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    return a, b


def _launcher(version: str, options: dict):
    fn = mm.matmul if version == "best" else mm.VERSIONS[version]
    return lambda a, b: fn(a, b, **options)


def _check(c, ref, what: str) -> float:
    """Relative error of ``c`` against ``ref`` (norm-wise); refuse a wrong kernel."""
    err = ((c.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{what} is wrong: relative error {err:.3g}")
    return err


def _chosen(version: str, a, b) -> dict | None:
    if version == "best":
        version = mm.best_version(a, b)
    if version == "v4":
        tuner, dtype_in_key = mm.matmul_kernel_v4, True
    elif version == "v5":
        tuner, dtype_in_key = mm.matmul_kernel_v5_tuned[a.dtype], False
    else:
        return None
    want = (a.shape[0], b.shape[1], a.shape[1])
    for key, config in tuner.cache.items():
        if tuple(key[:3]) == want and (not dtype_in_key or str(a.dtype) in map(str, key)):
            return {"version": version, **config.kwargs, "num_stages": config.num_stages,
                    "num_warps": config.num_warps}
    return None


# Each rung is timed against cuBLAS ROUNDS times, alternately. A GPU under a long full load
# heats up and lowers its clocks: timing cuBLAS once and then eight kernels after it would
# hand cuBLAS the cool, fast GPU. Alternating gives both the same.
#
# Of the rounds, the fastest is kept, for both. A small product is over in a few
# microseconds, less than the host needs to launch it: torch.matmul spends 12 to 18 us of
# host time per call, the Triton launchers here 40 to 140 us (measured on an H100, Python
# 3.12, Triton 3.6). While the host keeps ahead of the GPU (do_bench flushes the L2 between
# calls, which gives it time), the events time the kernel; when the host falls behind, for
# a hiccup of the machine, they time the host instead, and a 10 us product measures 30 us.
# Such a round is only ever slower, so the fastest round is the closest to the kernel's.
ROUNDS = 3


def side_by_side(ours, reference, rounds: int = ROUNDS) -> tuple[float, float]:
    """ms of ``ours`` and of ``reference``: each timed ``rounds`` times, alternately, and
    the fastest of its rounds (each a median of :func:`bench.time_ms`) kept."""
    our_ms, ref_ms = [], []
    for _ in range(rounds):
        ref_ms.append(bench.time_ms(reference))
        our_ms.append(bench.time_ms(ours))
    return min(our_ms), min(ref_ms)


def cublas_tflops(rows: list[dict], n: int, dtype: str) -> float:
    """torch.matmul's TFLOP/s at ``n``^3 in ``dtype``: the median of the timings taken beside
    each rung (they differ by a few percent from one to the next, like any timing)."""
    mine = [r["cublas_tflops"] for r in rows if r["n"] == n and r["dtype"] == dtype]
    if not mine:
        raise ValueError(f"the ladder has no {dtype} rows at n={n}")
    return statistics.median(mine)


def ladder(sizes=SIZES, dtypes=DTYPES, steps=None, rounds: int = ROUNDS) -> list[dict]:
    steps = [s for s in STEPS if steps is None or s[0] in steps]
    rows = []
    for dtype in dtypes:
        dt = torch_dtype(dtype)
        for n in sizes:
            a, b = _inputs(n, dt)
            ref = torch.matmul(a.float(), b.float())
            flops = intensity.matmul(n, n, n).flops
            _check(torch.matmul(a, b), ref, f"torch.matmul {dtype} n={n}")
            for key, label, version, options in steps:
                fn = _launcher(version, options)
                err = _check(fn(a, b), ref, f"{label} {dtype} n={n}")
                # v1 is hundreds of times slower than cuBLAS: one round says all there is.
                ms, cublas_ms = side_by_side(lambda: fn(a, b),  # noqa: B023
                                             lambda: torch.matmul(a, b),  # noqa: B023
                                             1 if key == "v1" else rounds)
                rows.append({"step": key, "label": label, "dtype": dtype, "n": n, "ms": ms,
                             "tflops": bench.tflops(flops, ms), "cublas_ms": cublas_ms,
                             "cublas_tflops": bench.tflops(flops, cublas_ms),
                             "vs_cublas": cublas_ms / ms, "rel_error": err,
                             "config": _chosen(version, a, b) or options})
            del a, b, ref
            torch.cuda.empty_cache()
    return rows


def knobs(n: int = KNOB_SIZE, tiles=KNOB_TILES, stages=KNOB_STAGES, warps=KNOB_WARPS,
          dtype: str = "fp16") -> list[dict]:
    """v3 with one knob turned at a time; what the compiler made of each configuration."""
    dt = torch_dtype(dtype)
    a, b = _inputs(n, dt, seed=1)
    c = torch.empty_like(a)
    ref = torch.matmul(a.float(), b.float())
    rows = []
    for bm, bn, bk in tiles:
        for w in warps:
            for s in stages:
                setting = TileConfig(bm, bn, bk, num_stages=s, num_warps=w)
                row = {**setting.as_dict(KNOB_KEYS), "dtype": dtype, "n": n,
                       "sram_model": setting.shared_memory_bytes(dt)}
                grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)
                try:
                    compiled = mm.matmul_kernel_v3[grid](
                        a, b, c, n, n, n, *a.stride(), *b.stride(), *c.stride(),
                        **setting.as_dict(mm.CONFIG_KEYS), PRECISION="tf32")
                except Exception as err:  # noqa: BLE001 - a config that does not fit
                    row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                    rows.append(row)
                    continue
                _check(c, ref, f"v3 {bm}x{bn}x{bk} s{s} w{w}")
                row["shared_bytes"] = int(compiled.metadata.shared)
                row["registers"] = int(getattr(compiled, "n_regs", 0) or 0)
                row["spills"] = int(getattr(compiled, "n_spills", 0) or 0)
                ms = bench.time_ms(lambda: mm.launch_v3(a, b, setting))  # noqa: B023
                row.update(ms=ms, tflops=bench.tflops(intensity.matmul(n, n, n).flops, ms))
                rows.append(row)
    ms = bench.time_ms(lambda: torch.matmul(a, b))
    rows.append({"cublas": True, "dtype": dtype, "n": n, "ms": ms,
                 "tflops": bench.tflops(intensity.matmul(n, n, n).flops, ms)})
    return rows


def groups(n: int = GROUP_SIZE, group_ms=GROUP_MS, config=GROUP_CONFIG,
           dtype: str = "fp16") -> list[dict]:
    """v3 at one tile configuration with the program order changed: GROUP_M = 1 is v2's."""
    a, b = _inputs(n, torch_dtype(dtype), seed=3)
    ref = torch.matmul(a.float(), b.float())
    rows = []
    for g in group_ms:
        setting = replace(config, group_m=g)
        _check(mm.launch_v3(a, b, setting), ref, f"v3 GROUP_M={g}")
        ms = bench.time_ms(lambda: mm.launch_v3(a, b, setting))  # noqa: B023
        rows.append({**setting.as_dict(mm.CONFIG_KEYS), "dtype": dtype, "n": n, "ms": ms,
                     "tflops": bench.tflops(intensity.matmul(n, n, n).flops, ms)})
    return rows


# fp32 tiles take twice the bytes of fp16 ones: a 128 x 128 x 32 tile with 3 stages.
TF32_CONFIG = TileConfig(128, 128, 32, num_stages=3, num_warps=4)
# How the tiling and tf32 records write a setting of v3: matmul_v3's keyword names.
LAUNCH_KEYS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
KNOB_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")   # the knob rows'


def tf32(n: int = TF32_SIZE, config=None) -> dict:
    """fp32 inputs: TF32 tensor cores versus true fp32, error and speed."""
    config = TileConfig.of(config or TF32_CONFIG)
    a, b = _inputs(n, torch.float32, seed=2)
    exact = torch.matmul(a.double(), b.double())
    out = {"n": n, "config": config.as_dict(LAUNCH_KEYS)}
    for name, fn in (("tf32", lambda: mm.launch_v3(a, b, config, precision="tf32")),
                     ("ieee", lambda: mm.launch_v3(a, b, config, precision="ieee")),
                     ("torch", lambda: torch.matmul(a, b))):
        c = fn().double()
        ms = bench.time_ms(fn)
        out[name] = {"max_abs_error": (c - exact).abs().max().item(),
                     "rel_error": ((c - exact).norm() / exact.norm()).item(),
                     "ms": ms, "tflops": bench.tflops(intensity.matmul(n, n, n).flops, ms)}
    out["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    out["max_abs_exact"] = exact.abs().max().item()
    return out


# What a notebook measures live in GPU mode: every part, smaller (about a minute on a
# Hopper GPU, compilation included). ./course record runs the full defaults.
QUICK = dict(sizes=(1024, 4096), knob_tiles=((128, 256, 64),), knob_stages=(3, 4, 5),
             group_size=4096, group_ms=(1, 8), tf32_size=2048)


@experiment("tiling")
def tiling(sizes=SIZES, dtypes=DTYPES, steps=None, knob_size=KNOB_SIZE, knob_tiles=KNOB_TILES,
           knob_stages=KNOB_STAGES, knob_warps=KNOB_WARPS, group_size=GROUP_SIZE,
           group_ms=GROUP_MS, tf32_size=TF32_SIZE) -> dict:
    """The whole record. Smaller arguments give the quick version a notebook runs live."""
    spec = hardware.current_gpu()
    out = {
        "sizes": list(sizes),
        "dtypes": list(dtypes),
        "steps": [{"key": k, "label": lab, "version": v, "options": o}
                  for k, lab, v, o in STEPS if steps is None or k in steps],
        "ladder": ladder(sizes, dtypes, steps),
    }
    if knob_size:
        out["knobs"] = knobs(knob_size, knob_tiles, knob_stages, knob_warps)
    if group_size:
        out["groups"] = groups(group_size, group_ms)
    if tf32_size:
        out["tf32"] = tf32(tf32_size)
    if spec is not None:
        out["table"] = {"key": spec.key, "name": spec.name,
                        "hbm_bandwidth_gbs": spec.hbm_bandwidth_gbs,
                        "peak_tflops": dict(spec.peak_tflops),
                        "smem_per_sm_kib": spec.smem_per_sm_kib, "sm_count": spec.sm_count}
    return out
