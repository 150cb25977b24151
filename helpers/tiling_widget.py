"""Lesson 04's explorer: choose a matmul tile, see what it costs on chip and what it buys.

Inputs: a GPU of the course's table, a data type, the tile (``BLOCK_M x BLOCK_N x
BLOCK_K``), ``num_stages`` and ``num_warps``. Outputs, from the napkin math of
:mod:`helpers.kernels.matmul`:

* the tile's **intensity**: FLOPs per byte a program loads into SRAM;
* the **SRAM** one program needs (one A and one B tile per pipeline stage), whether it
  fits the per-program limit of the GPU, and how many programs fit on one SM;
* the **registers** of the fp32 accumulator per thread, and whether they can fit at all;
* the **predicted bound** if every tile came from DRAM: memory-bound left of the GPU's
  ridge point. Measured kernels beat that prediction because the L2 cache serves most
  tile loads, which is what the lesson's roofline shows.

:func:`plan` computes all of it; :class:`TileExplorer` draws it, live in JupyterLab and as
a static picture elsewhere (see :mod:`helpers.widgets`).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import hardware, roofline
from .kernels import matmul as mm
from .plots import add_source
from .widgets import Explorer, _readout_box

# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": a thread
# may use at most 255 32-bit registers; from compute capability 8.0 on, one block (one
# Triton program) may use all of an SM's shared memory but 1 KiB (227 KiB of 228 on
# Hopper, 163 of 164 on an A100, 99 of 100 on Ada); on 7.5 (T4) all 64 KiB.
MAX_REGISTERS_PER_THREAD = 255
RESERVED_SMEM_BYTES = 1024
BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def smem_per_program(spec: hardware.GPUSpec) -> int:
    """The most shared memory one program may have on ``spec``, in bytes."""
    reserved = RESERVED_SMEM_BYTES if spec.compute_capability >= (8, 0) else 0
    return spec.smem_per_sm_bytes - reserved


def _torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPES[hardware.dtype_key(name)])


def compute_roof(dtype: str) -> str:
    """The tensor-core roof a ``tl.dot`` on ``dtype`` inputs runs under (fp32 -> tf32)."""
    key = hardware.dtype_key(dtype)
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
    mm._check_block(block_m=block_m, block_n=block_n, block_k=block_k)
    for name, value in (("num_stages", num_stages), ("num_warps", num_warps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    roof = compute_roof(dtype)
    intensity = mm.tile_intensity(block_m, block_n, block_k, dt)
    sram = mm.sram_bytes(block_m, block_n, block_k, dt, num_stages)
    limit = smem_per_program(spec)
    reserved = spec.smem_per_sm_bytes - limit       # set aside per program (1 KiB from sm_80)
    return TilePlan(
        gpu=spec.name, dtype=hardware.dtype_key(dtype), block_m=block_m, block_n=block_n,
        block_k=block_k, num_stages=num_stages, num_warps=num_warps, intensity=intensity,
        sram_bytes=sram, sram_limit=limit,
        programs_per_sm=spec.smem_per_sm_bytes // (sram + reserved),
        acc_registers=mm.accumulator_bytes(block_m, block_n) // 4 // (32 * num_warps),
        ridge=spec.ridge_point(roof), bound=roofline.bound(intensity, spec, roof),
        attainable_tflops=roofline.attainable_tflops(intensity, spec, roof))


def draw_sram(ax, p: TilePlan) -> None:
    """One bar per pipeline stage (A tile + B tile), against the per-program limit."""
    kib = 1024
    stage = p.sram_bytes / p.num_stages / kib
    for s in range(p.num_stages):
        ax.bar(0, stage, bottom=s * stage, color="C0" if p.fits else "C3",
               edgecolor="white", width=0.6, label="one stage: A tile + B tile" if s == 0 else None)
    ax.axhline(p.sram_limit / kib, color="k", ls="--", lw=1, label="limit per program")
    ax.set_xticks([])
    ax.set_xlim(-0.6, 0.6)
    ax.set_ylim(0, max(p.sram_bytes, p.sram_limit) / kib * 1.15)
    ax.set_ylabel("shared memory per program (KiB)")
    ax.set_title("SRAM")
    ax.legend(fontsize=7, loc="upper center")


class TileExplorer(Explorer):
    """Pick a tile; read its intensity, SRAM, registers and predicted bound."""

    figsize = (11, 5)

    def __init__(self, gpu: str = "H100-SXM", dtype: str = "fp16", block_m: int = 128,
                 block_n: int = 256, block_k: int = 64, num_stages: int = 3,
                 num_warps: int = 8, points=(), points_gpu: str | None = None,
                 source: str = ""):
        """``points`` (:class:`helpers.roofline.Point`) are measurements made on the GPU
        ``points_gpu`` (a table key); they are drawn while that GPU is selected."""
        import ipywidgets as w

        hardware.lookup(gpu)
        for name, value, choices in (("block_m", block_m, BLOCK_CHOICES),
                                     ("block_n", block_n, BLOCK_CHOICES),
                                     ("block_k", block_k, BLOCK_CHOICES),
                                     ("num_warps", num_warps, WARP_CHOICES),
                                     ("num_stages", num_stages, range(1, 7))):
            if value not in choices:
                raise ValueError(f"the explorer offers {name} in {tuple(choices)}, got {value!r}"
                                 "; tiling_widget.plan() takes any other value")
        self.points = tuple(points)
        self.points_gpu = hardware.lookup(points_gpu).key if points_gpu else None
        self.source = source
        gpu_w = w.Dropdown(options=list(hardware.GPUS), value=hardware.lookup(gpu).key,
                           description="GPU")
        dtype_w = w.Dropdown(options=list(TORCH_DTYPES), value=hardware.dtype_key(dtype),
                             description="dtype")
        blocks = {name: w.Dropdown(options=BLOCK_CHOICES, value=value, description=name,
                                   layout=w.Layout(width="160px"))
                  for name, value in (("BLOCK_M", block_m), ("BLOCK_N", block_n),
                                      ("BLOCK_K", block_k))}
        stages_w = w.IntSlider(value=num_stages, min=1, max=6, description="num_stages",
                               continuous_update=False)
        warps_w = w.Dropdown(options=WARP_CHOICES, value=num_warps, description="num_warps")
        controls = {"gpu": gpu_w, "dtype": dtype_w, "block_m": blocks["BLOCK_M"],
                    "block_n": blocks["BLOCK_N"], "block_k": blocks["BLOCK_K"],
                    "num_stages": stages_w, "num_warps": warps_w}
        super().__init__(controls, [w.HBox([gpu_w, dtype_w]), w.HBox(list(blocks.values())),
                                    w.HBox([stages_w, warps_w])])

    def figure(self, **values):
        import matplotlib.pyplot as plt

        values = {**{k: c.value for k, c in self.controls.items()}, **values}
        fig, (ax, bar) = plt.subplots(1, 2, figsize=self.figsize,
                                      gridspec_kw={"width_ratios": [4, 1]})
        self.readout = self.draw(ax, **values)
        draw_sram(bar, self.plan)
        self.values = values
        fig.tight_layout()
        return fig

    def draw(self, ax, gpu, dtype, block_m, block_n, block_k, num_stages, num_warps) -> str:
        self.plan = p = plan(gpu, dtype, block_m, block_n, block_k, num_stages, num_warps)
        spec = hardware.lookup(gpu)
        roof = compute_roof(dtype)
        roofline.plot(spec, dtypes=(roof,), ax=ax, xlim=(1 / 4, 4096),
                      points=self.points if spec.key == self.points_gpu else (),
                      title=f"A {block_m}x{block_n}x{block_k} tile on the {spec.name}")
        ax.plot([p.intensity], [p.attainable_tflops], "*", ms=18, color="C3", zorder=6,
                label=f"this tile if every load came from DRAM: {p.attainable_tflops:,.0f} "
                      "TFLOP/s")
        ax.axvline(p.intensity, color="C3", lw=0.8, ls="--")
        ax.legend(fontsize=7, loc="lower right")
        text = "\n".join(p.lines())
        _readout_box(ax, text)
        add_source(ax, "napkin math of helpers.kernels.matmul on the course's GPU table"
                   + (f"; squares: {self.source}" if self.points and spec.key == self.points_gpu
                      else ""))
        return text


# --------------------------------------------------------------------------------------
# The lesson's other figures.
# --------------------------------------------------------------------------------------


def draw_program_order(ax, num_pid_m: int, num_pid_n: int, group_m: int, wave: int) -> dict:
    """The tiles of C labelled with the program that computes them; the first ``wave``
    programs (those on the GPU together) shaded. Returns how many rows and columns of
    tiles that wave touches."""
    import numpy as np

    order = np.array(mm.program_order(num_pid_m, num_pid_n, group_m))
    first = order < wave
    ax.imshow(first, cmap="Blues", vmin=-0.3, vmax=1.6)
    for i in range(num_pid_m):
        for j in range(num_pid_n):
            ax.text(j, i, str(order[i, j]), ha="center", va="center", fontsize=7,
                    color="white" if first[i, j] else "0.3")
    rows = int(first.any(axis=1).sum())
    cols = int(first.any(axis=0).sum())
    name = "row-major (v2)" if group_m == 1 else f"GROUP_M = {group_m} (v3)"
    ax.set_title(f"{name}: programs 0-{wave - 1} need\n{rows} strips of A and {cols} of B",
                 fontsize=9)
    ax.set_xlabel("tile column (pid_n): a strip of B")
    ax.set_ylabel("tile row (pid_m): a strip of A")
    ax.set_xticks(range(num_pid_n))
    ax.set_yticks(range(num_pid_m))
    return {"a_strips": rows, "b_strips": cols}


def draw_ladder(ax, rows: list[dict], dtype: str, steps: list[dict], peak: float | None = None):
    """TFLOP/s against matrix size for each rung of the ladder and for cuBLAS."""
    mine = [r for r in rows if r["dtype"] == dtype]
    sizes = sorted({r["n"] for r in mine})
    for i, step in enumerate(steps):
        pts = sorted((r["n"], r["tflops"]) for r in mine if r["step"] == step["key"])
        if pts:
            ax.plot(*zip(*pts), "o-", ms=4, color=f"C{i}", label=step["label"])
    from .experiments.matmul import cublas_tflops

    ax.plot(sizes, [cublas_tflops(mine, n, dtype) for n in sizes], "k--", lw=2,
            label="torch.matmul (cuBLAS)")
    if peak:
        ax.axhline(peak, color="0.5", ls=":", label=f"{dtype} datasheet peak {peak:,.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
