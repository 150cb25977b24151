"""Interactive figures for the lessons: move a control, watch the model answer.

Each explorer is a few ipywidgets controls wired to a drawing function with
``ipywidgets.interactive_output``; the drawing is plain matplotlib, shown inline.

Without a browser (a notebook executed by nbconvert or nbval, or opened on a site that
cannot run widgets) a widget is just a grey box. So every explorer also carries a
static picture of its current state: displaying it sends the live widget *and* a PNG
of the same figure, and each front end shows the richest one it can (JupyterLab the
live widget, a static renderer the picture). The text readout is drawn into the
figure too, so the picture stands on its own.
"""

from __future__ import annotations

import base64
import io
import math

from . import hardware, intensity, roofline
from .plots import add_source


def _figure(figsize=(8, 5)):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _readout_box(ax, text: str) -> None:
    ax.text(0.02, 0.98, text, transform=ax.transAxes, va="top", ha="left", fontsize=8,
            family="monospace", bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9,
                                      "edgecolor": "0.7"})


class Explorer:
    """Controls + a drawing function, live in JupyterLab and static everywhere else.

    Subclasses build ``self.controls`` (name -> widget) and implement
    ``draw(ax, **values) -> str``, which draws on ``ax`` and returns the readout text.
    After every redraw ``self.readout`` holds that text and ``self.values`` the
    controls' values, so tests can drive an explorer without a browser.
    """

    figsize = (8, 5)

    def __init__(self, controls: dict, layout):
        import ipywidgets as w

        self.controls = controls
        self.readout = ""
        self.values: dict = {}
        self.output = w.interactive_output(self._redraw, controls)
        self.widget = w.VBox([*layout, self.output])

    def draw(self, ax, **values) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def figure(self, **values):
        """A new matplotlib figure of the state ``values`` (default: the current one)."""
        values = {**{k: c.value for k, c in self.controls.items()}, **values}
        fig, ax = _figure(self.figsize)
        self.readout = self.draw(ax, **values)
        self.values = values
        fig.tight_layout()
        return fig

    def _redraw(self, **values) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        fig = self.figure(**values)
        display(fig)
        plt.close(fig)

    def static_png(self) -> str:
        """The current state as a base64 PNG (what a static renderer shows)."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        try:
            return _png(fig)
        finally:
            plt.close(fig)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.widget._repr_mimebundle_()
        bundle["image/png"] = self.static_png()
        bundle["text/plain"] = self.readout
        return bundle

    def __repr__(self) -> str:
        return self.readout


# --------------------------------------------------------------------------------------
# Lesson 01: time versus size, from launch latency to HBM bandwidth.
# --------------------------------------------------------------------------------------


def _interp_loglog(x: float, xs, ys) -> float:
    """Interpolate ``ys(x)`` linearly in log-log space (sizes and times span decades)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    raise ValueError("sizes must be increasing")


def draw_size_sweep(ax, sweep: list[dict], peak_gbps: float, marker_bytes: float | None = None,
                    source: str = "") -> dict:
    """Copy time versus bytes moved (log-log): measured cold and warm, and the model.

    Returns the launch floor and, if ``marker_bytes`` is given, the interpolated
    measurement there.
    """
    xs = [r["bytes"] for r in sweep]
    cold_us = [r["cold_ms"] * 1e3 for r in sweep]
    warm_us = [r["warm_ms"] * 1e3 for r in sweep]
    floor_us = min(cold_us)
    ax.loglog(xs, cold_us, "o-", ms=4, label="measured, L2 flushed before each run")
    ax.loglog(xs, warm_us, "s--", ms=3, label="measured, data already in L2 (back to back)")
    if "wall_us_per_call" in sweep[0]:
        ax.loglog(xs, [r["wall_us_per_call"] for r in sweep], ":", color="0.5",
                  label="host clock per call from a Python loop")
    model = [max(floor_us, b / (peak_gbps * 1e9) * 1e6) for b in xs]
    ax.loglog(xs, [b / (peak_gbps * 1e9) * 1e6 for b in xs], color="k", lw=1,
              label=f"bytes / datasheet bandwidth ({peak_gbps:,.0f} GB/s)")
    ax.axhline(floor_us, color="C3", lw=1, ls="-.",
               label=f"launch floor: {floor_us:.3g} µs (smallest measured time)")
    info = {"floor_us": floor_us, "model_us": model}
    if marker_bytes is not None:
        t = _interp_loglog(marker_bytes, xs, cold_us)
        ax.plot([marker_bytes], [t], "*", color="C3", ms=16, zorder=5)
        info["marker_us"] = t
    ax.set_xlabel("bytes moved per copy (read + write, B)")
    ax.set_ylabel("time per copy (µs)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    if source:
        add_source(ax, source)
    return info


def _fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.4g} {unit}"
    return f"{b:.0f} B"


