"""Lesson 01's measurements: what the memory wall looks like on the GPU in hand.

* ``ops``: a copy, an elementwise op (GELU), a reduction (row sum) and a matrix
  product, each timed side by side with PyTorch and turned into GB/s, TFLOP/s and
  fractions of the device's datasheet peaks.
* ``arithmetic_sweep``: a copy that does 0 to 1024 multiply-adds per element on the
  way through: how much arithmetic rides free on the bytes, and where it stops.
* ``copy_configs``: the copy kernel at several block sizes and warp counts.
* ``size_sweep``: the copy from 4 KiB to 1 GiB: where launch latency rules, where L2
  helps, where HBM bandwidth takes over.
* ``utilization``: what ``nvidia-smi`` calls utilization while a kernel that barely
  uses the arithmetic units runs back to back.
* ``fusion``: bias-add then GELU as two kernels versus one.
* ``device``: the device's own report (SMs, registers, shared memory, clocks), for
  the memory-hierarchy table.

Every buffer is filled with random numbers (not zeros) and every kernel's result is
checked against its reference before it is timed.
"""

from __future__ import annotations

import subprocess
import threading
import time

import torch
import triton
import triton.testing

from .. import bench, hardware, intensity
from ..dtypes import dtype_key
from ..kernels import memory_wall as mw
from . import experiment

STREAM_ELEMENTS = 2**28          # 1 GiB of fp32 per tensor: 8x the largest L2 in the table
ROW_SUM_SHAPE = (2**16, 2**12)   # the same 1 GiB, seen as 65536 rows of 4096
FUSION_SHAPE = (2**14, 2**14)    # the same 1 GiB again, as a 16384 x 16384 activation
MATMUL_N = 8192
COPY_BLOCKS = (512, 1024, 2048, 4096, 8192, 16384)
COPY_WARPS = (4, 8)
SWEEP_LOG2_ELEMENTS = range(10, 29)  # 4 KiB ... 1 GiB of fp32 per buffer
FMA_ELEMENTS = 2**26                 # 256 MiB of fp32 in, 256 MiB out: 4x the largest L2
FMA_ITERS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _device_report() -> dict:
    props = torch.cuda.get_device_properties(0)
    out = {name: getattr(props, name) for name in (
        "multi_processor_count", "L2_cache_size", "regs_per_multiprocessor",
        "shared_memory_per_multiprocessor", "shared_memory_per_block_optin",
        "max_threads_per_multi_processor", "warp_size", "total_memory") if hasattr(props, name)}
    try:  # Triton's driver also reports the clocks and the memory bus
        drv = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
        out.update({f"triton_{k}": v for k, v in drv.items() if isinstance(v, (int, float))})
    except Exception as err:  # noqa: BLE001 -- optional detail, never fatal
        out["triton_properties_error"] = repr(err)
    return out


def _check(got, want, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    if not torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol):
        err = (got.float() - want.float()).abs().max().item()
        raise AssertionError(f"{what} is wrong on the GPU: max error {err:.3g}")


def _op_entry(op: str, shape, dtype, comparison: bench.Comparison, peak_dtype: str) -> dict:
    return {"op": op, "shape": list(shape), "dtype": dtype_key(dtype),
            "peak_dtype": peak_dtype, "comparison": comparison.as_dict()}


