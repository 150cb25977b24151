"""Run-to-run noise, read from the ``noise`` record: the course's one cuBLAS reference per
GPU, its spread over rounds, the spread of two identical launches, and the clock and power
behind them (lesson 02; lessons 01-05 cite the reference).
"""

from __future__ import annotations

from . import finish
from .profiles import results_of


def cublas_reference(record, key: str = "bf16 8192^3") -> dict:
    """torch.matmul's TFLOP/s for ``key`` (``"bf16 8192^3"``, ``"fp16 4096^3"``, ...): the
    median over the record's rounds, the least and the most, and the spread (max - min over
    the median), with the record's label as ``source``."""
    refs = results_of(record)["reference"]
    if key not in refs:
        raise KeyError(f"the noise record has no reference {key!r}; it has: {', '.join(refs)}")
    r = refs[key]
    return {"key": key, "tflops_median": r["tflops_median"], "tflops_min": r["tflops_min"],
            "tflops_max": r["tflops_max"],
            "spread": (r["tflops_max"] - r["tflops_min"]) / r["tflops_median"],
            "rounds": len(r["rounds"]), "source": getattr(record, "label", "")}


def identical_gap(record) -> dict:
    """The two identical launches: each one's median, and how far apart they came, as a
    fraction of the slower: between their medians, and at most between any two rounds."""
    same = results_of(record)["identical_configs"]
    a, b = same["a"], same["b"]
    lo, hi = sorted((a["tflops_median"], b["tflops_median"]))
    every = [r["tflops"] for r in a["rounds"] + b["rounds"]]
    return {"a": a["tflops_median"], "b": b["tflops_median"], "medians": hi / lo - 1,
            "rounds": max(every) / min(every) - 1, "config": same["config"]}


def _mean(values):
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def spread_table(record) -> str:
    """One line per product: median, min and max TFLOP/s over the rounds, the spread in %,
    and the mean SM clock and power over its rounds; then the identical launches."""
    res = results_of(record)
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    rows = [(k, r) for k, r in res["reference"].items()]
    rows += [(f"identical {name} ({res['identical_configs']['config']['label']})",
              res["identical_configs"][name]) for name in ("a", "b")]
    width = max(len(k) for k, _ in rows)
    head = (f"{'product':<{width}}  {'median':>7}  {'min':>7}  {'max':>7}  {'spread':>7}  "
            f"{'SM MHz':>7}  {'power W':>7}")
    lines = [f"TFLOP/s over {res.get('rounds', len(rows[0][1]['rounds']))} rounds", head,
             "-" * len(head)]
    for key, r in rows:
        spread = 100 * (r["tflops_max"] - r["tflops_min"]) / r["tflops_median"]
        lines.append(f"{key:<{width}}  {r['tflops_median']:>7.1f}  {r['tflops_min']:>7.1f}  "
                     f"{r['tflops_max']:>7.1f}  {spread:>6.1f}%  "
                     f"{fmt(_mean(x['sm_clock_mhz'] for x in r['rounds']), '.0f'):>7}  "
                     f"{fmt(_mean(x['power_w'] for x in r['rounds']), '.0f'):>7}")
    clocks = res.get("clocks", {})
    lines.append(f"max SM clock {fmt(clocks.get('max_sm_mhz'), '.0f')} MHz, "
                 f"power limit {fmt(clocks.get('power_limit_w'), '.0f')} W")
    label = getattr(record, "label", "")
    if label:
        lines.append(f"source: {label}")
    return "\n".join(lines)


def sustained_summary(record, near: float = 0.95) -> dict | None:
    """The sustained run in two numbers each: its first window (the GPU fresh from idling)
    and the median of the windows drawing at least ``near`` of the power limit (TFLOP/s, SM
    clock, power). None if the record has no sustained run or no power readings."""
    import statistics

    res = results_of(record)
    windows = res.get("sustained", {}).get("windows", [])
    limit = res.get("clocks", {}).get("power_limit_w")
    if not windows or limit is None or any(w["power_w"] is None for w in windows):
        return None
    capped = [w for w in windows if w["power_w"] >= near * limit]
    if not capped:
        return None
    pick = ("tflops", "sm_clock_mhz", "power_w")
    return {"first": {k: windows[0][k] for k in pick},
            "at_limit": {k: statistics.median(w[k] for w in capped) for k in pick},
            "reached_s": capped[0]["t_s"], "windows_at_limit": len(capped),
            "windows": len(windows), "power_limit_w": limit, "key": res["sustained"]["key"]}


def plot_rounds(record, key: str = "bf16 8192^3", axes=None):
    """Left: the TFLOP/s of each round of ``key`` beside its SM clock. Middle and right (if
    the record has a sustained run): TFLOP/s and SM clock, then power against the power
    limit, as the same product runs back to back after the GPU idled."""
    import matplotlib.pyplot as plt

    res = results_of(record)
    source = getattr(record, "label", "") or "noise record"
    windows = res.get("sustained", {}).get("windows", [])
    if axes is None:
        _, axes = plt.subplots(1, 3 if windows else 1, figsize=(16, 3.8) if windows else (6, 3.8),
                               squeeze=False)
        axes = list(axes[0])
    ax = axes[0]
    rounds = res["reference"][key]["rounds"]
    idx = list(range(1, len(rounds) + 1))
    ax.plot(idx, [r["tflops"] for r in rounds], "o-", label=f"torch.matmul {key}")
    clock = _clock_axis(ax, idx, [r["sm_clock_mhz"] for r in rounds])
    finish(ax, title=f"cuBLAS {key}, round by round", xlabel="round",
           ylabel="TFLOP/s", source=source)
    _legend(ax, clock)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if windows:
        _draw_sustained(axes[1], axes[2], res, source)
    plt.tight_layout()
    return axes


def _draw_sustained(ax, ax_power, res, source) -> None:
    windows = res["sustained"]["windows"]
    t = [w["t_s"] for w in windows]
    ax.plot(t, [w["tflops"] for w in windows], ".-", color="C2",
            label=f"{res['sustained']['key']}, back to back")
    clock = _clock_axis(ax, t, [w["sm_clock_mhz"] for w in windows])
    finish(ax, title="a sustained run after idling", xlabel="time since start (s)",
           ylabel="TFLOP/s", source=source)
    _legend(ax, clock)
    ax_power.plot(t, [w["power_w"] if w["power_w"] is not None else float("nan")
                      for w in windows], ".-", color="C1", label="power draw")
    limit = res.get("clocks", {}).get("power_limit_w")
    if limit is not None:
        ax_power.axhline(limit, ls="--", color="0.3", label=f"power limit ({limit:.0f} W)")
    finish(ax_power, title="the same run's power", xlabel="time since start (s)",
           ylabel="power (W)", source=source)


def _clock_axis(ax, x, clocks):
    """The SM clock on a second y axis (None if the record has no clock readings)."""
    if all(c is None for c in clocks):
        return None
    twin = ax.twinx()
    (line,) = twin.plot(x, [c if c is not None else float("nan") for c in clocks], "s--",
                        ms=3, color="C3", label="SM clock (right axis)")
    twin.set_ylabel("SM clock (MHz)", color="C3")
    return line


def _legend(ax, clock) -> None:
    if clock is not None:
        ax.legend(handles=[*ax.get_lines(), clock], fontsize=8)
