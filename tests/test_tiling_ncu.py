"""The tiling_ncu experiment (Nsight Compute metrics of lesson 04's ladder): every rung's
launch checked in CPU mode, ncu's raw CSV parsed, a machine without ncu or without counter
access gives a record that says so, and the committed GPU record (skipped until there is one)
has a row per rung."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest

from helpers.experiments import tiling_ncu as experiment
from helpers.experiments.tiling import STEPS
from helpers.plots import tiling_ncu as plots
from helpers.runtime import NeedsGPUError
from support import committed_record

# ncu --csv --page raw --print-units base: a header row of metric names, a row of units, one
# row per kernel; ncu's own lines (==PROF==) and the program's output around the table.
SAMPLE = '''\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "matmul_kernel_v3" - 0: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",\
"Grid Size","Device","CC","dram__bytes_read.sum","gpu__time_duration.sum",\
"launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","Mbyte","usecond","register/thread","%"
"0","4242","python3.12","127.0.0.1","matmul_kernel_v3","1","7","(256, 1, 1)","(512, 1, 1)",\
"0","9.0","103.81","1,412.74","168","12.48"
'''
METRICS = ("dram__bytes_read.sum", "gpu__time_duration.sum", "launch__registers_per_thread",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "lts__throughput.avg.pct")


def test_parse_csv_reads_the_kernel_row_in_base_units():
    (row,) = experiment.parse_csv(SAMPLE, METRICS)
    assert row["kernel"] == "matmul_kernel_v3"
    m = row["metrics"]
    assert m["dram__bytes_read.sum"] == pytest.approx(103.81e6)       # Mbyte -> bytes
    assert m["gpu__time_duration.sum"] == pytest.approx(1412.74e3)    # usecond -> ns
    assert m["launch__registers_per_thread"] == 168
    assert m["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(12.48)
    assert m["lts__throughput.avg.pct"] is None, "a metric ncu did not return is None"


def test_parse_csv_of_output_without_a_table_is_empty():
    assert experiment.parse_csv("==PROF== No kernels were profiled.\n", METRICS) == []


def test_refused_metrics_and_unavailable_reasons_are_recognised():
    out = "==ERROR== Failed to find metric sm__pipe_tensor_op_hmma_cycles_active.avg.pct\n"
    assert experiment.rejected_metrics(out, ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct",
                                             "dram__bytes_read.sum"]) == [
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct"]
    perm = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
            "GPU Performance Counters on the target device 0.")
    assert experiment.unavailable_reason(perm, 1).startswith("ERR_NVGPUCTRPERM")
    assert experiment.unavailable_reason(SAMPLE, 0) is None


def test_the_command_profiles_one_launch_in_the_profiler_range():
    cmd = experiment.command("ncu", ["a.sum", "b.sum"], "matmul_kernel_v3", "d.py", "v3",
                             4096, "fp16")
    text = " ".join(cmd)
    assert "--clock-control none" in text and "--csv --page raw" in text
    assert "--profile-from-start off" in text and "--launch-count 1" in text
    assert "--metrics a.sum,b.sum" in text and "-k regex:matmul_kernel_v3" in text
    assert cmd[-3:] == ["v3", "4096", "fp16"]
    assert "-k" not in experiment.command("ncu", ["a.sum"], None, "d.py", "cublas", 8, "fp16")


def test_without_ncu_the_record_says_so():
    got = experiment.collect(None, experiment.rungs(), 4096, "fp16")
    assert got["available"] is False and got["reason"] == "ncu not found"
    assert got["rows"] == [] and got["shape"] == [4096, 4096, 4096]


def test_without_counter_access_the_record_says_so(tmp_path):
    def run(cmd, env):
        if "--version" in cmd:
            return 0, "NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0\n"
        return 1, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"

    got = experiment.collect("ncu", experiment.rungs(), 4096, "fp16", run=run,
                             workdir=str(tmp_path))
    assert got["available"] is False and got["reason"].startswith("ERR_NVGPUCTRPERM")
    assert got["ncu_version"] == "Version 2025.3.1.0"


def test_a_refused_metric_is_dropped_and_recorded_as_null(tmp_path):
    calls = []

    def run(cmd, env):
        if "--version" in cmd:
            return 0, "Version 2025.3.1.0"
        asked = cmd[cmd.index("--metrics") + 1].split(",")
        calls.append(asked)
        bad = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
        if bad in asked:
            return 1, f"==ERROR== Failed to find metric {bad}\n"
        assert env["NCCL_NVLS_ENABLE"] == "0"
        return 0, SAMPLE

    got = experiment.collect("ncu", experiment.rungs()[:2], 4096, "fp16", run=run,
                             workdir=str(tmp_path))
    assert got["available"] and got["reason"] is None
    assert len(calls) == 3, "one retry for the first rung, then the accepted list"
    assert [r["rung"] for r in got["rows"]] == [STEPS[0][0], STEPS[1][0]]
    assert got["rows"][0]["metrics"]["dram__bytes_read.sum"] == pytest.approx(103.81e6)
    assert "dram__bytes_read.sum" in got["metrics_returned"]


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run profiles")
def test_smoke_run_checks_every_rung_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.tiling_ncu(smoke=True)


def _results(rows, available=True, reason=None):
    return {"available": available, "reason": reason, "ncu_version": "Version 2025.3.1.0",
            "shape": [4096, 4096, 4096], "dtype": "fp16", "rows": rows}


def test_ncu_table_prints_a_line_per_rung_and_says_why_when_unavailable():
    m = {plots.TIME: 412_736.0, plots.DRAM: 31.2, plots.L2: 45.0, plots.TENSOR[0]: 0.0,
         plots.TENSOR[1]: 71.5, plots.SM: 70.0, plots.OCCUPANCY: 12.5, plots.REGISTERS: 168.0,
         plots.SHARED: 131072.0}
    text = plots.ncu_table(_results([{"rung": "v3", "label": "v3 grouped order",
                                      "kernel": "matmul_kernel_v3", "metrics": m}]))
    line = text.splitlines()[2]
    assert line.startswith("v3 grouped order") and "0.413" in line and "71.5" in line
    assert line.split()[-2:] == ["168", "128"], "registers, then shared memory in KiB"
    assert plots.ncu_table(_results([], False, "ncu not found")).endswith("ncu not found")


def test_the_sm_clock_is_a_column_when_the_record_read_it():
    m = {plots.TIME: 412_736.0, plots.TENSOR[0]: 95.0, plots.REGISTERS: 168.0}
    row = {"rung": "cublas", "label": "cuBLAS", "kernel": "sm90_xmma", "metrics": m}
    assert "SM GHz" not in plots.ncu_table(_results([row])), "no clock read: no column"
    clocked = dict(row, metrics={**m, plots.CLOCK: 1.755e9})
    text = plots.ncu_table(_results([clocked]))
    assert "SM GHz" in text.splitlines()[0] and text.splitlines()[2].split()[-1] == "1.75"
    assert plots.CLOCK in experiment.METRICS
    assert experiment._number("1.96", "Ghz") == pytest.approx(1.96e9)
    assert experiment._number("1,755,000,000", "cycle/second") == pytest.approx(1.755e9)


@pytest.fixture(scope="module")
def rec():
    return committed_record("tiling_ncu")


def test_record_has_a_row_per_rung_or_says_why_not(rec):
    r = rec.results
    assert r["shape"] == [4096, 4096, 4096] and r["dtype"] == "fp16"
    if not r["available"]:
        assert r["reason"]
        return
    assert [row["rung"] for row in r["rows"]] == [s[0] for s in experiment.rungs()]
    assert plots.ncu_table(rec).count("\n") >= len(r["rows"])


def test_the_clock_explains_the_distance_to_the_datasheet_peak():
    """Lesson 04's clock lines, on every committed record that read the SM clock: the
    datasheet's peak implies Hopper's boost clock, and the pipe's busy share times the peak
    at the clock ncu read lands within 10 % of the TFLOP/s the launch's time gives."""
    import re

    from helpers import hardware, records
    from helpers.plots import tiling_ncu as plots

    with_clock = [g for g in records.available("tiling_ncu")
                  if all(r["metrics"].get(plots.CLOCK) for r in
                         records.load("tiling_ncu", g).results["rows"])]
    if not with_clock:
        pytest.skip("no committed tiling_ncu record read the SM clock")
    for gpu in with_clock:
        lines = plots.clock_lines(records.load("tiling_ncu", gpu), hardware.lookup(gpu))
        got = float(re.search(r"([\d,]+) TFLOP/s, tensor", lines[0]).group(1).replace(",", ""))
        assert "1.83 GHz" in lines[1], lines[1]
        busy_times_peak = float(re.search(r"= ([\d,]+) TFLOP/s$", lines[2]).group(1)
                                .replace(",", ""))
        assert 0.9 < got / busy_times_peak <= 1.0, lines


def test_the_clock_lines_say_when_the_record_has_no_clock():
    from helpers import hardware, records
    from helpers.plots import tiling_ncu as plots

    rec = records.load("tiling_ncu", "H100-SXM")
    with pytest.raises(ValueError, match="lacks the clock"):
        plots.clock_lines(rec, hardware.lookup("H100-SXM"))