def _measure_ops(x, y, spec) -> list[dict]:
    f32 = torch.float32
    n = x.numel()
    ops = []

    _check(mw.copy(x, out=y), x, "copy")
    cmp = bench.compare("copy, 1 GiB fp32", {
        "PyTorch (y.copy_(x))": lambda: y.copy_(x),
        "Triton copy_kernel": lambda: mw.copy(x, out=y),
    }, baseline="PyTorch (y.copy_(x))", nbytes=intensity.copy(n, f32).nbytes,
        gpu=spec, dtype="fp32")
    ops.append(_op_entry("copy", (n,), f32, cmp, "fp32"))

    _check(mw.gelu(x, out=y), mw.gelu_reference(x), "gelu")
    gelu_torch = torch.nn.functional.gelu
    cmp = bench.compare("GELU (tanh), 1 GiB fp32", {
        "PyTorch (F.gelu)": lambda: gelu_torch(x, approximate="tanh"),
        "Triton gelu_kernel": lambda: mw.gelu(x, out=y),
    }, baseline="PyTorch (F.gelu)", nbytes=intensity.gelu(n, f32).nbytes,
        flops=intensity.gelu(n, f32).flops, gpu=spec, dtype="fp32")
    ops.append(_op_entry("gelu", (n,), f32, cmp, "fp32"))

    m = x.view(ROW_SUM_SHAPE)
    _check(mw.row_sum(m), mw.row_sum_reference(m), "row_sum", atol=1e-3, rtol=1e-4)
    cmp = bench.compare("row sum, 65536 x 4096 fp32", {
        "PyTorch (x.sum(dim=1))": lambda: m.sum(dim=1),
        "Triton row_sum_kernel": lambda: mw.row_sum(m),
    }, baseline="PyTorch (x.sum(dim=1))", nbytes=intensity.row_sum(*ROW_SUM_SHAPE, f32).nbytes,
        flops=intensity.row_sum(*ROW_SUM_SHAPE, f32).flops, gpu=spec, dtype="fp32")
    ops.append(_op_entry("row_sum", ROW_SUM_SHAPE, f32, cmp, "fp32"))

    k = MATMUL_N
    a = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(k, k, device="cuda", dtype=torch.bfloat16)
    cmp = bench.compare(f"matmul {k}x{k}x{k} bf16", {
        "cuBLAS (torch.mm)": lambda: torch.mm(a, b, out=c),
    }, baseline="cuBLAS (torch.mm)", nbytes=3 * k * k * 2, flops=2 * k**3, gpu=spec,
        dtype="bf16")
    ops.append(_op_entry("matmul", (k, k, k), torch.bfloat16, cmp, "bf16"))
    return ops


def _copy_configs(x, y) -> list[dict]:
    out = []
    nbytes = intensity.copy(x.numel(), x.dtype).nbytes
    for block in COPY_BLOCKS:
        for warps in COPY_WARPS:
            if block // (32 * warps) < 1:
                continue
            mw.copy(x, block, warps, out=y)
            ms = bench.time_ms(lambda: mw.copy(x, block, warps, out=y))
            out.append({"block_size": block, "num_warps": warps, "ms": ms,
                        "gbps": bench.gbps(nbytes, ms)})
    return out


def _arithmetic_sweep(x, y) -> list[dict]:
    xs, ys = x[:FMA_ELEMENTS], y[:FMA_ELEMENTS]
    _check(mw.fma_chain(xs[:4096], 64), mw.fma_chain_reference(xs[:4096], 64), "fma_chain",
           atol=1e-5, rtol=1e-5)
    nbytes = intensity.fma_chain(FMA_ELEMENTS, 0, x.dtype).nbytes
    rows = []
    for iters in FMA_ITERS:
        ms = bench.time_ms(lambda: mw.fma_chain(xs, iters, out=ys))
        fl = intensity.fma_chain(FMA_ELEMENTS, iters, x.dtype).flops
        rows.append({"iters": iters, "ms": ms, "bytes": nbytes, "flops": fl,
                     "intensity": fl / nbytes, "gbps": bench.gbps(nbytes, ms),
                     "tflops": bench.tflops(fl, ms) if fl else 0.0})
    return rows


