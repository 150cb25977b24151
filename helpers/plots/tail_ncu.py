"""Lesson 07's tail shape as Nsight Compute saw it, read from the ``tail_ncu`` record.

One line per kernel: its time, the bytes it read from DRAM and asked of L2, L2's hit rate,
how busy its tensor pipes were, how many programs it launched and how many output tiles its
tile makes, and its name, which for cuBLAS carries the tile it chose
(:func:`cublas_tile`). A record made where the counters could not be read says why instead.
"""

from __future__ import annotations

import re

from .fusion import format_rows
from .profiles import results_of
from .tiling_ncu import TIME, tensor_pct

DRAM_READ = "dram__bytes_read.sum"                     # bytes
L2_BYTES = "lts__t_bytes.sum"                          # bytes through L2, every client
L2_HIT = "lts__t_sector_hit_rate.pct"
GRID = "launch__grid_size"                             # programs (CTAs) launched


def _scaled(value, by):
    return None if value is None else value / by


def tail_rows(record) -> list[dict]:
    """One dict per kernel, the table's columns ("-" where ncu gave nothing)."""
    rows = []
    for r in results_of(record)["rows"]:
        m = r["metrics"]
        row = {"kernel": r.get("label") or r["rung"], "us": _scaled(m.get(TIME), 1e3),
               "DRAM read MB": _scaled(m.get(DRAM_READ), 1e6),
               "L2 MB": _scaled(m.get(L2_BYTES), 1e6), "L2 hit %": m.get(L2_HIT),
               "tensor %": tensor_pct(m), "programs": m.get(GRID), "tiles": r.get("tiles"),
               "name": (r.get("kernel") or "-")[:34]}
        rows.append({k: "-" if v is None else v for k, v in row.items()})
    return rows


def cublas_tile(record) -> tuple[int, int] | None:
    """The tile of cuBLAS's kernel, read from its name (``nvjet_sm90_tst_128x160_64x5_...``
    is 128 x 160), or None where the name carries no ``MxN`` or cuBLAS was not profiled."""
    for r in results_of(record)["rows"]:
        if r["rung"] == "cublas" and r.get("kernel"):
            found = re.search(r"_(\d+)x(\d+)_", r["kernel"])
            return (int(found[1]), int(found[2])) if found else None
    return None


def tail_table(record) -> str:
    """The kernels as a text table, with the shape, the SMs and the source, or why the
    record has no counters."""
    res = results_of(record)
    if not res.get("available"):
        return f"Nsight Compute metrics unavailable: {res.get('reason') or 'no reason given'}"
    shape = "x".join(map(str, res["shape"]))
    lines = [format_rows(tail_rows(record)),
             f"{shape} {res['dtype']} on {res.get('sms', '?')} SMs (seed {res.get('seed')}), "
             f"{res.get('ncu_version') or 'ncu'}"]
    label = getattr(record, "label", "")
    if label:
        lines.append(f"source: {label}")
    return "\n".join(lines)
