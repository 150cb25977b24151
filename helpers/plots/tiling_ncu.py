"""Lesson 04's ladder as Nsight Compute saw it, read from the ``tiling_ncu`` record.

One line per rung: the kernel's time, how busy DRAM, L2, the tensor pipes and the SMs were
(percent of each one's peak), achieved occupancy, registers per thread and shared memory
per block. A record made where the counters could not be read says why instead.
"""

from __future__ import annotations

from .profiles import results_of

TIME = "gpu__time_duration.sum"                       # nanoseconds
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L2 = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"
SHARED = "launch__shared_mem_per_block_dynamic"       # bytes
# The tensor pipe's busy cycles. On the H100 of the record (ncu 2025.3) wgmma's work counts
# under the hmma pipe's counter and the gmma pipe's is not reported; another GPU or ncu may
# report the gmma one instead.
TENSOR = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active")
# Not the pipe's busy time: how often a wgmma instruction is issued (2.5-6 % for the rungs of
# the record), each of which keeps the pipe busy for many cycles. Recorded, not read.
TENSOR_ISSUE = "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active"
# The SM clock during the launch, in Hz (records made before it was asked for lack it).
CLOCK = "sm__cycles_elapsed.avg.per_second"


def tensor_pct(metrics: dict) -> float | None:
    """The tensor pipe's busy share, from its cycles-active counters alone (the larger where
    both came back, as a kernel keeps one pipe busy), or None if neither did."""
    got = [metrics.get(m) for m in TENSOR if metrics.get(m) is not None]
    return max(got) if got else None


def ncu_rows(record) -> list[dict]:
    """One dict per rung: the table's columns as numbers (None where ncu gave nothing)."""
    rows = []
    for r in results_of(record)["rows"]:
        m = r["metrics"]
        shared = m.get(SHARED)
        rows.append({"rung": r.get("label") or r["rung"],
                     "ms": m[TIME] / 1e6 if m.get(TIME) is not None else None,
                     "DRAM %": m.get(DRAM), "L2 %": m.get(L2), "tensor %": tensor_pct(m),
                     "SM %": m.get(SM), "occupancy %": m.get(OCCUPANCY),
                     "regs": m.get(REGISTERS),
                     "smem KiB": shared / 1024 if shared is not None else None,
                     "SM GHz": m[CLOCK] / 1e9 if m.get(CLOCK) is not None else None})
    if all(r["SM GHz"] is None for r in rows):     # a record from before the clock was read
        for r in rows:
            del r["SM GHz"]
    return rows


_FORMATS = {"ms": "{:.3f}", "regs": "{:.0f}", "smem KiB": "{:.0f}", "SM GHz": "{:.2f}"}


def ncu_table(record) -> str:
    """The rungs as a fixed-width text table, or why the record has none."""
    res = results_of(record)
    if not res.get("available"):
        return f"Nsight Compute metrics unavailable: {res.get('reason') or 'no reason given'}"
    rows = ncu_rows(record)
    cols = list(rows[0]) if rows else ["rung"]
    width = max(len("rung"), *(len(r["rung"]) for r in rows))
    cell = lambda c, v: "-" if v is None else _FORMATS.get(c, "{:.1f}").format(v)  # noqa: E731
    lines = ["  ".join([f"{'rung':<{width}}", *(f"{c:>11}" for c in cols[1:])])]
    lines.append("-" * len(lines[0]))
    for r in rows:
        lines.append("  ".join([f"{r['rung']:<{width}}",
                                *(f"{cell(c, r[c]):>11}" for c in cols[1:])]))
    shape = "x".join(map(str, res["shape"]))
    lines.append(f"{shape} {res['dtype']}, {res.get('ncu_version') or 'ncu'}")
    label = getattr(record, "label", "")
    if label:
        lines.append(f"source: {label}")
    return "\n".join(lines)


def print_ncu_table(record) -> None:
    print(ncu_table(record))


# Hopper's tensor cores, dense fp16/bf16: 4,096 FLOPs per clock per SM, twice the A100's
# 1,024 FMAs (NVIDIA H100 Tensor Core GPU Architecture whitepaper: "2x the MMA rate of A100,
# clock-for-clock"). The datasheet's peak is this times the SMs times the clock it assumes.
HOPPER_FP16_FLOP_PER_CLOCK_PER_SM = 4096


def clock_lines(record, spec, rung: str = "v5") -> list[str]:
    """Why a tensor pipe near 95 % busy is far from the datasheet's TFLOP/s: the clock.

    From the record's ``rung`` (a Hopper GPU; ``spec`` its :class:`~helpers.hardware.GPUSpec`):
    the TFLOP/s its time gives, the clock the datasheet's peak assumes, the SM clock ncu read
    during the launch, and the peak at that clock times the pipe's busy share.
    """
    res = results_of(record)
    row = next(r for r in res["rows"] if r["rung"] == rung)
    m = row["metrics"]
    if m.get(CLOCK) is None or m.get(TIME) is None or tensor_pct(m) is None:
        raise ValueError(f"the record's {rung} row lacks the clock, the time or the tensor "
                         "pipe's counter (a record from before the clock was read?)")
    M, N, K = res["shape"]
    tflops = 2 * M * N * K / (m[TIME] * 1e-9) / 1e12
    per_clock = HOPPER_FP16_FLOP_PER_CLOCK_PER_SM * spec.sm_count
    datasheet = spec.peak(res["dtype"])
    assumed_ghz = datasheet * 1e12 / per_clock / 1e9
    ghz = m[CLOCK] / 1e9
    at_clock = per_clock * m[CLOCK] / 1e12
    busy = tensor_pct(m)
    return [
        f"{row.get('label') or rung} on {getattr(record, 'gpu', spec.name)}: "
        f"{tflops:,.0f} TFLOP/s, tensor pipe {busy:.1f} % busy",
        f"datasheet peak {datasheet:,.0f} TFLOP/s = {spec.sm_count} SMs x "
        f"{HOPPER_FP16_FLOP_PER_CLOCK_PER_SM:,} FLOP/clock x {assumed_ghz:.2f} GHz "
        f"-> {tflops / datasheet:.0%} of it",
        f"SM clock during the launch (ncu): {ghz:.2f} GHz -> peak at that clock "
        f"{at_clock:,.0f} TFLOP/s; x {busy:.1f} % busy = {at_clock * busy / 100:,.0f} TFLOP/s",
    ]
