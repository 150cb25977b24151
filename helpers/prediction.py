"""From napkin math to a prediction: which limit binds, and how long an op must take.

:mod:`helpers.intensity` counts an op's FLOPs and DRAM bytes (a :class:`~helpers.intensity.Work`);
here they meet one GPU's datasheet (:mod:`helpers.hardware`). Bytes over the peak
bandwidth is the memory time, FLOPs over the peak throughput the compute time, and a
measured launch cost the floor under both: the roofline's lower bound, split by cause.
The catalogue at the bottom makes each op a function of one size knob, for widgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import intensity, roofline
from .dtypes import dtype_key
from .hardware import GPUSpec
from .intensity import Work

BOUNDS = ("memory", "compute", "latency")


@dataclass(frozen=True)
class Prediction:
    """The roofline's lower bound on an op's time on one GPU, split by cause.

    ``memory_ms``: bytes / peak bandwidth. ``compute_ms``: FLOPs / peak FLOP/s of the
    roof that applies. ``launch_ms``: the fixed cost of starting a kernel, measured.
    The op takes at least ``launch + max(memory, compute)``; the *bound* is whichever
    of the three terms is largest.
    """

    work: Work
    gpu: GPUSpec
    peak_dtype: str
    memory_ms: float
    compute_ms: float
    launch_ms: float

    @property
    def time_ms(self) -> float:
        return roofline.predicted_time_ms(self.work.flops, self.work.nbytes, self.gpu,
                                          self.peak_dtype, launch_us=self.launch_ms * 1e3)

    @property
    def bound(self) -> str:
        biggest = max(self.memory_ms, self.compute_ms, self.launch_ms)
        if biggest == self.launch_ms and self.launch_ms > 0:
            return "latency"
        return "memory" if self.memory_ms >= self.compute_ms else "compute"

    @property
    def tflops(self) -> float:
        """The throughput this prediction implies, launch cost included."""
        return self.work.flops / (self.time_ms * 1e-3) / 1e12

    def describe(self) -> str:
        return (f"{self.work.op} on {self.gpu.name} ({self.peak_dtype} roof): "
                f"memory {self.memory_ms:.3g} ms, compute {self.compute_ms:.3g} ms, "
                f"launch {self.launch_ms:.3g} ms -> at least {self.time_ms:.3g} ms, "
                f"{self.bound}-bound")


def predict(work: Work, gpu: GPUSpec, launch_us: float = 0.0,
            peak_dtype: str | None = None) -> Prediction:
    """Predict ``work`` on ``gpu``; ``launch_us`` is a measured launch cost (microseconds)."""
    if launch_us < 0:
        raise ValueError(f"launch_us must be >= 0, got {launch_us}")
    peak_dtype = dtype_key(peak_dtype or work.peak_dtype)
    memory_ms = work.nbytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
    compute_ms = work.flops / (gpu.peak(peak_dtype) * 1e12) * 1e3
    return Prediction(work, gpu, peak_dtype, memory_ms, compute_ms, launch_us * 1e-3)


# --------------------------------------------------------------------------------------
# A catalogue for widgets and tables: each op as a function of one size knob.
# --------------------------------------------------------------------------------------

# Fixed dimensions for the one-knob versions below: 4096-wide rows (a typical hidden
# size) and attention with 32 heads of dimension 128 per batch.
ROW_WIDTH = 4096
ATTENTION_HEADS = 32
HEAD_DIM = 128


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    size_label: str
    make: Callable[[int, str], Work]
    log2_range: tuple[int, int]  # sensible sizes: 2**lo .. 2**hi
    log2_default: int


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e for e in (
        CatalogueEntry("vector add", "n (elements)", lambda n, dt: intensity.vector_add(n, dt),
                       (10, 30), 28),
        CatalogueEntry("axpy", "n (elements)", lambda n, dt: intensity.axpy(n, dt), (10, 30), 28),
        CatalogueEntry("softmax", f"rows (of {ROW_WIDTH})",
                       lambda r, dt: intensity.softmax(r, ROW_WIDTH, dt), (0, 18), 15),
        CatalogueEntry("layer norm", f"rows (of {ROW_WIDTH})",
                       lambda r, dt: intensity.layer_norm(r, ROW_WIDTH, dt), (0, 18), 15),
        CatalogueEntry("matmul", "M = N = K", lambda n, dt: intensity.matmul(n, n, n, dt),
                       (4, 15), 12),
        CatalogueEntry("attention (materialised)", f"seq ({ATTENTION_HEADS} heads, d={HEAD_DIM})",
                       lambda s, dt: intensity.attention_materialised(ATTENTION_HEADS, s,
                                                                      HEAD_DIM, dt),
                       (6, 15), 12),
        CatalogueEntry("attention (tiled)", f"seq ({ATTENTION_HEADS} heads, d={HEAD_DIM})",
                       lambda s, dt: intensity.attention_tiled(ATTENTION_HEADS, s, HEAD_DIM, dt),
                       (6, 15), 12),
    )
}


def work_for(op: str, size: int, dtype="bf16") -> Work:
    """``CATALOGUE[op]`` at ``size``: e.g. ``work_for("matmul", 4096, "bf16")``."""
    if op not in CATALOGUE:
        raise KeyError(f"no op {op!r}; choose one of {', '.join(CATALOGUE)}")
    return CATALOGUE[op].make(size, dtype)
