"""The roofline chart, and lesson 02's explorer: an op of your choice on the roofline of a
GPU of your choice.

:func:`plot` draws the model of :mod:`helpers.roofline` (every lesson uses it); the
explorer places an op's napkin math (:mod:`helpers.prediction`) on it as a star.
"""

from __future__ import annotations

from .. import hardware, prediction
from ..dtypes import dtype_key
from ..intensity import Work
from . import add_source
from .explorer import Explorer, log_limits, readout_box

# The intensities lesson 02 shows by default (FLOP/byte): from a copy to a large matmul.
XLIM = (1 / 16, 8192)


def plot(gpu: hardware.GPUSpec, dtypes=("fp32", "bf16"), points=(), ax=None,
         title: str | None = None, source: str | None = None, xlim=(1 / 16, 4096)):
    """Draw ``gpu``'s roofline for each dtype, its ridge points, and measured ``points``
    (each a :class:`helpers.roofline.Point`).

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


def draw_roofline_point(ax, gpu: hardware.GPUSpec, work: Work, launch_us: float,
                        points=(), source: str = "") -> prediction.Prediction:
    """The roofline of ``gpu`` with ``work`` placed at its predicted throughput.

    The x axis spans :data:`XLIM`, widened when ``work`` or a measured point lies
    beyond it (a 32768^3 bf16 matmul does 10,923 FLOP per byte)."""
    pred = prediction.predict(work, gpu, launch_us=launch_us)
    dtypes = tuple(dict.fromkeys([pred.peak_dtype, work.dtype]))
    dtypes = tuple(d for d in dtypes if d in gpu.peak_tflops)
    xs = [p.intensity for p in points] + ([work.intensity] if work.flops else [])
    plot(gpu, dtypes=dtypes, points=points, ax=ax, source=source or None,
         xlim=log_limits(*XLIM, xs))
    if work.flops:
        ax.plot([work.intensity], [pred.tflops], "*", ms=18, color="C3", zorder=6,
                label=f"{work.op} (predicted, launch included)")
        ax.axvline(work.intensity, color="C3", lw=0.8, ls="--")
        ax.legend(fontsize=7, loc="lower right")
    return pred


class RooflineExplorer(Explorer):
    """Lesson 02: pick a GPU, a data type, an op and its size; see where it lands."""

    figsize = (9, 5.5)

    def __init__(self, launch_us: float, points=(), points_gpu: str | None = None,
                 source: str = "", gpu: str = "H100-SXM", dtype: str = "bf16",
                 op: str = "matmul", log2_size: int | None = None):
        import ipywidgets as w

        if gpu not in hardware.GPUS:
            raise KeyError(f"{gpu!r} is not in helpers.hardware.GPUS: {', '.join(hardware.GPUS)}")
        if op not in prediction.CATALOGUE:
            raise KeyError(f"{op!r} is not an op of helpers.prediction.CATALOGUE: "
                           f"{', '.join(prediction.CATALOGUE)}")
        if dtype not in self._dtypes(gpu):
            raise ValueError(f"the {gpu} has no {dtype!r} peak in the table; pick one of "
                             f"{self._dtypes(gpu)}")
        self.launch_us = float(launch_us)
        self.points = tuple(points)
        self.points_gpu = points_gpu
        self.source = source
        entry = prediction.CATALOGUE[op]
        lo, hi = entry.log2_range
        gpu_w = w.Dropdown(options=list(hardware.GPUS), value=gpu, description="GPU")
        dtype_w = w.Dropdown(options=self._dtypes(gpu), value=dtype, description="dtype")
        op_w = w.Dropdown(options=list(prediction.CATALOGUE), value=op, description="op")
        size_w = w.IntSlider(value=log2_size if log2_size is not None else entry.log2_default,
                             min=lo, max=hi, description="log2(size)", continuous_update=False)
        self.size_label = w.Label(entry.size_label)
        controls = {"gpu": gpu_w, "dtype": dtype_w, "op": op_w, "log2_size": size_w}
        super().__init__(controls, [w.HBox([gpu_w, dtype_w]), w.HBox([op_w, size_w,
                                                                         self.size_label])])

    @staticmethod
    def _dtypes(gpu_key: str) -> list[str]:
        # Storage types this GPU can compute on; tf32 is an fp32 compute mode, not storage.
        return [d for d in hardware.GPUS[gpu_key].peak_tflops if d != "tf32"]

    def on_change(self, name: str, change: dict) -> None:
        if name == "gpu":        # a T4 has no bf16: offer what this GPU computes on
            dtype_w = self.controls["dtype"]
            options = self._dtypes(change["new"])
            keep = dtype_w.value if dtype_w.value in options else options[-1]
            dtype_w.options = options
            dtype_w.value = keep
        elif name == "op":       # each op has its own range of sizes
            entry = prediction.CATALOGUE[change["new"]]
            size_w = self.controls["log2_size"]
            lo, hi = entry.log2_range
            size_w.min, size_w.max = min(lo, size_w.min), max(hi, size_w.max)  # widen first
            size_w.value = entry.log2_default
            size_w.min, size_w.max = lo, hi
            self.size_label.value = entry.size_label

    def prediction(self, gpu: str, dtype: str, op: str, log2_size: int) -> prediction.Prediction:
        work = prediction.work_for(op, 2**log2_size, dtype)
        return prediction.predict(work, hardware.GPUS[gpu], launch_us=self.launch_us)

    def draw(self, ax, gpu: str, dtype: str, op: str, log2_size: int) -> str:
        spec = hardware.GPUS[gpu]
        work = prediction.work_for(op, 2**log2_size, dtype)
        pts = self.points if (self.points_gpu is None or self.points_gpu == gpu) else ()
        source = (f"datasheet roofs; star = napkin prediction with a {self.launch_us:.3g} µs "
                  f"launch cost; squares: {self.source}" if pts else
                  f"datasheet roofs; star = napkin prediction with a {self.launch_us:.3g} µs "
                  "launch cost")
        pred = draw_roofline_point(ax, spec, work, self.launch_us, points=pts, source=source)
        ax.set_title(f"{op} on the {spec.name}")
        ridge = spec.ridge_point(pred.peak_dtype)
        text = (f"{work.op} [{work.shape}, {work.dtype}]\n"
                f"{work.flops:.3g} FLOP, {work.nbytes:.3g} B -> {work.intensity:.3g} FLOP/B "
                f"(ridge {ridge:.3g} on the {pred.peak_dtype} roof)\n"
                f"memory {pred.memory_ms * 1e3:.3g} µs | compute {pred.compute_ms * 1e3:.3g} µs"
                f" | launch {pred.launch_ms * 1e3:.3g} µs\n"
                f"predicted >= {pred.time_ms * 1e3:.3g} µs: {pred.bound}-bound")
        readout_box(ax, text)
        return text


def draw_intensity_versus_size(ax, gpu: hardware.GPUSpec, sizes) -> None:
    """Lesson 02: arithmetic intensity against problem size (log-log) for a matmul, tiled and
    materialised attention (bf16; 32 heads, d = 128), with softmax and an fp32 vector add as
    flat lines and the bf16 and fp32 ridge points of ``gpu``."""
    from .. import intensity
    from . import finish

    sizes = [int(n) for n in sizes]
    ax.loglog(sizes, [intensity.matmul(n, n, n, "bf16").intensity for n in sizes],
              "o-", label="matmul n x n x n (size = n)")
    ax.loglog(sizes, [intensity.attention_tiled(32, s, 128, "bf16").intensity for s in sizes],
              "s-", label="attention, tiled (size = seq)")
    ax.loglog(sizes, [intensity.attention_materialised(32, s, 128, "bf16").intensity
                      for s in sizes], "^-", label="attention, materialised (size = seq)")
    ax.axhline(intensity.softmax(1, 4096, "bf16").intensity, color="C4", label="softmax (any size)")
    ax.axhline(intensity.vector_add(1, "fp32").intensity, color="C5", label="vector add (any size)")
    for d, ls in (("bf16", "--"), ("fp32", ":")):
        ax.axhline(gpu.ridge_point(d), color="k", ls=ls, lw=1, label=f"{gpu.key} {d} ridge point")
    finish(ax, title="Arithmetic intensity versus problem size (bf16, fp32 for vector add)",
           xlabel="problem size (n or seq)", ylabel="arithmetic intensity (FLOP/byte)",
           source="napkin math, helpers.intensity; ridge points from helpers.hardware.GPUS")
    ax.legend(fontsize=7, loc="upper left")


# The roofline record's op families and their markers (lesson 02's measured points).
FAMILIES = {"vector add": "o", "axpy": "o", "softmax": "D", "layer norm": "D", "matmul": "s",
            "attention materialised": "^", "attention tiled": "v"}


def family(point: dict) -> str:
    """The family of a measured point of the roofline record, by its name."""
    return next(f for f in FAMILIES if point["name"].startswith(f))


def plot_measured_points(gpu: hardware.GPUSpec, points: list[dict], source: str = ""):
    """The roofline of ``gpu`` (fp32 and bf16 roofs) with the roofline record's measured
    points, one marker and colour per family, each labelled by its size."""
    ax = plot(gpu, dtypes=("fp32", "bf16"), source=source, xlim=(1 / 32, 4096))
    for i, fam in enumerate(dict.fromkeys(family(p) for p in points)):
        ps = [p for p in points if family(p) == fam]
        ax.plot([p["work"]["intensity"] for p in ps], [p["tflops"] for p in ps], FAMILIES[fam],
                ls="none", ms=7, color=f"C{i + 2}", label=f"measured: {fam}")
        for j, p in enumerate(ps):  # short labels, alternately below and above the point
            ax.annotate(p["name"].replace(fam, "").replace("(flash)", "").strip(),
                        (p["work"]["intensity"], p["tflops"]), fontsize=6,
                        xytext=(4, -9 if j % 2 == 0 else 5), textcoords="offset points")
    ax.set_ylim(1e-4, 3 * gpu.peak("bf16"))
    ax.set_title(f"Common ops on the roofline of the {gpu.name}")
    ax.legend(fontsize=7, loc="upper left")
    return ax
