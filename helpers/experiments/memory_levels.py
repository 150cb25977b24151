"""Lesson 01's second experiment: the L2 cache's own bandwidth, and what access order costs.

* ``read_loop``: :func:`helpers.kernels.memory_levels.read_loop` reads a buffer of 4 MiB to
  512 MiB many times over in one launch. Each size is timed at two pass counts, ``lo`` and
  ``hi`` (four times as many): the difference of the two times is the time of
  ``hi - lo`` passes alone, with the launch, the ramp-up, the cold first pass (the timer
  flushes L2 before every run) and the final write all cancelled out. That **slope** is
  the bandwidth of whichever level holds the buffer: L2 while it fits, HBM beyond.
  (Lesson 01's first record timed a copy of an L2-sized buffer in one short launch: a
  lower bound, with the launch floor inside it.)
* ``coalescing``: an 8192 x 8192 fp32 matrix (256 MiB) copied by strips of rows and by
  strips of columns, and transposed by strips and by 2-D tiles, beside PyTorch's copy and
  transposing copy. Every version moves the same bytes; only the order differs.

Every result is checked against its reference before anything is timed; each time is the
median of ``repeats`` rounds of :func:`helpers.bench.time_ms` (itself a median, cold L2),
taken in turn, with the range of the rounds kept.
"""

from __future__ import annotations

import time

import torch

from .. import bench, runtime
from ..kernels import memory_levels as ml
from . import experiment

MiB = 2**20
SIZES_MIB = (4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128, 512)
READ_BYTES = 2 * 2**30          # bytes read by the longer launch of each size (hi passes)
MATRIX_N = 8192                 # 256 MiB of fp32 per matrix, five times the largest L2
REPEATS = 3
CPU_PROGRAMS = 4                # the interpreter has no SMs: a few programs do

# A few seconds on a GPU; on a CPU it runs every check in the interpreter, then stops at
# the first timing with NeedsGPUError.
SMOKE = dict(sizes=(2**16, 2**18), read_bytes=2**20, matrix_n=96, repeats=1)


