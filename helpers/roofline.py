"""The roofline model: how fast an op *can* run on a GPU, from two numbers.

A kernel that does F floating-point operations while moving B bytes to and from DRAM
has arithmetic intensity I = F / B (FLOP/byte). The GPU can feed it at most
``bandwidth`` bytes per second and compute at most ``peak`` FLOP/s, so

    attainable FLOP/s = min(peak, I x bandwidth)

Below the *ridge point* I* = peak / bandwidth the kernel is memory-bound (the slope of
the roof), above it compute-bound (the flat roof). Each data type has its own roof, so
each has its own ridge point. Tiny problems hit a third limit, the few microseconds a
launch costs: they are latency-bound, and neither roof applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import dtype_key
from .hardware import GPUSpec
from .plots import add_source

# A kernel launch plus the time for the GPU to start and retire its first wave of
# blocks is a few microseconds on current GPUs; lessons measure it (helpers.experiments).
DEFAULT_LAUNCH_US = 0.0


def attainable_tflops(intensity: float, gpu: GPUSpec, dtype) -> float:
    """The roof at ``intensity`` FLOP/byte: min(peak, intensity x bandwidth), TFLOP/s."""
    if intensity <= 0:
        raise ValueError(f"intensity must be positive FLOP/byte, got {intensity}")
    return min(gpu.peak(dtype), intensity * gpu.hbm_bandwidth_gbs / 1e3)


def bound(intensity: float, gpu: GPUSpec, dtype) -> str:
    """``"memory"`` left of the ridge point, ``"compute"`` at or right of it."""
    return "memory" if intensity < gpu.ridge_point(dtype) else "compute"


def predicted_time_ms(flops: float, nbytes: float, gpu: GPUSpec, dtype,
                      launch_us: float = DEFAULT_LAUNCH_US) -> float:
    """The roofline's lower bound on run time: the slower of moving and computing.

    ``launch_us`` adds a fixed launch cost, which dominates small problems.
    """
    if flops < 0 or nbytes < 0:
        raise ValueError("flops and bytes must be non-negative")
    memory_ms = nbytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
    compute_ms = flops / (gpu.peak(dtype) * 1e12) * 1e3 if flops else 0.0
    return max(memory_ms, compute_ms) + launch_us * 1e-3


@dataclass(frozen=True)
class Point:
    """A kernel placed on the roofline: its intensity and the TFLOP/s it reached."""

    label: str
    intensity: float
    tflops: float
    source: str = ""


def plot(gpu: GPUSpec, dtypes=("fp32", "bf16"), points=(), ax=None, title: str | None = None,
         source: str | None = None, xlim=(1 / 16, 4096)):
    """Draw ``gpu``'s roofline for each dtype, its ridge points, and measured ``points``.

    ``source`` names where the points came from (a record's label); it is written on
    the figure so a picture never travels without its provenance.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    x = np.geomspace(xlim[0], xlim[1], 400)
    memory_roof = x * gpu.hbm_bandwidth_gbs / 1e3
    ax.plot(x, memory_roof, color="0.4", lw=1, ls=":",
            label=f"memory slope: {gpu.hbm_bandwidth_gbs:,.0f} GB/s")
    for i, dt in enumerate(dtypes):
        key = dtype_key(dt)
        if key not in gpu.peak_tflops:
            continue
        colour = f"C{i}"
        peak = gpu.peak(key)
        ridge = gpu.ridge_point(key)
        ax.plot(x, np.minimum(peak, memory_roof), color=colour, lw=2,
                label=f"{key} roof: {peak:,.0f} TFLOP/s, ridge {ridge:.0f} FLOP/B")
        ax.plot([ridge], [peak], "o", color=colour, ms=5)
    for j, p in enumerate(points):
        ax.plot([p.intensity], [p.tflops], marker="s", ls="none", color=f"C{(j + 3) % 10}",
                ms=7, label=f"{p.label}: {p.tflops:.3g} TFLOP/s at {p.intensity:.3g} FLOP/B")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(*xlim)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable throughput (TFLOP/s)")
    ax.set_title(title or f"Roofline of the {gpu.name} (datasheet peaks)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    if source:
        add_source(ax, source)
    return ax
