"""The course's one cuBLAS reference per GPU, and how much a timing moves from run to run.

Lessons 01 to 05 each timed ``torch.matmul`` on their own, and the same product on the same
GPU read a few percent apart from lesson to lesson. That spread is the GPU, not the code:
an H100 runs its SMs as fast as its power limit allows, and a long run of tensor-core work
draws enough power that the GPU lowers its clock to stay under the limit. This experiment
measures the spread once, so every lesson can cite one reference and know what a
difference must exceed to mean something:

* **reference**: ``torch.matmul`` (cuBLAS) in bf16 at 8192^3, fp16 at 4096^3 and fp32 at
  4096^3 with TF32 off and on, each timed in ``rounds`` rounds of
  :func:`helpers.bench.time_ms` (median, cold L2), the products taken in turn in every round
  (A B C D, A B C D, ...). While each round runs, a sampler reads the SM clock and the
  power draw (``torch.cuda.clock_rate`` and ``power_draw`` where they work, else
  ``nvidia-smi``; ``None`` where neither does).
* **identical_configs**: one Triton configuration, lesson 04's TMA kernel (v5) at 4096^3
  fp16 with the setting its autotuner picks here, launched as two separate but identical
  callables in interleaved rounds: any difference between ``a`` and ``b`` is noise.
* **sustained**: bf16 8192^3 run back to back for a few seconds after the GPU idled, cut into
  short windows: throughput, clock and power as the GPU heats up and meets its power limit.

Every product is checked against an fp32 reference first (both modes, at a small size in
CPU mode), then timed (GPU only).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

import torch

from .. import bench, intensity, runtime
from ..dtypes import torch_dtype
from ..kernels import matmul as mm
from ..kernels.matmul.config import TileConfig
from . import experiment

REFERENCES = (                 # key, dtype, n, TF32 allowed
    ("bf16 8192^3", "bf16", 8192, False),
    ("fp16 4096^3", "fp16", 4096, False),
    ("fp32 4096^3", "fp32", 4096, False),
    ("tf32 4096^3", "fp32", 4096, True),
)
IDENTICAL_N = 4096
ROUNDS = 15
SAMPLE_S = 0.02                # the sampler's period while a round runs
SUSTAIN_KEY = "bf16 8192^3"
SUSTAIN_S = 6.0
WINDOW_S = 0.25
IDLE_S = 2.0                   # idle before the sustained run, so it starts cool
SMI_FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"

# On a CPU: every product checked at a small size (fp16 for bf16: the interpreter's bf16
# tl.dot is wrong), then NeedsGPUError at the first timing.
SMOKE = dict(sizes={"bf16 8192^3": 64, "fp16 4096^3": 64, "fp32 4096^3": 64,
                    "tf32 4096^3": 64}, identical_n=64, rounds=1, sustain_s=0.0)


# --------------------------------------------------------------------------------------
# The GPU's clock and power (None wherever they cannot be read).
# --------------------------------------------------------------------------------------


def _float(text):
    try:
        return float(str(text).strip())
    except (TypeError, ValueError):
        return None


def parse_smi(line: str) -> dict:
    """One line of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``."""
    values = [_float(v) for v in line.split(",")] + [None] * 5
    return dict(zip(("sm_clock_mhz", "max_sm_mhz", "power_w", "power_limit_w",
                     "temperature_c"), values[:5]))


def smi() -> dict:
    """The GPU's clocks, power and temperature from nvidia-smi (all None without it)."""
    tool = shutil.which("nvidia-smi")
    if tool:
        try:
            done = subprocess.run([tool, f"--query-gpu={SMI_FIELDS}",
                                   "--format=csv,noheader,nounits", "-i", "0"],
                                  capture_output=True, text=True, timeout=10)
            if done.returncode == 0 and done.stdout.strip():
                return parse_smi(done.stdout.strip().splitlines()[0])
        except (OSError, subprocess.SubprocessError):
            pass
    return parse_smi("")


_TORCH_READERS = [True]       # torch's NVML readers work here (until they fail once)


def read_now() -> dict:
    """SM clock (MHz) and power (W) now: torch's NVML readers if they work, else nvidia-smi."""
    if _TORCH_READERS[0]:
        try:
            return {"sm_clock_mhz": float(torch.cuda.clock_rate()),
                    "power_w": float(torch.cuda.power_draw()) / 1000}    # NVML reports mW
        except Exception:  # noqa: BLE001 -- pynvml missing or unsupported: ask the tool
            _TORCH_READERS[0] = False
    s = smi()
    return {"sm_clock_mhz": s["sm_clock_mhz"], "power_w": s["power_w"]}


class Sampler:
    """Reads clock and power every ``period`` seconds in a thread while a ``with`` block runs;
    ``.mean`` then holds their averages (None if nothing could be read)."""

    def __init__(self, period: float = SAMPLE_S, read=read_now):
        self.period, self.read, self.samples = period, read, []
        self._stop = threading.Event()

    def _loop(self):
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> dict:
        out = {}
        for key in ("sm_clock_mhz", "power_w"):
            got = [s[key] for s in self.samples if s.get(key) is not None]
            out[key] = statistics.fmean(got) if got else None
        return out


# --------------------------------------------------------------------------------------
# Statistics of rounds (pure: tested without a GPU).
# --------------------------------------------------------------------------------------