def passes_for(nbytes: int, read_bytes: int = READ_BYTES) -> tuple[int, int]:
    """(lo, hi): the two pass counts a buffer of ``nbytes`` is timed at (hi = 4 lo)."""
    lo = max(1, read_bytes // nbytes // 4)
    return lo, 4 * lo


def slope_gbps(nbytes: int, lo: int, hi: int, ms_lo: float, ms_hi: float) -> float | None:
    """Bandwidth of the passes alone: ``(hi - lo)`` passes of ``nbytes`` over the time they
    added. ``None`` when the longer run was not slower (noise swamped the difference)."""
    extra = ms_hi - ms_lo
    return (hi - lo) * nbytes / (extra * 1e-3) / 1e9 if extra > 0 else None


def summary(results: dict) -> dict:
    """The figures the lesson quotes: L2's read bandwidth (the best slope of a buffer that
    fits in half of L2, with its range over the rounds), HBM's (the largest buffer), and
    the best rate of one whole launch of an L2-sized buffer, for comparison."""
    rows = results["read_loop"]["rows"]
    l2_bytes = results["device"]["L2_cache_size"]
    inside = [r for r in rows if r["bytes"] <= l2_bytes // 2 and r["slope_gbps"]]
    if not inside:
        raise ValueError("no buffer of the sweep fits in half of L2 with a usable slope")
    best = max(inside, key=lambda r: r["slope_gbps"])
    largest = max(rows, key=lambda r: r["bytes"])
    return {"l2_gbps": best["slope_gbps"], "l2_gbps_min": best["slope_gbps_min"],
            "l2_gbps_max": best["slope_gbps_max"], "l2_buffer_bytes": best["bytes"],
            "hbm_read_gbps": largest["slope_gbps"], "hbm_buffer_bytes": largest["bytes"],
            "one_launch_gbps": max(r["one_launch_gbps"] for r in inside)}


# --------------------------------------------------------------------------------------
# Checks (they run in CPU mode too), then timings (GPU only).
# --------------------------------------------------------------------------------------


def _programs() -> int:
    if runtime.is_gpu():
        return torch.cuda.get_device_properties(0).multi_processor_count * ml.PROGRAMS_PER_SM
    return CPU_PROGRAMS


def _check_read_loop(x, sizes, read_bytes, programs) -> None:
    for nbytes in sizes:
        xs = x[: nbytes // 4]
        for passes in sorted(set((1, passes_for(nbytes, read_bytes)[0]))):
            got = ml.read_loop(xs, passes, programs).double()
            want = ml.read_loop_reference(xs, programs, passes)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-3):
                err = ((got - want).abs() / want.abs().clamp_min(1)).max().item()
                raise AssertionError(f"read_loop of {nbytes} bytes, {passes} passes, is wrong: "
                                     f"relative error {err:.3g}")


def _coalescing_versions(x, y, yt) -> dict:
    """name -> (fn, what its output must equal)."""
    return {
        "PyTorch y.copy_(x)": (lambda: y.copy_(x), x),
        "copy, strips of rows (coalesced)": (lambda: ml.copy_rows(x, out=y), x),
        "copy, strips of columns (strided)": (lambda: ml.copy_cols(x, out=y), x),
        "transpose, strips (reads coalesced, writes strided)":
            (lambda: ml.transpose_strips(x, out=yt), x.t()),
        "transpose, 2-D tiles (both coalesced)": (lambda: ml.transpose_tiles(x, out=yt), x.t()),
        "PyTorch y.copy_(x.t())": (lambda: yt.copy_(x.t()), x.t()),
    }


def _check_coalescing(versions: dict) -> None:
    for name, (fn, want) in versions.items():
        got = fn()
        if not torch.equal(got, want):
            raise AssertionError(f"{name} does not reproduce its input exactly")
        got.zero_()                   # the next version must write every element itself


def _time_read_loop(x, sizes, read_bytes, programs, repeats) -> list[dict]:
    rows = []
    for nbytes in sizes:
        xs = x[: nbytes // 4]
        lo, hi = passes_for(nbytes, read_bytes)
        out = torch.empty(programs, device=x.device, dtype=torch.float32)
        t = bench.time_rounds({
            "lo": lambda: ml.read_loop(xs, lo, programs, out=out),  # noqa: B023
            "hi": lambda: ml.read_loop(xs, hi, programs, out=out),  # noqa: B023
        }, repeats)
        per_round = [slope_gbps(nbytes, lo, hi, a, b)
                     for a, b in zip(t["lo"]["runs"], t["hi"]["runs"])]
        per_round = [s for s in per_round if s]
        rows.append({"bytes": nbytes, "passes_lo": lo, "passes_hi": hi, "lo": t["lo"],
                     "hi": t["hi"],
                     "slope_gbps": slope_gbps(nbytes, lo, hi, t["lo"]["ms"], t["hi"]["ms"]),
                     "slope_gbps_min": min(per_round, default=None),
                     "slope_gbps_max": max(per_round, default=None),
                     "one_launch_gbps": bench.gbps(hi * nbytes, t["hi"]["ms"])})
    return rows


@experiment("memory_levels")
def memory_levels(sizes=None, read_bytes: int = READ_BYTES, matrix_n: int = MATRIX_N,
                  repeats: int = REPEATS, smoke: bool = False) -> dict:
    """L2 and HBM read bandwidth in one launch, and coalesced versus strided access
    (about 20 s on an H100)."""
    if smoke:
        return memory_levels(**SMOKE)
    start = time.perf_counter()
    sizes = tuple(sizes or (s * MiB for s in SIZES_MIB))
    dev = runtime.device()
    programs = _programs()
    g = torch.Generator(device=dev).manual_seed(0)
    # Uniform in [0, 1): every sum is positive, so a relative error means something.
    x = torch.rand(max(sizes) // 4, device=dev, generator=g)
    _check_read_loop(x, sizes, read_bytes, programs)
    m = torch.randn(matrix_n, matrix_n, device=dev, generator=g)
    y, yt = torch.empty_like(m), torch.empty_like(m)
    versions = _coalescing_versions(m, y, yt)
    _check_coalescing(versions)

    runtime.require_gpu("timing the memory levels")     # everything above ran on a CPU too
    props = torch.cuda.get_device_properties(0)
    out = {"device": {"sm_count": props.multi_processor_count,
                      "L2_cache_size": props.L2_cache_size},
           "repeats": repeats}
    out["read_loop"] = {"programs": programs, "block": ml.READ_BLOCK,
                        "num_warps": ml.READ_WARPS, "read_bytes": read_bytes,
                        "rows": _time_read_loop(x, sizes, read_bytes, programs, repeats)}
    del x
    times = bench.time_rounds({k: fn for k, (fn, _) in versions.items()}, repeats)
    nbytes = ml.bytes_moved(matrix_n, matrix_n, m.dtype)
    out["coalescing"] = {"n": matrix_n, "dtype": "fp32", "bytes": nbytes,
                         "baseline": "copy, strips of rows (coalesced)",
                         "block": ml.BLOCK, "tile": ml.TILE, "num_warps": ml.NUM_WARPS,
                         "rows": [{"name": k, **t, "gbps": bench.gbps(nbytes, t["ms"])}
                                  for k, t in times.items()]}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out
