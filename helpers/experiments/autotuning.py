"""Lesson 07's measurements: one matmul kernel, many settings, many shapes.

* **heatmaps**: TFLOP/s of :func:`~helpers.kernels.matmul.tuned.matmul_kernel_v6` under
  every tile shape x warps x stages of :data:`HEATMAP_TILES` for four shapes (square,
  skinny, long K, off the tile grid), fp16: where the best setting sits, and how it moves.
* **shapes**: :data:`SHAPES` (16 shapes: squares 1024-8192, M in {1, 16, 128} with large
  N and K, long K with small M and N, sizes off the tile grid), fp16 and bf16: the
  tuned path (v6 and the persistent TMA kernel, each autotuned, on the operands as given
  and copied into rows of whole 128-byte lines; the fastest whole plan kept) against
  ``torch.matmul`` (cuBLAS) and against lesson 04's single setting (:data:`FIXED`), each
  output checked before it is timed, and the kernel and setting that were kept.
* **tuning_time**: the seconds the first call of each shape took here (search and
  compile), then two fresh processes on the same cache directory: one calling the tuned
  kernel (the timings come from the autotuner's disk cache), one calling the fixed
  setting (never tunes).
* **launch_overhead**: host microseconds per call at a tiny shape, for the autotuned
  launcher, a direct launch, ``torch.matmul`` and a CUDA graph replay.

Timings are medians of :func:`helpers.bench.time_ms` (cold L2) in this one process; in the
sweep, cuBLAS and the tuned path are timed :data:`ROUNDS` times in turn.
``./course record autotuning`` writes ``helpers/records/autotuning__<gpu>.json``.

**What a sweep row keeps.** Besides the times and errors: the kernel, setting and layout the
tuned path kept, and each candidate plan's time (``candidates_ms``, milliseconds, named
``"<kernel> as given"`` or ``"<kernel> whole lines"``; :mod:`~helpers.kernels.matmul.plan`
says what the candidates are). A record lists the candidates of the tree it was taken at
(its provenance's ``git_commit``): one taken before the runner-up plan
(:func:`~helpers.kernels.matmul.plan.runner_up`) lists one v6 plan per layout, one taken
before stream-K (:mod:`~helpers.kernels.matmul.streamk`) no stream-K plan.

**Reading a row below the floor** (:data:`FLOOR_VS_TORCH` against ``torch.matmul``). It is
open work, for one of two reasons: no setting of any kernel is fast enough on that shape,
or a faster setting was in the space and the tuner did not keep it. The same shape in the
other dtype, or on the other GPU, kept with another setting that reaches the floor, points
to the second reason, which the runner-up plan guards against.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

from .. import bench
from ..kernels.matmul import tuned as mt
from ..kernels.matmul.config import TileConfig, gpu_in_use
from . import experiment

# --- The lesson's targets, and how its tables name a setting. -------------------------
# The lesson's figures (helpers.plots.autotuning.targets), its record tests and the
# course's performance report (helpers.performance) all judge a record against these.
GEOMEAN_VS_TORCH = 0.95      # geometric mean of torch_ms / tuned_ms over the sweep
FLOOR_VS_TORCH = 0.80        # no shape below this
SQUARE_8192_VS_TORCH = 0.95  # at 8192^3, each dtype
GEOMEAN_VS_FIXED = 1.2       # tuned against lesson 04's single setting
CACHED_OVER_UNTUNED = 1.10   # a cached run within 10 % of a run that never tunes


def cached_over_untuned(t: dict) -> float:
    """A cached run's time over a run that never tunes, from a record's ``tuning_time``.

    The experiment runs the two kinds of fresh process in turn, a pair at a time, so this
    is the median of the pairs' ratios: a slow spell of the machine, which moves a single
    process by 20 % or more, slows both runs of a pair and cancels. (A record without the
    runs: the ratio of the two medians.)
    """
    cached, untuned = t.get("cached_runs_s"), t.get("untuned_runs_s")
    if cached and untuned and len(cached) == len(untuned):
        return statistics.median(c / u for c, u in zip(cached, untuned))
    if "cached_s" in t and "untuned_s" in t:
        return t["cached_s"] / t["untuned_s"]
    return float("nan")


def describe(config: dict) -> str:
    """``128x256x64 w8 s3`` (tile, warps, stages), with split-K and GROUP_M when they matter,
    and the persistent kernel's options when on (``flatten``, ``split epilogue``): how every
    table of the lesson, and the performance report, names a recorded setting."""
    return TileConfig.of(config).describe()      # a record's dict, or the setting itself

SHAPES = [
    ("square 1024", 1024, 1024, 1024), ("square 2048", 2048, 2048, 2048),
    ("square 4096", 4096, 4096, 4096), ("square 8192", 8192, 8192, 8192),
    ("one row", 1, 8192, 8192), ("16 rows", 16, 8192, 8192), ("128 rows", 128, 8192, 8192),
    ("skinny MLP", 64, 14336, 4096), ("long K 256", 256, 256, 16384),
    ("long K 128x512", 128, 512, 32768), ("off grid 4000x3000x1000", 4000, 3000, 1000),
    ("off grid 333x777x1999", 333, 777, 1999), ("off grid 1000^3", 1000, 1000, 1000),
    ("off grid 3000x5000x2500", 3000, 5000, 2500), ("tall 8192x1024x4096", 8192, 1024, 4096),
    ("off grid 2047x4097x1023", 2047, 4097, 1023),
]
DTYPES = (torch.float16, torch.bfloat16)
HEATMAP_SHAPES = [("square 4096", 4096, 4096, 4096), ("skinny M=64", 64, 8192, 8192),
                  ("long K", 256, 256, 16384), ("off grid", 4000, 3000, 1000)]
HEATMAP_TILES = [(16, 128), (32, 128), (64, 64), (64, 128), (128, 64), (128, 128), (128, 256),
                 (256, 128)]
HEATMAP_WARPS, HEATMAP_STAGES = (4, 8), (3, 4)
# Lesson 04's best single setting (its ladder's top rung): 128 x 256 tiles, 8 warps.
FIXED = TileConfig(128, 256, 64, num_warps=8, num_stages=3)
OVERHEAD_SHAPE = (64, 64, 64)
# cuBLAS and the tuned path are timed this many times in turn; a row keeps the median of
# each one's medians. A cold-L2 timing hides a call's host work only while the GPU is busy
# with the L2 flush before it (about 80 us on an H100). The persistent plan's host time is
# the tuned path's largest, about 40 us a call on the machines recorded, and in a slow spell
# of the host one do_bench of it read 33 us where the two before and after read 13 (H100,
# 1000^3 bf16): a single median would have kept the spell.
ROUNDS = 3


def _flops(M, N, K) -> float:
    return 2.0 * M * N * K


def _inputs(M, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(M, K, device="cuda", dtype=dtype, generator=g),
            torch.randn(K, N, device="cuda", dtype=dtype, generator=g))


def _error(c, a, b) -> float:
    """Worst error relative to the largest output, against an fp32 product."""
    want = a.float() @ b.float()
    return ((c.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def heatmaps() -> list[dict]:
    out = []
    for label, M, N, K in HEATMAP_SHAPES:
        a, b = _inputs(M, N, K, torch.float16)
        rows = []
        for bm, bn in HEATMAP_TILES:
            for warps in HEATMAP_WARPS:
                for stages in HEATMAP_STAGES:
                    config = TileConfig(bm, bn, 64, num_warps=warps, num_stages=stages)
                    row = config.as_dict(mt.KEYS)
                    ok, why = config.fits(gpu_in_use()[0], torch.float16)
                    if not ok:
                        rows.append({**row, "ms": None, "tflops": None, "error": why})
                        continue
                    try:
                        ms = bench.time_ms(lambda: mt.matmul_tuned(a, b, config=config))
                        rows.append({**row, "ms": ms, "tflops": bench.tflops(_flops(M, N, K), ms)})
                    except Exception as error:      # the compiler may still refuse one
                        rows.append({**row, "ms": None, "tflops": None,
                                     "error": f"{type(error).__name__}: {str(error)[:200]}"})
        out.append({"label": label, "M": M, "N": N, "K": K, "dtype": "fp16", "rows": rows})
    return out


def _choice(a, b) -> dict:
    """The kernel the tuned path kept for this shape, and its setting in v6's keys (the
    persistent kernel never splits K); its own options apart."""
    choice = mt.last_choice(a, b)
    config = TileConfig.from_dict(choice["config"])     # GROUP_M 8, SPLIT_K 1 where unsaid
    return {"tuned_kernel": choice["kernel"], "tuned_config": config.as_dict(mt.KEYS),
            "tuned_options": dict(config.options),
            "tuned_layout": choice.get("layout"),
            "candidates_ms": choice.get("candidates_ms")}


def shapes() -> tuple[list[dict], float]:
    """Every shape in both dtypes; also the seconds all first (tuning) calls took."""
    out, tuning_s = [], 0.0
    for dtype in DTYPES:
        for label, M, N, K in SHAPES:
            a, b = _inputs(M, N, K, dtype)
            start = time.perf_counter()
            c = mt.matmul_tuned(a, b)                       # tunes this bucket
            torch.cuda.synchronize()
            tuning_s += time.perf_counter() - start
            row = {"label": label, "M": M, "N": N, "K": K,
                   "dtype": "fp16" if dtype == torch.float16 else "bf16",
                   "tuned_error": _error(c, a, b),
                   "fixed_error": _error(mt.matmul_tuned(a, b, config=FIXED), a, b),
                   **_choice(a, b)}
            turns = bench.time_rounds({"torch": lambda: torch.matmul(a, b),
                                       "tuned": lambda: mt.matmul_tuned(a, b)}, rounds=ROUNDS)
            for name in ("torch", "tuned"):
                row[f"{name}_ms"], row[f"{name}_runs_ms"] = turns[name]["ms"], turns[name]["runs"]
            row["fixed_ms"] = bench.time_ms(lambda: mt.matmul_tuned(a, b, config=FIXED))
            row["tuned_vs_torch"] = row["torch_ms"] / row["tuned_ms"]
            row["tuned_vs_fixed"] = row["fixed_ms"] / row["tuned_ms"]
            row["tuned_tflops"] = bench.tflops(_flops(M, N, K), row["tuned_ms"])
            row["torch_tflops"] = bench.tflops(_flops(M, N, K), row["torch_ms"])
            out.append(row)
    return out, tuning_s


_CHILD = """
import sys, time, torch, helpers
from helpers.kernels.matmul import tuned as mt
from helpers.experiments.autotuning import SHAPES, DTYPES, FIXED, _inputs
fixed = sys.argv[1] == "fixed"
start = time.perf_counter()
for dtype in DTYPES:
    for _, M, N, K in SHAPES:
        a, b = _inputs(M, N, K, dtype)
        mt.matmul_tuned(a, b, config=FIXED if fixed else None)
torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def _child_seconds(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                          env=dict(os.environ), check=True)
    return float(done.stdout.strip().splitlines()[-1])


def _tuning_time(cold_s: float, repeats: int = 9) -> dict:
    """Cold (this process), then fresh processes in turn, tuned and untuned: the median
    of ``repeats`` each (one fresh process takes under a second, and varies by 20 %), and
    every run, pair by pair, for the median of the pairs' ratios
    (:func:`helpers.plots.autotuning.cached_over_untuned`)."""
    cached, untuned = [], []
    for _ in range(repeats):
        cached.append(_child_seconds("tuned"))
        untuned.append(_child_seconds("fixed"))
    return {"cold_s": cold_s, "cached_s": statistics.median(cached),
            "untuned_s": statistics.median(untuned), "cached_runs_s": cached,
            "untuned_runs_s": untuned,
            "note": "cold: first calls in this process (search and compile); cached and "
                    "untuned: medians over fresh processes on the same cache, in turn "
                    "(pairs of runs), imports excluded"}


def launch_overhead(calls: int = 2000) -> dict:
    M, N, K = OVERHEAD_SHAPE
    a, b = _inputs(M, N, K, torch.float16)
    c = mt.matmul_tuned(a, b)
    config = TileConfig.from_triton(mt.matmul_kernel_v6_tuned.best_config)

    def host_us(fn) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        return host / calls * 1e6

    mt.matmul_tuned(a, b, config=config)        # its first call, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = mt.matmul_tuned(a, b, config=config)
    return {"shape": list(OVERHEAD_SHAPE), "calls": calls,
            "gpu_us": bench.time_ms(lambda: mt.matmul_tuned(a, b, config=config)) * 1e3,
            "autotuned_us": host_us(lambda: mt.matmul_tuned(a, b)),
            "fixed_us": host_us(lambda: mt.matmul_tuned(a, b, config=config)),
            "torch_us": host_us(lambda: torch.matmul(a, b)),
            "graph_replay_us": host_us(graph.replay)}


def _guarded(part):
    """One part's result, or the error that stopped it (the other parts still run)."""
    try:
        return part()
    except Exception as error:
        return {"error": f"{type(error).__name__}: {str(error)[:500]}"}


@experiment("autotuning")
def autotuning() -> dict:
    shape_rows, tuning_s = shapes()
    return {
        "shapes": shape_rows,
        "tuning_time": _guarded(lambda: _tuning_time(tuning_s)),
        "heatmaps": _guarded(heatmaps),
        "launch_overhead": _guarded(launch_overhead),
        "space": [c.as_dict(mt.KEYS) for c in mt.CONFIG_SPACE],
        "fixed": FIXED.as_dict(mt.KEYS),
    }