def stats(rounds: list[dict]) -> dict:
    """Median, least and most TFLOP/s over the rounds, and the rounds themselves."""
    t = [r["tflops"] for r in rounds]
    return {"tflops_median": statistics.median(t), "tflops_min": min(t), "tflops_max": max(t),
            "spread": (max(t) - min(t)) / statistics.median(t), "rounds": rounds}


# --------------------------------------------------------------------------------------
# The products, checked, then timed.
# --------------------------------------------------------------------------------------


def _inputs(n: int, dtype: str, seed: int = 0):
    dev = runtime.device()
    g = torch.Generator(device=dev).manual_seed(seed)
    dt = torch_dtype(dtype)
    return (torch.randn(n, n, device=dev, generator=g).to(dt),
            torch.randn(n, n, device=dev, generator=g).to(dt))


def _matmul(a, b, tf32: bool):
    """torch.matmul of ``a`` and ``b``; fp32 with TF32 tensor cores only when ``tf32``."""
    def fn():
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        try:
            return torch.matmul(a, b)
        finally:
            torch.set_float32_matmul_precision(before)
    return fn


def _check(c, a, b, what: str) -> None:
    ref = torch.matmul(a.double(), b.double())
    err = ((c.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{what} is wrong: relative error {err:.3g}")


def _v5_config(a, b) -> TileConfig | None:
    """The setting v5's autotuner picks for these inputs (GPU), as matmul_v5's ``config``."""
    if runtime.is_cpu():
        return None
    mm.matmul_v5(a, b)
    want = (a.shape[0], b.shape[1], a.shape[1])
    for key, cfg in mm.matmul_kernel_v5_tuned[a.dtype].cache.items():
        if tuple(key[:3]) == want:
            config = TileConfig.from_triton(cfg)
            return config.with_options(EPILOGUE_SPLIT=bool(config.option("EPILOGUE_SPLIT")))
    raise RuntimeError("v5's autotuner kept no setting for this shape")


def _round(fn, flops: float) -> dict:
    with Sampler() as s:
        ms = bench.time_ms(fn)
    return {"ms": ms, "tflops": bench.tflops(flops, ms), **s.mean}


def _sustained(fn, flops: float, seconds: float) -> list[dict]:
    ms = bench.time_ms(fn)
    per_window = max(1, int(WINDOW_S * 1e3 / ms))
    torch.cuda.synchronize()
    time.sleep(IDLE_S)
    windows, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with Sampler() as s:
            start.record()
            for _ in range(per_window):
                fn()
            end.record()
            end.synchronize()
        w_ms = start.elapsed_time(end) / per_window
        windows.append({"t_s": round(time.perf_counter() - t0, 3), "ms": w_ms,
                        "tflops": bench.tflops(flops, w_ms), **s.mean})
    return windows


@experiment("noise")
def noise(sizes=None, identical_n: int = IDENTICAL_N, rounds: int = ROUNDS,
          sustain_s: float = SUSTAIN_S, smoke: bool = False) -> dict:
    """cuBLAS's reference TFLOP/s per dtype with its spread over rounds, the spread of two
    identical Triton launches, clocks and power (about 40 s on an H100)."""
    if smoke:
        return noise(**SMOKE)
    start = time.perf_counter()
    sizes = sizes or {key: n for key, _, n, _ in REFERENCES}
    cpu = runtime.is_cpu()
    fns, flops = {}, {}
    for key, dtype, _, tf32 in REFERENCES:
        n = sizes[key]
        a, b = _inputs(n, "fp16" if cpu and dtype == "bf16" else dtype)
        fns[key], flops[key] = _matmul(a, b, tf32), intensity.matmul(n, n, n).flops
        _check(fns[key](), a, b, f"torch.matmul {key}")
    a, b = _inputs(identical_n, "fp16", seed=1)
    config = _v5_config(a, b)
    same = {"a": lambda: mm.matmul_v5(a, b, config=config),
            "b": lambda: mm.matmul_v5(a, b, config=config)}
    for name, fn in same.items():
        _check(fn(), a, b, f"v5 (identical launch {name})")

    runtime.require_gpu("timing run-to-run noise")    # everything above ran on a CPU too
    per_round = {key: [] for key in [*fns, *same]}
    f_same = intensity.matmul(identical_n, identical_n, identical_n).flops
    for _ in range(rounds):
        for key, fn in fns.items():
            per_round[key].append(_round(fn, flops[key]))
        for key, fn in same.items():
            per_round[key].append(_round(fn, f_same))
    s = smi()
    out = {"reference": {key: {**stats(per_round[key]), "n": sizes[key]} for key in fns},
           "identical_configs": {
               "config": {"rung": "v5", "label": "v5 TMA, persistent", "n": identical_n,
                          "dtype": "fp16",
                          "setting": config.as_dict(mm.TMA_CONFIG_KEYS) if config else {}},
               "a": stats(per_round["a"]), "b": stats(per_round["b"])},
           "clocks": {"max_sm_mhz": s["max_sm_mhz"], "power_limit_w": s["power_limit_w"],
                      "temperature_c_after": s["temperature_c"],
                      "reader": "torch.cuda (NVML)" if _TORCH_READERS[0] else
                      "nvidia-smi" if shutil.which("nvidia-smi") else None},
           "rounds": rounds}
    if sustain_s > 0:
        out["sustained"] = {"key": SUSTAIN_KEY, "idle_s": IDLE_S, "window_s": WINDOW_S,
                            "windows": _sustained(fns[SUSTAIN_KEY], flops[SUSTAIN_KEY],
                                                  sustain_s)}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out
