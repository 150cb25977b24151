"""The FP8 lesson's pictures: every number the two formats hold, and what each scaling
costs in accuracy as outliers grow (:mod:`helpers.experiments.fp8`)."""

from __future__ import annotations

import torch

from ..kernels import fp8
from . import finish


def representable(fmt) -> torch.Tensor:
    """Every finite positive value of an FP8 format, ascending (all 256 bit patterns
    read as the format, the negative, zero, inf and NaN ones left out)."""
    fmt = fp8.format_of(fmt)
    values = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(fmt.dtype).float()
    return values[torch.isfinite(values) & (values > 0)].unique()


def plot_formats(ax=None):
    """Each format's positive values on a log axis, and the gap to the next one over the
    value (the relative spacing): e4m3 finer, e5m2 wider; both step up by a power of two."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    for i, name in enumerate(fp8.FORMATS):
        v = representable(name)
        gap = (v[1:] - v[:-1]) / v[:-1]
        ax.step(v[:-1], gap, where="post", color=f"C{i}",
                label=f"{name}: {v[0].item():.3g} to {v[-1].item():,.0f}, {len(v)} values")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    finish(ax, title="FP8: where the numbers are", xlabel="value (log scale)",
           ylabel="gap to the next value / value",
           source="every bit pattern of torch.float8_e4m3fn and torch.float8_e5m2")
    return ax


def plot_accuracy(table: list[dict], source: str, ax=None):
    """Relative error of the product against float64 as the outliers grow, one line a
    version (``table``: :func:`helpers.experiments.fp8.accuracy_table`'s rows)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    scales = [r["outlier_scale"] for r in table]
    for i, name in enumerate(table[0]["errors"]):
        ax.plot(scales, [r["errors"][name] for r in table], marker="o", color=f"C{i}",
                label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    finish(ax, title="FP8 products against float64, activations with outlier channels",
           xlabel="outlier channels' size (times the rest)",
           ylabel="relative error ||C - C64|| / ||C64||", source=source)
    return ax
