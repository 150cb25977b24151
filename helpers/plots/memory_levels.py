"""Lesson 01's memory levels, drawn from the ``memory_levels`` record: read bandwidth against
the size of the buffer read (L2, then HBM), and the same copy in different orders.

Tables are lists of dicts for :func:`helpers.plots.fusion.format_rows`; every figure names
its source, the record's label.
"""

from __future__ import annotations

from . import finish

MiB = 2**20


def read_sweep_rows(results: dict) -> list[dict]:
    """One line per buffer size: the two pass counts, the rate of one whole launch, and the
    rate of the extra passes alone (the slope) with its range over the rounds."""
    rows = []
    for r in results["read_loop"]["rows"]:
        rows.append({"buffer MiB": r["bytes"] / MiB, "passes": f"{r['passes_lo']}/{r['passes_hi']}",
                     "one launch GB/s": r["one_launch_gbps"],
                     "passes alone GB/s": r["slope_gbps"] or float("nan"),
                     "range": _range(r["slope_gbps_min"], r["slope_gbps_max"])})
    return rows


def _range(lo, hi) -> str:
    return "-" if lo is None or hi is None else f"{lo:,.0f} to {hi:,.0f}"


def draw_read_sweep(ax, results: dict, hbm_gbps: float, source: str):
    """GB/s of the looped read against buffer size, with L2's size and HBM's datasheet rate."""
    rows = results["read_loop"]["rows"]
    mib = [r["bytes"] / MiB for r in rows]
    slope = [r["slope_gbps"] or float("nan") for r in rows]
    low = [s - (r["slope_gbps_min"] or s) for s, r in zip(slope, rows)]
    high = [(r["slope_gbps_max"] or s) - s for s, r in zip(slope, rows)]
    ax.errorbar(mib, slope, yerr=[low, high], fmt="o-", ms=4, capsize=3,
                label="extra passes alone (slope of time against passes; bars: range of rounds)")
    ax.plot(mib, [r["one_launch_gbps"] for r in rows], "s--", ms=3, color="C1",
            label="one whole launch, cold first pass and launch included")
    l2 = results["device"]["L2_cache_size"] / MiB
    ax.axvline(l2, color="C2", ls=":", label=f"L2 size: {l2:.0f} MiB")
    ax.axhline(hbm_gbps, color="k", lw=1, label=f"HBM datasheet: {hbm_gbps:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, None)
    return finish(ax, title="Reading a buffer many times in one launch",
                  xlabel="buffer size (MiB)", ylabel="read bandwidth (GB/s)", source=source)


def coalescing_rows(results: dict) -> list[dict]:
    """One line per version of the 8192 x 8192 copy: time (median and range), GB/s, and how
    many times slower than the coalesced copy by strips of rows."""
    c = results["coalescing"]
    base = next(r for r in c["rows"] if r["name"] == c["baseline"])["ms"]
    return [{"version": r["name"], "us": 1e3 * r["ms"],
             "range us": f"{1e3 * r['ms_min']:,.0f} to {1e3 * r['ms_max']:,.0f}",
             "GB/s": r["gbps"], "time vs rows": r["ms"] / base} for r in c["rows"]]
