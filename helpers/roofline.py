"""The roofline model: how fast an op *can* run on a GPU, from two numbers.

A kernel that does F floating-point operations while moving B bytes to and from DRAM
has arithmetic intensity I = F / B (FLOP/byte). The GPU can feed it at most
``bandwidth`` bytes per second and compute at most ``peak`` FLOP/s, so

    attainable FLOP/s = min(peak, I x bandwidth)

Below the *ridge point* I* = peak / bandwidth the kernel is memory-bound (the slope of
the roof), above it compute-bound (the flat roof). Each data type has its own roof, so
each has its own ridge point. Tiny problems hit a third limit, the few microseconds a
launch costs: they are latency-bound, and neither roof applies.

This module is the model alone, numbers in and numbers out, so that the napkin math, the
performance report and the graders can ask it without drawing anything; the chart of it
is :func:`helpers.plots.roofline.plot`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import GPUSpec

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

