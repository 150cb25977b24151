"""The GPUs the course talks about: what each can do on paper, and what we measure.

Each row of :data:`GPUS` is a datasheet: peak DRAM bandwidth, *dense* peak throughput
per data type (no 2:4 structured sparsity, which datasheets like to quote), how many
streaming multiprocessors (SMs) there are, how much shared memory (the on-chip SRAM a
Triton program's tiles live in) each SM offers, and the L2 cache. Every figure names
its source. Peaks are for the boost clock; a real chip under load runs at or below it,
which is one reason measured numbers sit under the roof.

Units, everywhere in the course: bandwidth in GB/s (10^9 bytes per second), throughput
in TFLOP/s (10^12 floating-point operations per second, one multiply-add = 2 FLOPs),
capacities in KiB/MiB/GiB (powers of two) as vendors state them for on-chip memories.

This module is data and detection only: it times nothing. The probes that measure the
two ceilings on the GPU you have (copy bandwidth, matrix-multiply throughput) are in
:mod:`helpers.bench`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import runtime
from .dtypes import DTYPES, dtype_key  # the short names of the peak-throughput columns


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_gib: float
    hbm_bandwidth_gbs: float  # peak DRAM bandwidth, GB/s (GDDR on T4/L4/A10G/4090)
    peak_tflops: dict[str, float]  # dense, per data type, TFLOP/s
    sm_count: int
    smem_per_sm_kib: int  # largest shared-memory carve-out per SM
    l2_mib: float
    sources: dict[str, str] = field(default_factory=dict)
    notes: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak TFLOP/s for ``dtype`` (``"fp16"``, a torch dtype, ...)."""
        key = dtype_key(dtype)
        if key not in self.peak_tflops:
            have = ", ".join(self.peak_tflops)
            raise ValueError(
                f"{self.name} has no {key} peak in the table (it has: {have}). "
                f"{'Its tensor cores do not support ' + key + '.' if key in DTYPES else ''}"
            )
        return self.peak_tflops[key]

    def ridge_point(self, dtype: str) -> float:
        """FLOPs per byte at which this GPU turns from memory-bound to compute-bound."""
        return self.peak(dtype) * 1e12 / (self.hbm_bandwidth_gbs * 1e9)

    @property
    def smem_per_sm_bytes(self) -> int:
        return self.smem_per_sm_kib * 1024

    @property
    def smem_per_program_bytes(self) -> int:
        """The most shared memory one program (one CUDA block) may have: the SM's carve-out
        less the 1 KiB the driver keeps back per resident block from compute capability 8.0
        on (227 KiB of 228 on Hopper, 163 of 164 on an A100, 99 of 100 on Ada); all of it
        on 7.5 (the T4's 64 KiB). The figure a tile's pipeline must fit in."""
        reserved = SMEM_RESERVED_PER_PROGRAM if self.compute_capability >= (8, 0) else 0
        return self.smem_per_sm_bytes - reserved

    @property
    def l2_bytes(self) -> int:
        return int(self.l2_mib * 1024 * 1024)


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": from
# compute capability 8.0 on, one block may use all of an SM's shared memory but 1 KiB,
# which the driver reserves for each resident block.
SMEM_RESERVED_PER_PROGRAM = 1024

_NV = "https://www.nvidia.com/content/dam/en-zz/Solutions"
_CC_TABLE = (
    "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
    "(shared memory per SM), https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
)

GPUS: dict[str, GPUSpec] = {}


def _add(spec: GPUSpec) -> None:
    GPUS[spec.key] = spec


