"""Lesson 04's napkin math for one tile choice on one GPU: what it costs on chip and what
it buys.

Inputs: a GPU of the course's table, a data type, the tile (``BLOCK_M x BLOCK_N x
BLOCK_K``), ``num_stages`` and ``num_warps``. Outputs, from the tile formulas of
:mod:`helpers.intensity` and the limits of :mod:`helpers.hardware`:

* the tile's **intensity**: FLOPs per byte a program loads into SRAM;
* the **SRAM** one program needs (one A and one B tile per pipeline stage), whether it
  fits the per-program limit of the GPU, and how many programs fit on one SM;
* the **registers** of the fp32 accumulator per thread, and whether they can fit at all;
* the **predicted bound** if every tile came from DRAM: memory-bound left of the GPU's
  ridge point. Measured kernels beat that prediction because the L2 cache serves most
  tile loads, which is what the lesson's roofline shows.

:func:`plan` computes all of it; :class:`helpers.plots.tiling.TileExplorer` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import dtypes, hardware, intensity, roofline
from .kernels.matmul.config import TileConfig

# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": a thread
# may use at most 255 32-bit registers. What one program may have of an SM's shared memory
# is the GPU table's (hardware.GPUSpec.smem_per_program_bytes).
MAX_REGISTERS_PER_THREAD = 255
RESERVED_SMEM_BYTES = hardware.SMEM_RESERVED_PER_PROGRAM
BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
# The storage types a tile of tl.dot takes (fp32 runs on the TF32 tensor cores).
TILE_DTYPES = ("fp16", "bf16", "fp32")


def smem_per_program(spec: hardware.GPUSpec) -> int:
    """The most shared memory one program may have on ``spec``, in bytes (the table's)."""
    return spec.smem_per_program_bytes


def _torch_dtype(name: str):
    key = dtypes.dtype_key(name)
    if key not in TILE_DTYPES:
        raise KeyError(key)
    return dtypes.torch_dtype(key)


def compute_roof(dtype: str) -> str:
    """The tensor-core roof a ``tl.dot`` on ``dtype`` inputs runs under (fp32 -> tf32)."""
    key = dtypes.dtype_key(dtype)
    return "tf32" if key == "fp32" else key


@dataclass(frozen=True)
class TilePlan:
    gpu: str
    dtype: str
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    intensity: float            # FLOP per byte loaded into SRAM
    sram_bytes: int             # per program
    sram_limit: int             # per program, this GPU
    programs_per_sm: int        # by shared memory alone
    acc_registers: int          # per thread, the fp32 accumulator alone
    ridge: float                # FLOP/byte, this GPU and dtype (HBM)
    bound: str                  # "memory" or "compute", if every tile came from DRAM
    attainable_tflops: float    # the roofline at `intensity`

    @property
    def fits(self) -> bool:
        return self.sram_bytes <= self.sram_limit

    @property
    def registers_fit(self) -> bool:
        return self.acc_registers < MAX_REGISTERS_PER_THREAD

    def lines(self) -> list[str]:
        kib = 1024
        fit = (f"fits (at most {self.programs_per_sm} per SM by shared memory)" if self.fits else
               f"does NOT fit: {self.sram_bytes - self.sram_limit:,} B too many")
        regs = ("" if self.registers_fit else
                f" > {MAX_REGISTERS_PER_THREAD}: spills to memory, use more warps")
        return [
            f"tile {self.block_m}x{self.block_n}x{self.block_k} {self.dtype}, "
            f"{self.num_stages} stage(s), {self.num_warps} warps on the {self.gpu}",
            f"intensity {self.intensity:.3g} FLOP/B loaded (ridge {self.ridge:.0f})",
            f"SRAM {self.sram_bytes / kib:.4g} KiB of {self.sram_limit / kib:.4g} KiB: {fit}",
            f"accumulator {self.acc_registers} registers per thread{regs}",
            f"if every tile came from DRAM: {self.bound}-bound, at most "
            f"{self.attainable_tflops:,.0f} TFLOP/s",
        ]


def plan(gpu: str, dtype: str, block_m: int, block_n: int, block_k: int,
         num_stages: int = 3, num_warps: int = 8) -> TilePlan:
    """Everything the explorer shows, for one choice of tile on one GPU."""
    spec = hardware.lookup(gpu)
    dt = _torch_dtype(dtype)
    setting = TileConfig(block_m, block_n, block_k, num_stages=num_stages, num_warps=num_warps)
    roof = compute_roof(dtype)
    tile = intensity.tile_intensity(block_m, block_n, block_k, dt)
    sram = setting.shared_memory_bytes(dt)
    limit = smem_per_program(spec)
    reserved = spec.smem_per_sm_bytes - limit       # set aside per program (1 KiB from sm_80)
    return TilePlan(
        gpu=spec.name, dtype=dtypes.dtype_key(dtype), block_m=block_m, block_n=block_n,
        block_k=block_k, num_stages=num_stages, num_warps=num_warps, intensity=tile,
        sram_bytes=sram, sram_limit=limit,
        programs_per_sm=spec.smem_per_sm_bytes // (sram + reserved),
        acc_registers=setting.accumulator_registers(),
        ridge=spec.ridge_point(roof), bound=roofline.bound(tile, spec, roof),
        attainable_tflops=roofline.attainable_tflops(tile, spec, roof))
