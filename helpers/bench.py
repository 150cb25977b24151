"""Timing kernels on a GPU, and turning times into GB/s, TFLOP/s and fractions of peak.

Three rules, each a lesson learned the hard way:

* **Warm up.** The first call of a Triton kernel compiles it; the first cuBLAS call
  picks an algorithm. Time only what follows.
* **Take the median of many runs.** GPU launches are asynchronous and clocks vary;
  the median ignores the odd slow run that a mean would absorb.
* **Start each run with a cold L2.** Repeating a kernel on the same 40 MB of inputs
  would otherwise time the 50 MB L2 cache, not HBM. ``triton.testing.do_bench`` writes
  a 256 MB buffer between runs, which evicts everything.

Timing is refused in CPU mode (:class:`~helpers.runtime.NeedsGPUError`): the
interpreter's speed says nothing about a GPU. Notebooks show recorded runs instead
(:mod:`helpers.records`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton.testing

from . import runtime
from .dtypes import dtype_key


def time_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in milliseconds, after warm-up, each run with a cold L2."""
    runtime.require_gpu("timing a kernel")
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def time_graph_ms(fn: Callable[[], object], warmup_ms: float = 25,
                  rep_ms: float = 100) -> float:
    """Like :func:`time_ms`, of the GPU's work alone: one call of ``fn`` captured in a CUDA
    graph, and the graph replayed. A call of several launches leaves the GPU idle while the
    host prepares the next (Python, checks, allocations); a graph replays them back to back,
    as a host that runs ahead of its GPU does."""
    runtime.require_gpu("timing a kernel")
    fn()                                    # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, warmup_ms, rep_ms)


def spread(runs) -> dict:
    """Several medians of one thing as ``{"ms": their median, "ms_min", "ms_max", "runs"}``
    (``runs`` in the order they were taken)."""
    runs = [float(r) for r in runs]
    if not runs:
        raise ValueError("spread() needs at least one timing")
    ordered, mid = sorted(runs), len(runs) // 2
    median = ordered[mid] if len(runs) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"ms": median, "ms_min": ordered[0], "ms_max": ordered[-1], "runs": runs}


def time_rounds(fns: dict[str, Callable[[], object]], rounds: int = 3, **options) -> dict:
    """:func:`time_ms` of every ``name -> fn``, ``rounds`` times, in turn (A B C, A B C, ...),
    so a GPU that warms up and slows down over the run slows all of them alike.

    Returns ``name -> spread(...)``: the median of the rounds' medians and their range.
    """
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            runs[name].append(time_ms(fn, **options))
    return {name: spread(r) for name, r in runs.items()}


def gbps(nbytes: float, ms: float) -> float:
    """Bytes moved in ``ms`` milliseconds as GB/s (10^9 bytes per second)."""
    _check_time(ms)
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """FLOPs done in ``ms`` milliseconds as TFLOP/s (10^12 per second)."""
    _check_time(ms)
    return flops / (ms * 1e-3) / 1e12


def fraction_of_peak(achieved: float, peak: float) -> float:
    """``achieved / peak``, both in the same unit (GB/s with GB/s, TFLOP/s with TFLOP/s)."""
    if peak <= 0:
        raise ValueError(f"peak must be positive, got {peak}")
    return achieved / peak


def geomean(ratios) -> float:
    """The geometric mean of ratios (speed-ups over a sweep): a 2x and a 0.5x average to 1x,
    as they should, where their arithmetic mean would say 1.25x."""
    ratios = list(ratios)
    if not ratios or any(not r > 0 for r in ratios):
        raise ValueError(f"a geometric mean needs positive ratios, got {ratios!r:.200}")
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def _check_time(ms: float) -> None:
    if not ms > 0:
        raise ValueError(f"a time must be positive milliseconds, got {ms!r}")


@dataclass(frozen=True)
class Measurement:
    """One implementation timed once (median), with the work it does."""

    name: str
    ms: float
    nbytes: float = 0.0
    flops: float = 0.0

    @property
    def gbps(self) -> float:
        return gbps(self.nbytes, self.ms)

    @property
    def tflops(self) -> float:
        return tflops(self.flops, self.ms)

    def as_dict(self) -> dict:
        return {"name": self.name, "ms": self.ms, "bytes": self.nbytes, "flops": self.flops}

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        return cls(name=d["name"], ms=d["ms"], nbytes=d.get("bytes", 0.0), flops=d.get("flops", 0.0))