def _wall_us_per_call(fn, calls: int = 200) -> float:
    """Host clock around ``calls`` back-to-back calls: what a Python loop really pays."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _size_sweep(x, y) -> list[dict]:
    rows = []
    for log2 in SWEEP_LOG2_ELEMENTS:
        n = 2**log2
        xs, ys = x[:n], y[:n]
        fn = lambda: mw.copy(xs, out=ys)  # noqa: E731
        nbytes = intensity.copy(n, x.dtype).nbytes
        cold = bench.time_ms(fn, warmup_ms=10, rep_ms=50)       # L2 flushed before each run
        warm = float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
        wall = _wall_us_per_call(fn, calls=200 if n < 2**24 else 20)
        rows.append({"elements": n, "bytes": nbytes, "cold_ms": cold, "warm_ms": warm,
                     "wall_us_per_call": wall, "cold_gbps": bench.gbps(nbytes, cold),
                     "warm_gbps": bench.gbps(nbytes, warm)})
    return rows


def _read_utilization():
    """GPU utilization in percent, as NVML (and so nvidia-smi) reports it, or None."""
    try:
        return float(torch.cuda.utilization())
    except Exception:  # noqa: BLE001 -- NVML may be missing; fall back to nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0])
    except Exception:  # noqa: BLE001
        return None


def _utilization(x, y, gelu_ms: float, seconds: float = 3.0) -> dict:
    """Run the GELU kernel back to back for ``seconds`` while sampling utilization."""
    samples: list[float | None] = []
    stop = threading.Event()

    def sample():
        time.sleep(0.5)  # let the queue fill and the sampling window cover only the kernel
        while not stop.is_set():
            samples.append(_read_utilization())
            time.sleep(0.2)

    launches = max(1, int(seconds * 1e3 / gelu_ms))
    sampler = threading.Thread(target=sample, daemon=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    sampler.start()
    for _ in range(launches):
        mw.gelu(x, out=y)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    n = x.numel()
    achieved = intensity.gelu(n, x.dtype).flops * launches / elapsed / 1e12
    got = [s for s in samples if s is not None]
    return {"kernel": "gelu_kernel on 1 GiB fp32", "launches": launches, "seconds": elapsed,
            "samples_percent": got, "available": bool(got),
            "achieved_tflops": achieved,
            "achieved_gbps": intensity.gelu(n, x.dtype).nbytes * launches / elapsed / 1e9}


def _fusion(x, spec) -> dict:
    m = x.view(FUSION_SHAPE)
    bias = torch.randn(FUSION_SHAPE[1], device="cuda", dtype=x.dtype)
    tmp, out = torch.empty_like(m), torch.empty_like(m)
    want = mw.bias_gelu_reference(m, bias)
    _check(mw.bias_gelu_unfused(m, bias, tmp=tmp, out=out), want, "bias_gelu_unfused")
    _check(mw.bias_gelu_fused(m, bias, out=out), want, "bias_gelu_fused")
    del want
    gelu_torch = torch.nn.functional.gelu
    impls = {
        "PyTorch, 2 kernels (x + b, then F.gelu)": (
            lambda: gelu_torch(m + bias, approximate="tanh"), "unfused"),
        "Triton, 2 kernels": (
            lambda: mw.bias_gelu_unfused(m, bias, tmp=tmp, out=out), "unfused"),
        "Triton, 1 fused kernel": (
            lambda: mw.bias_gelu_fused(m, bias, out=out), "fused"),
    }
    work = {v: intensity.bias_gelu(*FUSION_SHAPE, x.dtype, version=v) for v in ("unfused", "fused")}
    rows = [bench.Measurement(name, bench.time_ms(fn), work[v].nbytes, work[v].flops)
            for name, (fn, v) in impls.items()]
    cmp = bench.Comparison("gelu(x + bias), 16384 x 16384 fp32", rows,
                           baseline="PyTorch, 2 kernels (x + b, then F.gelu)",
                           peak_gbps=spec.hbm_bandwidth_gbs if spec else None,
                           peak_tflops=spec.peak("fp32") if spec else None)
    return {"shape": list(FUSION_SHAPE), "dtype": "fp32", "comparison": cmp.as_dict()}


@experiment("memory_wall")
def memory_wall() -> dict:
    spec = hardware.current_gpu()
    torch.manual_seed(0)
    x = torch.randn(STREAM_ELEMENTS, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    ops = _measure_ops(x, y, spec)
    gelu_ms = min(r["ms"] for r in ops[1]["comparison"]["rows"])
    result = {
        "device": _device_report(),
        "ops": ops,
        "arithmetic_sweep": _arithmetic_sweep(x, y),
        "copy_configs": _copy_configs(x, y),
        "size_sweep": _size_sweep(x, y),
        "utilization": _utilization(x, y, gelu_ms),
        "fusion": _fusion(x, spec),
        "launch_defaults": {"block_size": mw.BLOCK_SIZE, "num_warps": mw.NUM_WARPS},
    }
    if spec is not None:
        result["table"] = {"key": spec.key, "hbm_bandwidth_gbs": spec.hbm_bandwidth_gbs,
                           "peak_tflops": dict(spec.peak_tflops)}
    return result
