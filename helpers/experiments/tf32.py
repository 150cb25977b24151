"""Lesson 04's TF32 measurement, redone: fp32 inputs on the tensor cores, set up fairly.

The ``tiling`` record timed ``torch.matmul`` on fp32 with TF32 *off* (PyTorch's default
multiplies fp32 in full precision) and Triton's TF32 with one configuration borrowed from
fp16, which reached 17 % of the TF32 peak. Here, at 4096^3:

* ``torch.matmul`` in full fp32 and with TF32 on (``torch.set_float32_matmul_precision
  ("high")``, which is what ``allow_tf32 = True`` sets);
* ``tl.dot`` in TF32 (lesson 04's :func:`~helpers.kernels.matmul.matmul_v3`) at a sweep of
  tile configurations, each with B row-major (as lesson 04 stores it) and with B
  column-major (a transposed view of a contiguous ``N x K`` matrix, so each column of B,
  the K axis, is contiguous in memory);
* ``tl.dot`` in true fp32 (``precision="ieee"``) at lesson 04's configuration.

Every version's result is checked against an fp64 product before it is timed (its relative
error is recorded); times are medians of ``repeats`` rounds of :func:`helpers.bench.time_ms`
taken in turn, with their range.
"""

from __future__ import annotations

import time

import torch

from .. import bench, hardware, intensity, runtime
from ..kernels import matmul as mm
from ..kernels.matmul.config import TileConfig
from . import experiment
from .tiling import LAUNCH_KEYS as KEYS  # how the record writes a setting
from .tiling import TF32_CONFIG

N = 4096
REPEATS = 3
# fp32 tiles take twice the SRAM of fp16 ones: 128 x 256 x 32 is 48 KiB a stage, 128 x 128
# x 64 is 64 KiB. GROUP_M is 8 throughout.
CONFIGS = (
    TF32_CONFIG,                      # lesson 04's: 128 x 128 x 32, 3 stages, 4 warps
    TileConfig(128, 128, 32, num_stages=4, num_warps=8),
    TileConfig(128, 256, 32, num_stages=3, num_warps=8),
    TileConfig(256, 128, 32, num_stages=3, num_warps=8),
    TileConfig(128, 128, 64, num_stages=3, num_warps=8),
    TileConfig(128, 256, 64, num_stages=2, num_warps=8),
)
LAYOUTS = ("row-major B", "column-major B")
# The interpreter computes in fp32 whatever it is asked: the smoke run checks every version
# on a small product, then stops at the first timing.
SMOKE = dict(n=64, configs=tuple(TileConfig(bm, 32, 32, group_m=2, num_stages=1, num_warps=4)
                                 for bm in (32, 64)), repeats=1)
# A wrong kernel is off by O(1); TF32 by about 1e-3 relative; true fp32 by about 1e-6.
MAX_REL_ERROR = {"tf32": 1e-2, "ieee": 1e-4}


def rel_error(c: torch.Tensor, exact: torch.Tensor) -> float:
    return ((c.double() - exact).norm() / exact.norm()).item()


def best(rows: list[dict], layout: str | None = None) -> dict:
    """The fastest Triton TF32 row (of one B layout, if given)."""
    mine = [r for r in rows if r["kind"] == "triton tf32" and layout in (None, r["layout"])]
    if not mine:
        raise ValueError(f"no Triton TF32 rows{' for ' + layout if layout else ''}")
    return min(mine, key=lambda r: r["ms"])