@dataclass
class Comparison:
    """Several implementations of one op, timed side by side in one process.

    ``baseline`` names the row the ratios are taken against (usually PyTorch).
    ``peak_gbps`` / ``peak_tflops`` turn rates into fractions of the device's peak.
    ``source`` says where the numbers came from ("measured on ..." or a record label).
    """

    title: str
    rows: list[Measurement]
    baseline: str
    peak_gbps: float | None = None
    peak_tflops: float | None = None
    source: str = ""

    def __post_init__(self):
        names = [r.name for r in self.rows]
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not one of the rows {names}")

    def row(self, name: str) -> Measurement:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row named {name!r}; rows: {[r.name for r in self.rows]}")

    def speedup(self, name: str) -> float:
        """How many times faster ``name`` runs than the baseline."""
        return self.row(self.baseline).ms / self.row(name).ms

    def table(self) -> list[dict]:
        out = []
        for r in self.rows:
            entry = {"implementation": r.name, "time (ms)": r.ms,
                     f"speed-up vs {self.baseline}": self.speedup(r.name)}
            if r.nbytes:
                entry["GB/s"] = r.gbps
                if self.peak_gbps:
                    entry["% of peak GB/s"] = 100 * fraction_of_peak(r.gbps, self.peak_gbps)
            if r.flops:
                entry["TFLOP/s"] = r.tflops
                if self.peak_tflops:
                    entry["% of peak TFLOP/s"] = 100 * fraction_of_peak(r.tflops, self.peak_tflops)
            out.append(entry)
        return out

    def to_text(self) -> str:
        rows = self.table()
        cols = list(dict.fromkeys(k for row in rows for k in row))
        cells = [[_fmt(row.get(c, "")) for c in cols] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
        line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w)  # noqa: E731
                                      for i, (v, w) in enumerate(zip(vals, widths)))
        text = [self.title, line(cols), line(["-" * w for w in widths])]
        text += [line(r) for r in cells]
        if self.source:
            text.append(f"({self.source})")
        return "\n".join(text)

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        rows = self.table()
        cols = list(dict.fromkeys(k for row in rows for k in row))
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = "".join(
            "<tr>" + "".join(f"<td>{_fmt(row.get(c, ''))}</td>" for c in cols) + "</tr>"
            for row in rows
        )
        caption = f"<caption>{self.title}</caption>"
        note = f"<p><em>{self.source}</em></p>" if self.source else ""
        return f"<table>{caption}<tr>{head}</tr>{body}</table>{note}"

    def as_dict(self) -> dict:
        return {"title": self.title, "baseline": self.baseline, "peak_gbps": self.peak_gbps,
                "peak_tflops": self.peak_tflops, "rows": [r.as_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "Comparison":
        return cls(title=d["title"], rows=[Measurement.from_dict(r) for r in d["rows"]],
                   baseline=d["baseline"], peak_gbps=d.get("peak_gbps"),
                   peak_tflops=d.get("peak_tflops"), source=source)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def compare(
    title: str,
    implementations: dict[str, Callable[[], object]],
    *,
    baseline: str,
    nbytes: float = 0.0,
    flops: float = 0.0,
    gpu=None,
    dtype=None,
) -> Comparison:
    """Time every implementation in this process, one after the other, and tabulate.

    All of them do the same work (``nbytes`` moved, ``flops`` done), so the ratios are
    ratios of time. ``gpu`` (a :class:`~helpers.hardware.GPUSpec`; pass
    ``hardware.current_gpu()`` for the one in use) and ``dtype`` give the peaks for the
    "% of peak" columns; without ``gpu`` those columns stay empty.
    """
    runtime.require_gpu("comparing implementations")
    rows = [Measurement(name, time_ms(fn), nbytes, flops) for name, fn in implementations.items()]
    return Comparison(
        title=title,
        rows=rows,
        baseline=baseline,
        peak_gbps=gpu.hbm_bandwidth_gbs if gpu else None,
        peak_tflops=gpu.peak(dtype) if (gpu and dtype is not None and flops) else None,
        source=f"measured now on {torch.cuda.get_device_name()}",
    )


# --------------------------------------------------------------------------------------
# Probes: the two ceilings of the GPU in hand, measured (helpers.hardware holds the
# datasheet figures they are compared with).
# --------------------------------------------------------------------------------------


def measure_copy_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Copy a large buffer device-to-device; count bytes read plus bytes written.

    A copy is the simplest memory-bound kernel: every byte is read once and written
    once, no arithmetic. What it reaches is the practical ceiling for any kernel that
    streams memory. 2 GiB is far larger than any L2, so the cache cannot help.
    """
    runtime.require_gpu("measuring copy bandwidth")
    n = nbytes // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    assert torch.equal(dst, src), "copy probe produced a wrong result"
    moved = 2 * n * 4
    return {"bytes": moved, "ms": ms, "gbps": gbps(moved, ms)}


def measure_matmul_tflops(n: int = 8192, dtype=None) -> dict:
    """Time an ``n x n x n`` matrix product through cuBLAS (torch.matmul) on random data.

    Random, not zeros: tensor cores draw less power on zeros and can run faster than
    they will on real data.
    """
    runtime.require_gpu("measuring matmul throughput")
    dtype = dtype or torch.bfloat16
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_ms(lambda: torch.matmul(a, b))
    flops = 2 * n**3
    return {"n": n, "dtype": dtype_key(dtype), "flops": flops, "ms": ms,
            "tflops": tflops(flops, ms)}
