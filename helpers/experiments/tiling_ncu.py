"""Lesson 04's ladder under Nsight Compute: what each rung asks of DRAM, L2 and the tensor cores.

Lesson 04 explains each rung's speed-up by a cause: tiles cut DRAM traffic, the grouped
order keeps B in L2, pipelining and more warps keep the tensor cores busy. Timings alone
cannot tell those apart; the GPU's hardware counters can. This experiment profiles one
launch of every rung of :data:`helpers.experiments.tiling.STEPS` (the same names and launch
options as the ``tiling`` record's ladder) and of ``torch.matmul`` (cuBLAS) at 4096^3 fp16
with ``ncu`` (Nsight Compute), and keeps the metrics of :data:`METRICS`: the kernel's time,
DRAM, L2 and SM throughput as a fraction of their peaks, tensor-pipe activity, achieved
occupancy and what limits it, registers and shared memory, and the bytes DRAM really moved.

Each rung runs in its own process under ``ncu`` (a small driver script written to a
temporary folder): the driver warms the rung up (compiling, autotuning) and then brackets
one launch with ``cudaProfilerStart``/``Stop``; ncu, started with ``--profile-from-start
off``, profiles the first launch inside that range whose name matches the rung's kernel
(``--launch-skip`` counts launches inside the range, so it is 0). ``--clock-control none``
leaves the clocks as they run in a lesson instead of locking them to base clock.

A machine without ``ncu``, or whose driver does not let users read the counters
(``ERR_NVGPUCTRPERM``), gives a record that says so (``available: false`` and the reason)
instead of an error. Metrics the installed ncu does not know are dropped after the first
attempt and recorded as ``null``; the record lists what was asked and what came back.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import runtime
from ..kernels import matmul as mm
from . import experiment
from .tiling import STEPS

N = 4096
DTYPE = "fp16"
WARMUP = 3
TIMEOUT_S = 100
CUBLAS = ("cublas", "torch.matmul (cuBLAS)", "cublas", {})
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    # Hopper's wgmma may count under these instead of hmma: ask for all three
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    # The SM clock while the kernel ran (--clock-control none: as a lesson runs it). A pipe's
    # "% of peak" counts cycles, so its FLOP/s at 100 % is this clock times the FLOPs an SM
    # does a cycle, not the datasheet's peak at the boost clock.
    "sm__cycles_elapsed.avg.per_second",
)
# The kernel each rung launches (a regular expression over kernel names); cuBLAS's kernel
# names change with its version, so its rung takes the first kernel of the range.
KERNELS = {"v1": "matmul_kernel_v1", "v2": "matmul_kernel_v2", "v3": "matmul_kernel_v3",
           "v4": "matmul_kernel_v3", "v5": "matmul_kernel_v5", "best": "matmul", "cublas": None}
# Units ncu may print despite --print-units base, scaled to the base unit.
SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1, "usecond": 1e3,
         "msecond": 1e6, "second": 1e9, "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
         "cycle/second": 1, "cycle/usecond": 1e6, "cycle/nsecond": 1e9}

# On a CPU: every rung's launch checked in the interpreter at this size, then NeedsGPUError.
SMOKE = dict(n=64)

DRIVER = '''\
import sys
import helpers
from helpers.experiments import tiling_ncu
tiling_ncu.drive(sys.argv[1], int(sys.argv[2]), sys.argv[3])
'''


# --------------------------------------------------------------------------------------
# One rung: its launch (the driver runs it under ncu; CPU mode checks it in-process).
# --------------------------------------------------------------------------------------


def rungs() -> list[tuple]:
    """(key, label, version, options) of every rung, the ladder's then cuBLAS."""
    return [*STEPS, CUBLAS]


def launcher(rung: str):
    _, _, version, options = {r[0]: r for r in rungs()}[rung]
    if version == "cublas":
        return torch.matmul
    fn = mm.matmul if version == "best" else mm.VERSIONS[version]
    return lambda a, b: fn(a, b, **options)