def _versions(a, b, b_cols, configs) -> dict:
    """name -> (fn, row fields). Closures over the inputs; nothing runs here."""
    out = {}

    def torch_mm(precision):
        def fn():
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision)
            try:
                return torch.matmul(a, b)
            finally:
                torch.set_float32_matmul_precision(before)
        return fn

    out["torch.matmul, full fp32 (allow_tf32=False)"] = (
        torch_mm("highest"), {"kind": "torch", "allow_tf32": False})
    out["torch.matmul, TF32 (allow_tf32=True)"] = (
        torch_mm("high"), {"kind": "torch", "allow_tf32": True})
    out["tl.dot true fp32 (ieee), lesson 04's config"] = (
        lambda: mm.launch_v3(a, b, TF32_CONFIG, precision="ieee"),
        {"kind": "triton ieee", "layout": LAYOUTS[0], "config": TF32_CONFIG.as_dict(KEYS)})
    for layout, bb in zip(LAYOUTS, (b, b_cols)):
        for cfg in configs:
            name = (f"tl.dot TF32, {layout}, {cfg.block_m}x{cfg.block_n}x{cfg.block_k}"
                    f" g{cfg.group_m} s{cfg.num_stages} w{cfg.num_warps}")
            out[name] = (lambda bb=bb, cfg=cfg: mm.launch_v3(a, bb, cfg, precision="tf32"),
                         {"kind": "triton tf32", "layout": layout, "config": cfg.as_dict(KEYS),
                          "lesson_config": cfg == TF32_CONFIG})
    return out


def _check(versions: dict, exact) -> tuple[dict, dict]:
    """Every version's relative error; refuse a wrong one before anything is timed. A tile
    configuration the compiler cannot fit (too much shared memory) is set aside with its
    error, not fatal: ``(errors, failures)``."""
    errors, failures = {}, {}
    for name, (fn, info) in versions.items():
        try:
            c = fn()
        except Exception as err:  # noqa: BLE001 - e.g. OutOfResources for a large tile
            if info["kind"] != "triton tf32":
                raise
            failures[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            continue
        err = rel_error(c, exact)
        limit = MAX_REL_ERROR["ieee" if info.get("allow_tf32") is False or
                              info["kind"] == "triton ieee" else "tf32"]
        if runtime.is_cpu():      # the interpreter and a CPU matmul are true fp32 throughout
            limit = MAX_REL_ERROR["ieee"]
        if not err < limit:
            raise AssertionError(f"{name} is wrong: relative error {err:.3g} (limit {limit:g})")
        errors[name] = err
    return errors, failures


@experiment("tf32")
def tf32(n: int = N, configs=CONFIGS, repeats: int = REPEATS, smoke: bool = False) -> dict:
    """fp32 matmuls on tensor cores and CUDA cores, fairly configured (about 40 s on an H100)."""
    if smoke:
        return tf32(**SMOKE)
    start = time.perf_counter()
    dev = runtime.device()
    g = torch.Generator(device=dev).manual_seed(2)
    a = torch.randn(n, n, device=dev, generator=g)
    b = torch.randn(n, n, device=dev, generator=g)
    b_cols = b.t().contiguous().t()            # the same values, K contiguous
    exact = torch.matmul(a.double(), b.double())
    versions = _versions(a, b, b_cols, configs)
    errors, failures = _check(versions, exact)
    del exact
    failed = [{"name": k, **versions.pop(k)[1], "error": why} for k, why in failures.items()]

    runtime.require_gpu("timing fp32 matmuls")   # everything above ran on a CPU too
    times = bench.time_rounds({k: fn for k, (fn, _) in versions.items()}, repeats)
    flops = intensity.matmul(n, n, n).flops
    rows = [{"name": k, **info, **times[k], "rel_error": errors[k],
             "tflops": bench.tflops(flops, times[k]["ms"])}
            for k, (_, info) in versions.items()]
    spec = hardware.current_gpu()
    return {"n": n, "repeats": repeats, "rows": rows, "failed": failed,
            "lesson_config": TF32_CONFIG.as_dict(KEYS),
            "peak_tflops": {k: spec.peak(k) for k in ("fp32", "tf32")} if spec else None,
            "torch_default_precision": torch.get_float32_matmul_precision(),
            "seconds": round(time.perf_counter() - start, 1)}