# fmt: off
_add(GPUSpec(
    key="T4", name="NVIDIA T4", architecture="Turing", compute_capability=(7, 5),
    memory_gib=16, hbm_bandwidth_gbs=320,
    peak_tflops={"fp32": 8.1, "fp16": 65.0},
    sm_count=40, smem_per_sm_kib=64, l2_mib=4,
    sources={
        "bandwidth, compute, memory": f"NVIDIA T4 datasheet, {_NV}/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
        "sm_count, l2": "NVIDIA Turing GPU Architecture whitepaper (TU104 in T4: 40 SMs, 4 MB L2)",
        "smem": _CC_TABLE,
    },
    notes="Turing tensor cores have no tf32, bf16 or fp8.",
))
_add(GPUSpec(
    key="L4", name="NVIDIA L4", architecture="Ada Lovelace", compute_capability=(8, 9),
    memory_gib=24, hbm_bandwidth_gbs=300,
    peak_tflops={"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5},
    sm_count=58, smem_per_sm_kib=100, l2_mib=48,
    sources={
        "bandwidth, compute, memory": f"NVIDIA L4 datasheet (tensor figures quoted with sparsity, halved here), {_NV}/Data-Center/l4/l4-datasheet.pdf",
        "sm_count, l2": "NVIDIA Ada GPU Architecture whitepaper (AD104 in L4)",
        "smem": _CC_TABLE,
    },
))
_add(GPUSpec(
    key="A10G", name="NVIDIA A10G", architecture="Ampere", compute_capability=(8, 6),
    memory_gib=24, hbm_bandwidth_gbs=600,
    peak_tflops={"fp32": 35.0, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0},
    sm_count=80, smem_per_sm_kib=100, l2_mib=6,
    sources={
        "memory": "AWS EC2 G5 instance types (24 GiB per GPU), https://aws.amazon.com/ec2/instance-types/g5/",
        "bandwidth": "384-bit GDDR6 at 12.5 Gb/s per pin = 600 GB/s (no vendor datasheet for the A10G)",
        "compute": "derived: 80 SMs x 1.71 GHz x GA102 per-SM rates (NVIDIA Ampere GA102 whitepaper, https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf)",
        "sm_count, l2": "cudaGetDeviceProperties on an A10G (80 SMs, 6 MiB L2)",
        "smem": _CC_TABLE,
    },
    notes="Neither AWS nor NVIDIA publishes A10G throughput; these peaks are derived from the "
          "SM count and clock. Its tensor cores accumulate fp32 at half rate, like GeForce "
          "(NVIDIA's A10, a different board with 72 SMs, is quoted at 125 dense fp16 TFLOP/s).",
))
_add(GPUSpec(
    key="A100-40GB", name="NVIDIA A100-SXM4-40GB", architecture="Ampere", compute_capability=(8, 0),
    memory_gib=40, hbm_bandwidth_gbs=1555,
    peak_tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    sm_count=108, smem_per_sm_kib=164, l2_mib=40,
    sources={
        "bandwidth, compute, memory": f"NVIDIA A100 datasheet, {_NV}/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        "sm_count, l2, smem": "NVIDIA A100 Tensor Core GPU Architecture whitepaper",
    },
))
_add(GPUSpec(
    key="A100-80GB", name="NVIDIA A100-SXM4-80GB", architecture="Ampere", compute_capability=(8, 0),
    memory_gib=80, hbm_bandwidth_gbs=2039,
    peak_tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    sm_count=108, smem_per_sm_kib=164, l2_mib=40,
    sources={
        "bandwidth, compute, memory": f"NVIDIA A100 datasheet, {_NV}/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        "sm_count, l2, smem": "NVIDIA A100 Tensor Core GPU Architecture whitepaper",
    },
))
_add(GPUSpec(
    key="H100-SXM", name="NVIDIA H100 SXM5 80GB", architecture="Hopper", compute_capability=(9, 0),
    memory_gib=80, hbm_bandwidth_gbs=3350,
    peak_tflops={"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    sm_count=132, smem_per_sm_kib=228, l2_mib=50,
    sources={
        "bandwidth, compute, memory": "NVIDIA H100 Tensor Core GPU datasheet (tensor figures quoted with sparsity, halved here), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "sm_count, l2, smem": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs, 50 MB L2, 228 KB shared memory per SM)",
    },
))
_add(GPUSpec(
    key="H100-PCIe", name="NVIDIA H100 PCIe 80GB", architecture="Hopper", compute_capability=(9, 0),
    memory_gib=80, hbm_bandwidth_gbs=2000,
    peak_tflops={"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
    sm_count=114, smem_per_sm_kib=228, l2_mib=50,
    sources={
        "bandwidth, compute, memory": "NVIDIA H100 Tensor Core GPU datasheet (tensor figures quoted with sparsity, halved here), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "sm_count, l2, smem": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 PCIe: 114 SMs)",
    },
))
_add(GPUSpec(
    key="H200", name="NVIDIA H200 SXM 141GB", architecture="Hopper", compute_capability=(9, 0),
    memory_gib=141, hbm_bandwidth_gbs=4800,
    peak_tflops={"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    sm_count=132, smem_per_sm_kib=228, l2_mib=60,
    sources={
        "bandwidth, compute, memory": "NVIDIA H200 Tensor Core GPU datasheet (tensor figures quoted with sparsity, halved here), https://www.nvidia.com/en-us/data-center/h200/",
        "sm_count, smem": "same GH100 chip as H100 SXM5: NVIDIA H100 Tensor Core GPU Architecture whitepaper",
        "l2": "cudaGetDeviceProperties on an H200 (L2_cache_size = 62914560 B = 60 MiB; memory_wall record)",
    },
))
_add(GPUSpec(
    key="RTX4090", name="NVIDIA GeForce RTX 4090", architecture="Ada Lovelace", compute_capability=(8, 9),
    memory_gib=24, hbm_bandwidth_gbs=1008,
    peak_tflops={"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3},
    sm_count=128, smem_per_sm_kib=100, l2_mib=72,
    sources={
        "bandwidth, compute, memory, sm_count, l2": "NVIDIA Ada GPU Architecture whitepaper, Appendix A (RTX 4090; tensor figures with fp32 accumulate, dense)",
        "smem": _CC_TABLE,
    },
    notes="GeForce tensor cores run fp16/fp8 at twice these rates when accumulating in fp16; "
          "the course accumulates in fp32.",
))
_add(GPUSpec(
    key="B200", name="NVIDIA B200", architecture="Blackwell", compute_capability=(10, 0),
    memory_gib=180, hbm_bandwidth_gbs=7700,
    peak_tflops={"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
    sm_count=148, smem_per_sm_kib=228, l2_mib=126.5,
    sources={
        "bandwidth, compute, memory": "NVIDIA GB200 NVL72 page, HGX B200 column, per GPU (tensor figures quoted with sparsity, halved here), https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
        "sm_count, l2": "cudaGetDeviceProperties on a B200 (148 SMs, 126.5 MiB L2); NVIDIA publishes neither",
        "smem": "CUDA C++ Programming Guide, compute capability 10.0; Blackwell Tuning Guide",
    },
    notes="Per-GPU figures differ between NVIDIA documents (7.7 or 8 TB/s; fp32 75 or 80 "
          "TFLOP/s); GB200 (1200 W) parts are faster still. Treat this row as approximate.",
))
# fmt: on

# How torch.cuda.get_device_name() spells each GPU, most specific first.
_NAME_PATTERNS = [
    ("H100 PCIe", "H100-PCIe"),
    ("H100", "H100-SXM"),
    ("H200", "H200"),
    ("A100-SXM4-40GB", "A100-40GB"),
    ("A100-PCIE-40GB", "A100-40GB"),
    ("A100", "A100-80GB"),
    ("A10G", "A10G"),
    ("RTX 4090", "RTX4090"),
    ("B200", "B200"),
    ("L4", "L4"),
    ("T4", "T4"),
]


def lookup(name_or_key: str) -> GPUSpec:
    """A table row by key (``"H100-SXM"``) or by the name the driver reports."""
    if name_or_key in GPUS:
        return GPUS[name_or_key]
    for pattern, key in _NAME_PATTERNS:
        if pattern.lower() in name_or_key.lower():
            return GPUS[key]
    raise KeyError(
        f"{name_or_key!r} is not in the course's GPU table ({', '.join(GPUS)}). "
        "Pass one of those keys, e.g. helpers.hardware.lookup('H100-SXM')."
    )


def current_gpu() -> GPUSpec | None:
    """The table row for the GPU in use, or ``None`` in CPU mode or for an unknown GPU."""
    if not runtime.is_gpu():
        return None
    try:
        return lookup(torch.cuda.get_device_name())
    except KeyError:
        return None


def current_or(default_key: str = "H100-SXM") -> GPUSpec:
    """The GPU in use if the table knows it, else ``default_key`` (used in CPU mode)."""
    return current_gpu() or GPUS[default_key]