def inputs(n: int, dtype: str = DTYPE):
    from ..dtypes import torch_dtype

    g = torch.Generator(device=runtime.device()).manual_seed(0)
    a = torch.randn(n, n, device=runtime.device(), generator=g).to(torch_dtype(dtype))
    b = torch.randn(n, n, device=runtime.device(), generator=g).to(torch_dtype(dtype))
    return a, b


def check(rung: str, n: int, dtype: str = DTYPE) -> float:
    """Relative error of the rung's product against fp32 ``torch.matmul``; refuse a wrong one."""
    a, b = inputs(n, dtype)
    ref = torch.matmul(a.float(), b.float())
    err = ((launcher(rung)(a, b).float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"rung {rung} is wrong at n={n}: relative error {err:.3g}")
    return err


def drive(rung: str, n: int, dtype: str = DTYPE) -> None:
    """The driver's body: warm the rung up, then one launch inside a profiler range."""
    a, b = inputs(n, dtype)
    fn = launcher(rung)
    for _ in range(WARMUP):
        fn(a, b)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn(a, b)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# --------------------------------------------------------------------------------------
# ncu: the command, its CSV, its errors (pure parts tested without a GPU).
# --------------------------------------------------------------------------------------


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/ncu")
    return str(default) if default.exists() else None


def command(ncu: str, metrics, kernel: str | None, driver: str, rung: str, n: int,
            dtype: str) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
           "--profile-from-start", "off", "--metrics", ",".join(metrics),
           "--launch-skip", "0", "--launch-count", "1"]
    if kernel:
        cmd += ["-k", f"regex:{kernel}"]
    return cmd + [sys.executable, driver, rung, str(n), dtype]


def _number(text: str, unit: str) -> float | None:
    text = text.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value * SCALE.get(unit.strip(), 1)


