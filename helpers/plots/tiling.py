"""Lesson 04's figures: a tile's cost and reward, the program order, the matmul ladder.

:class:`TileExplorer` draws :func:`helpers.tile_plan.plan` (choose a matmul tile, see
what it costs on chip and what it buys), live in JupyterLab and as a static picture
elsewhere (see :mod:`helpers.plots.explorer`). :func:`draw_program_order` and
:func:`draw_ladder` are the lesson's other figures.
"""

from __future__ import annotations

from .. import dtypes, hardware, intensity
from ..experiments.tiling import cublas_tflops
from ..kernels import matmul as mm
from ..tile_plan import (BLOCK_CHOICES, TILE_DTYPES, WARP_CHOICES, TilePlan, compute_roof,
                         plan)
from . import add_source
from . import roofline as roofline_plots
from .explorer import Explorer, new_figure, readout_box


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
                                 "; tile_plan.plan() takes any other value")
        self.points = tuple(points)
        self.points_gpu = hardware.lookup(points_gpu).key if points_gpu else None
        self.source = source
        gpu_w = w.Dropdown(options=list(hardware.GPUS), value=hardware.lookup(gpu).key,
                           description="GPU")
        dtype_w = w.Dropdown(options=list(TILE_DTYPES), value=dtypes.dtype_key(dtype),
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

    def axes(self):
        # The roofline on the left, the SRAM bar (drawn by decorate) on the right.
        fig, (ax, self._sram_ax) = new_figure(self.figsize, ncols=2,
                                              gridspec_kw={"width_ratios": [4, 1]})
        return fig, ax

    def decorate(self, fig) -> None:
        draw_sram(self._sram_ax, self.plan)

    def draw(self, ax, gpu, dtype, block_m, block_n, block_k, num_stages, num_warps) -> str:
        self.plan = p = plan(gpu, dtype, block_m, block_n, block_k, num_stages, num_warps)
        spec = hardware.lookup(gpu)
        roof = compute_roof(dtype)
        roofline_plots.plot(spec, dtypes=(roof,), ax=ax, xlim=(1 / 4, 4096),
                            points=self.points if spec.key == self.points_gpu else (),
                            title=f"A {block_m}x{block_n}x{block_k} tile on the {spec.name}")
        ax.plot([p.intensity], [p.attainable_tflops], "*", ms=18, color="C3", zorder=6,
                label=f"this tile if every load came from DRAM: {p.attainable_tflops:,.0f} "
                      "TFLOP/s")
        ax.axvline(p.intensity, color="C3", lw=0.8, ls="--")
        ax.legend(fontsize=7, loc="lower right")
        text = "\n".join(p.lines())
        readout_box(ax, text)
        add_source(ax, "napkin math of helpers.intensity on the course's GPU table"
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
    ax.plot(sizes, [cublas_tflops(mine, n, dtype) for n in sizes], "k--", lw=2,
            label="torch.matmul (cuBLAS)")
    if peak:
        ax.axhline(peak, color="0.5", ls=":", label=f"{dtype} datasheet peak {peak:,.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])


def occupancy_line(occ) -> str:
    """One line for a :class:`helpers.compiled.Occupancy`: programs per SM, every limit
    that binds (ties named together), and what each limit alone allows."""
    limits = {"registers": occ.by_registers, "shared memory": occ.by_shared,
              "warps": occ.by_warps, "blocks": occ.by_blocks}
    binding = " and ".join(k for k, v in limits.items() if v == occ.programs_per_sm)
    return (f"{occ.programs_per_sm} program(s) per SM, limited by {binding} ("
            + ", ".join(f"{k} allow {v}" for k, v in limits.items()) + ")")


def tf32_rows(rec) -> list[dict]:
    """The ``tf32`` record as a table: torch.matmul both ways, lesson 04's TF32 configuration,
    the fastest TF32 configuration for each layout of B, and true fp32 in ``tl.dot``; TFLOP/s
    as measured and as a percentage of the roof each runs under, and the error against fp64.

    TF32 products run on the tensor cores (the TF32 peak); true fp32 (cuBLAS with TF32 off,
    ``tl.dot`` with ``input_precision="ieee"``) runs its multiply-adds on the CUDA cores, whose
    roof is the fp32 peak (67 TFLOP/s on an H100 SXM, a seventh of TF32's)."""
    from ..experiments import tf32

    rows = rec.results["rows"]
    picks = [next((r for r in rows if r["kind"] == "torch" and not r["allow_tf32"]), None),
             next((r for r in rows if r["kind"] == "torch" and r["allow_tf32"]), None),
             next((r for r in rows if r.get("lesson_config")
                   and r["layout"] == tf32.LAYOUTS[0]), None)]
    picks += [tf32.best(rows, layout) for layout in tf32.LAYOUTS
              if any(r.get("layout") == layout and r["kind"] == "triton tf32" for r in rows)]
    picks.append(next((r for r in rows if r["kind"] == "triton ieee"), None))
    # the lesson's configuration may also be the fastest: each row once
    picks = list({r["name"]: r for r in picks if r is not None}.values())
    def roof(r) -> str:
        exact = r["kind"] == "triton ieee" or (r["kind"] == "torch" and not r["allow_tf32"])
        return "fp32" if exact else "tf32"

    peaks = rec.results.get("peak_tflops") or {}
    return [{"version": r["name"], "TFLOP/s": r["tflops"],
             "roof": {"fp32": "CUDA cores, fp32", "tf32": "tensor cores, TF32"}[roof(r)],
             "% of its roof": (100 * r["tflops"] / peaks[roof(r)] if peaks.get(roof(r))
                               else float("nan")),
             "range ms": f"{r['ms_min']:.3f} to {r['ms_max']:.3f}",
             "rel. error": f"{r['rel_error']:.1e}"} for r in picks]


def draw_k_walk(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int,
                tile: tuple[int, int] = (1, 1), step: int = 1, dtype: str = "fp16"):
    """One program's walk along K: the row strip of A and the column strip of B it reads,
    one ``BLOCK_K`` step at a time (step ``step`` drawn dark), and its tile of C, the fp32
    accumulator in registers. Returns the figure and the counts it shows."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    pid_m, pid_n = tile
    steps = -(-k // block_k)
    if not (0 <= pid_m < -(-m // block_m) and 0 <= pid_n < -(-n // block_n)
            and 0 <= step < steps):
        raise ValueError(f"tile {tile} or step {step} is outside a {m}x{n}x{k} product "
                         f"in {block_m}x{block_n}x{block_k} tiles")
    fig, axes = plt.subplots(2, 2, figsize=(9, 8),
                             gridspec_kw={"width_ratios": [k, n], "height_ratios": [k, m]})
    axes[0, 0].axis("off")
    ax_b, ax_a, ax_c = axes[0, 1], axes[1, 0], axes[1, 1]

    def matrix(ax, rows, cols, name):
        ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, lw=1.5))
        ax.set_xlim(-0.02 * cols, 1.02 * cols)
        ax.set_ylim(1.02 * rows, -0.02 * rows)          # row 0 at the top, like a matrix
        ax.set_aspect("equal")
        ax.set_title(f"{name} ({rows} x {cols})", fontsize=10)

    def box(ax, x, y, w, h, color, alpha, label=None, text=None):
        ax.add_patch(Rectangle((x, y), w, h, color=color, alpha=alpha, ec="k", lw=0.5,
                               label=label))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=7)

    r0, c0 = pid_m * block_m, pid_n * block_n
    matrix(ax_a, m, k, "A")
    matrix(ax_b, k, n, "B")
    matrix(ax_c, m, n, "C")
    for i in range(steps):
        now = i == step
        box(ax_a, i * block_k, r0, min(block_k, k - i * block_k), min(block_m, m - r0),
            "C0", 0.85 if now else 0.25, text=str(i),
            label=(f"this step: a {block_m}x{block_k} tile into SRAM" if now else
                   ("A's row strip: one tile per K step" if i == 0 else None)))
        box(ax_b, c0, i * block_k, min(block_n, n - c0), min(block_k, k - i * block_k),
            "C1", 0.85 if now else 0.25, text=str(i),
            label=(f"this step: a {block_k}x{block_n} tile into SRAM" if now else
                   ("B's column strip: one tile per K step" if i == 0 else None)))
    box(ax_c, c0, r0, min(block_n, n - c0), min(block_m, m - r0), "C2", 0.7,
        label=f"the accumulator: {block_m}x{block_n} fp32, in registers",
        text=f"acc += A_{step} @ B_{step}")
    for ax, xl, yl in ((ax_a, "K (columns of A)", "M (rows)"),
                       (ax_b, "N (columns)", "K (rows of B)"),
                       (ax_c, "N (columns)", "M (rows)")):
        ax.set_xlabel(f"{xl}, elements", fontsize=8)
        ax.set_ylabel(f"{yl}, elements", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [h for ax in (ax_a, ax_b, ax_c) for h in ax.get_legend_handles_labels()[0]]
    axes[0, 0].legend(handles=handles, fontsize=8, loc="lower left", frameon=False)
    loaded = intensity.sram_bytes(block_m, block_n, block_k, dtype)     # one step's A and B
    facts = {"k_steps": steps, "bytes_per_step": loaded,
             "flops_per_step": 2 * block_m * block_n * block_k,
             "accumulator_bytes": intensity.accumulator_bytes(block_m, block_n)}
    # The shapes only: the FLOPs and bytes of a step are the lesson's prediction.
    axes[0, 0].text(0, 0.95, f"program ({pid_m}, {pid_n}), K step {step} of 0-{steps - 1}:\n"
                    f"loads a {block_m}x{block_k} tile of A and a {block_k}x{block_n} tile of B "
                    f"({dtype}),\nmultiplies them on the tensor cores,\n"
                    f"keeps {facts['accumulator_bytes'] / 1024:g} KiB of fp32 sums in registers",
                    fontsize=9, va="top", transform=axes[0, 0].transAxes)
    fig.suptitle(f"A {block_m}x{block_n}x{block_k} tile walks along K: "
                 f"{m}x{k} @ {k}x{n}, {steps} steps")
    add_source(ax_a, "the tile formulas of helpers.intensity; nothing measured")
    fig.tight_layout()
    return fig, facts


def order_traffic_lines(groups: list[dict], gpu) -> list[str]:
    """The ``GROUP_M`` sweep of the tiling record against the napkin count: what the whole
    product reads from HBM in row-major order and in the kernels' default group, if nothing
    a wave loaded survives in L2 to the next wave, and how long HBM would need for it."""
    import torch

    by_group = {r["GROUP_M"]: r for r in groups}
    row_major, fastest = by_group[1], max(groups, key=lambda r: r["tflops"])
    n, bm, bn = row_major["n"], row_major["BLOCK_M"], row_major["BLOCK_N"]
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[row_major["dtype"]]
    tiles = -(-n // bm) * -(-n // bn)
    waves = -(-tiles // gpu.sm_count)   # one 128x256, 4-stage program fills an SM's SRAM
    lines = [f"{n}^3: {tiles} tiles, {waves} waves of {gpu.sm_count} programs on the {gpu.name}"]
    for g in (1, 8):                    # row-major, and the kernels' default group
        w = mm.wave_footprint(n, n, n, dt, bm, bn, g, programs=gpu.sm_count)
        total = waves * w["bytes"]
        hbm_ms = total / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
        lines.append(f"GROUP_M={g}: {total / 2**30:4.2f} GiB from HBM at most -> {hbm_ms:.2f} ms "
                     f"at {gpu.hbm_bandwidth_gbs:,.0f} GB/s; the product took "
                     f"{by_group[g]['ms']:.2f} ms (HBM busy {hbm_ms / by_group[g]['ms']:.0%} of it)")
    lines.append(f"fastest order (GROUP_M={fastest['GROUP_M']}) against row-major: "
                 f"{fastest['tflops'] / row_major['tflops']:.2f}x")
    return lines


def target_lines(ladder: list[dict], targets: dict, rung: str = "v3_warps") -> list[str]:
    """The lesson's target against the record: for each dtype and size in ``targets``
    (n -> a :class:`helpers.performance.targets.Target`), this lesson's best rung
    (``rung``) and ``matmul()`` (lesson 07's kernels), each as times torch.matmul."""
    lines = []
    for dtype in sorted({r["dtype"] for r in ladder}, key=["fp16", "bf16"].index):
        for n, target in targets.items():
            got = {r["step"]: r for r in ladder if r["dtype"] == dtype and r["n"] == n}
            if rung not in got or "best" not in got:
                continue
            mine, best = got[rung]["vs_cublas"], got["best"]["vs_cublas"]
            version = (got["best"].get("config") or {}).get("version", "?")
            verdict = {True: "met", False: "not met"}
            lines.append(f"{dtype} {n}^3, target {target.text}: lesson 04's best rung "
                         f"{mine:.2f}x ({verdict[target.met(mine)]}); matmul() ({version}, "
                         f"lesson 07's) {best:.2f}x ({verdict[target.met(best)]})")
    return lines