class SizeExplorer(Explorer):
    """Lesson 01: pick a copy size, see where it falls: latency-bound or bandwidth-bound."""

    figsize = (8, 5)

    def __init__(self, sweep: list[dict], peak_gbps: float, gpu_name: str, source: str,
                 log2_bytes: int | None = None):
        import ipywidgets as w

        if not sweep:
            raise ValueError("the size sweep is empty: pass record.results['size_sweep']")
        self.sweep = sorted(sweep, key=lambda r: r["bytes"])
        self.peak_gbps = float(peak_gbps)
        self.gpu_name = gpu_name
        self.source = source
        lo = math.ceil(math.log2(self.sweep[0]["bytes"]))
        hi = math.floor(math.log2(self.sweep[-1]["bytes"]))
        default = log2_bytes if log2_bytes is not None else (lo + hi) // 2
        slider = w.IntSlider(value=min(max(default, lo), hi), min=lo, max=hi, step=1,
                             description="log2(bytes)", continuous_update=False)
        super().__init__({"log2_bytes": slider}, [slider])

    def draw(self, ax, log2_bytes: int) -> str:
        nbytes = 2.0**log2_bytes
        info = draw_size_sweep(ax, self.sweep, self.peak_gbps, marker_bytes=nbytes,
                               source=self.source)
        t_us = info["marker_us"]
        gbps = nbytes / (t_us * 1e-6) / 1e9
        transfer_us = nbytes / (self.peak_gbps * 1e9) * 1e6
        regime = "latency-bound" if transfer_us < info["floor_us"] else "bandwidth-bound"
        ax.set_title(f"Copy time versus size on the {self.gpu_name}")
        text = (f"copy moving {_fmt_bytes(nbytes)}: measured {t_us:.3g} µs\n"
                f"effective bandwidth {gbps:,.0f} GB/s = {100 * gbps / self.peak_gbps:.1f}% "
                f"of peak\nat peak bandwidth the bytes alone take {transfer_us:.3g} µs: "
                f"{regime}")
        _readout_box(ax, text)
        return text


# --------------------------------------------------------------------------------------
# Lesson 02: an op of your choice on the roofline of a GPU of your choice.
# --------------------------------------------------------------------------------------


def draw_roofline_point(ax, gpu: hardware.GPUSpec, work: intensity.Work, launch_us: float,
                        points=(), source: str = "") -> intensity.Prediction:
    """The roofline of ``gpu`` with ``work`` placed at its predicted throughput."""
    pred = intensity.predict(work, gpu, launch_us=launch_us)
    dtypes = tuple(dict.fromkeys([pred.peak_dtype, work.dtype]))
    dtypes = tuple(d for d in dtypes if d in gpu.peak_tflops)
    roofline.plot(gpu, dtypes=dtypes, points=points, ax=ax, source=source or None,
                  xlim=(1 / 16, 8192))
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
        if op not in intensity.CATALOGUE:
            raise KeyError(f"{op!r} is not an op of helpers.intensity.CATALOGUE: "
                           f"{', '.join(intensity.CATALOGUE)}")
        if dtype not in self._dtypes(gpu):
            raise ValueError(f"the {gpu} has no {dtype!r} peak in the table; pick one of "
                             f"{self._dtypes(gpu)}")
        self.launch_us = float(launch_us)
        self.points = tuple(points)
        self.points_gpu = points_gpu
        self.source = source
        entry = intensity.CATALOGUE[op]
        lo, hi = entry.log2_range
        gpu_w = w.Dropdown(options=list(hardware.GPUS), value=gpu, description="GPU")
        dtype_w = w.Dropdown(options=self._dtypes(gpu), value=dtype, description="dtype")
        op_w = w.Dropdown(options=list(intensity.CATALOGUE), value=op, description="op")
        size_w = w.IntSlider(value=log2_size if log2_size is not None else entry.log2_default,
                             min=lo, max=hi, description="log2(size)", continuous_update=False)
        self.size_label = w.Label(entry.size_label)
        gpu_w.observe(self._on_gpu, "value")
        op_w.observe(self._on_op, "value")
        controls = {"gpu": gpu_w, "dtype": dtype_w, "op": op_w, "log2_size": size_w}
        super().__init__(controls, [w.HBox([gpu_w, dtype_w]), w.HBox([op_w, size_w,
                                                                         self.size_label])])

    @staticmethod
    def _dtypes(gpu_key: str) -> list[str]:
        # Storage types this GPU can compute on; tf32 is an fp32 compute mode, not storage.
        return [d for d in hardware.GPUS[gpu_key].peak_tflops if d != "tf32"]

    def _on_gpu(self, change) -> None:
        dtype_w = self.controls["dtype"]
        options = self._dtypes(change["new"])
        keep = dtype_w.value if dtype_w.value in options else options[-1]
        dtype_w.options = options
        dtype_w.value = keep

    def _on_op(self, change) -> None:
        entry = intensity.CATALOGUE[change["new"]]
        size_w = self.controls["log2_size"]
        lo, hi = entry.log2_range
        size_w.min, size_w.max = min(lo, size_w.min), max(hi, size_w.max)  # widen first
        size_w.value = entry.log2_default
        size_w.min, size_w.max = lo, hi
        self.size_label.value = entry.size_label

    def prediction(self, gpu: str, dtype: str, op: str, log2_size: int) -> intensity.Prediction:
        work = intensity.work_for(op, 2**log2_size, dtype)
        return intensity.predict(work, hardware.GPUS[gpu], launch_us=self.launch_us)

    def draw(self, ax, gpu: str, dtype: str, op: str, log2_size: int) -> str:
        spec = hardware.GPUS[gpu]
        work = intensity.work_for(op, 2**log2_size, dtype)
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
        _readout_box(ax, text)
        return text