def parse_csv(text: str, metrics) -> list[dict]:
    """The kernels of ncu's ``--csv --page raw`` output: ``[{"kernel", "metrics", "units"}]``.

    The layout: a header row (``"ID","Process ID",...,"Kernel Name",...`` then one column
    per metric), a row of units, then one row per profiled kernel. Lines ncu or the program
    printed around the table (``==PROF==`` ...) are skipped. Numbers lose their thousands
    separators and are scaled to the base unit (bytes, nanoseconds); a metric missing from
    the table, or not a number, is ``None``.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"') and '"Kernel Name"' in line), None)
    if start is None:
        return []
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(table))
    header, units, body = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for row in body:
        if len(row) < len(header):
            continue
        unit = {m: units[col[m]] if m in col and col[m] < len(units) else "" for m in metrics}
        out.append({"kernel": row[col["Kernel Name"]],
                    "metrics": {m: _number(row[col[m]], unit[m]) if m in col else None
                                for m in metrics},
                    "units": {m: unit[m] for m in metrics if m in col}})
    return out


def rejected_metrics(output: str, metrics) -> list[str]:
    """The metrics ncu refused (``==ERROR== Failed to find metric ...``)."""
    errors = "\n".join(line for line in output.splitlines() if "ERROR" in line)
    return [m for m in metrics if m in errors]


def unavailable_reason(output: str, returncode: int) -> str | None:
    """Why ncu profiled nothing: the counters are not permitted, or the first error line."""
    if "ERR_NVGPUCTRPERM" in output:
        return "ERR_NVGPUCTRPERM: counters not permitted"
    if returncode != 0 or "==ERROR==" in output:
        first = next((line for line in output.splitlines() if "==ERROR==" in line), None)
        return (first or f"ncu exited with status {returncode}").strip()[:300]
    return None


def _run(cmd, env) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        return 124, f"==ERROR== timed out after {TIMEOUT_S} s\n{err.stdout or ''}"
    return done.returncode, (done.stdout or "") + "\n" + (done.stderr or "")


def collect(ncu: str | None, steps, n, dtype: str, run=_run, workdir: str | None = None, *,
            driver_source: str = DRIVER, kernels: dict | None = None, metrics=METRICS,
            shape: list | None = None) -> dict:
    """Profile every rung of ``steps`` with ``ncu``; ``run(cmd, env) -> (status, output)``.

    Another experiment profiles its own rungs through the same steps: its ``driver_source``
    (run as ``driver.py RUNG N DTYPE``, ``n`` passed as text), the kernel name of each
    rung (``kernels``), its ``metrics`` and the ``shape`` it records."""
    asked = list(metrics)
    kernels = KERNELS if kernels is None else kernels
    out = {"available": False, "reason": None, "ncu_version": None,
           "shape": shape or [n, n, n],
           "dtype": dtype, "metrics_asked": asked, "metrics_returned": [], "rows": []}
    if ncu is None:
        out["reason"] = "ncu not found"
        return out
    status, version = run([ncu, "--version"], None)
    out["ncu_version"] = version.strip().splitlines()[-1] if status == 0 and version.strip() \
        else None
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TRITON_CACHE_AUTOTUNING": "1",
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    metrics = list(asked)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        driver = str(Path(tmp) / "driver.py")
        Path(driver).write_text(driver_source)
        # cuBLAS first: it compiles and tunes nothing, so finding the metrics this ncu
        # refuses costs the least there. The rows keep the ladder's order.
        order = sorted(steps, key=lambda s: s[0] != "cublas")
        for key, label, _, _ in order:
            for _ in range(len(asked)):       # drop the metrics this ncu refuses, then retry
                # lesson 04's rungs without their own name launch v3; another
                # experiment names every kernel it profiles
                kernel = kernels.get(key, KERNELS["v3"]) if kernels is KERNELS else kernels[key]
                status, text = run(command(ncu, metrics, kernel, driver, key, n, dtype), env)
                refused = rejected_metrics(text, metrics) if status != 0 else []
                if not refused or len(refused) == len(metrics):
                    break
                metrics = [m for m in metrics if m not in refused]
            found = parse_csv(text, asked)
            if not found:
                reason = unavailable_reason(text, status) or "ncu printed no kernel table"
                if reason.startswith("ERR_NVGPUCTRPERM"):   # no rung will do better
                    out["reason"] = reason
                    return out
                out["reason"] = out["reason"] or reason
                out["rows"].append({"rung": key, "label": label, "kernel": None,
                                    "metrics": {m: None for m in asked}, "error": reason})
                continue
            out["rows"].append({"rung": key, "label": label, "kernel": found[0]["kernel"][:120],
                                "metrics": found[0]["metrics"], "units": found[0]["units"]})
    rank = {s[0]: i for i, s in enumerate(steps)}
    out["rows"].sort(key=lambda r: rank[r["rung"]])
    out["metrics_returned"] = [m for m in asked
                               if any(r["metrics"].get(m) is not None for r in out["rows"])]
    out["available"] = any(r["kernel"] for r in out["rows"])
    if out["available"]:
        out["reason"] = None
    elif out["reason"] is None:
        out["reason"] = "no rung could be profiled"
    return out


@experiment("tiling_ncu")
def tiling_ncu(n: int = N, dtype: str = DTYPE, steps=None, smoke: bool = False) -> dict:
    """Nsight Compute metrics of every rung of lesson 04's ladder and of cuBLAS (about 90 s)."""
    if smoke:
        return tiling_ncu(**SMOKE)
    start = time.perf_counter()
    chosen = [r for r in rungs() if steps is None or r[0] in steps]
    for key, *_ in chosen:            # the same launch, checked here first (both modes)
        check(key, min(n, 1024), dtype)
    runtime.require_gpu("profiling with Nsight Compute")
    out = collect(find_ncu(), chosen, n, dtype)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

