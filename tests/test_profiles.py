"""The profiles experiment (torch.profiler's kernel tables of lessons 01 and 05): its checks
run in CPU mode, its profiler rows are computed right, its table reads, and its committed GPU
record (skipped until there is one) profiles what it says."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest

from helpers.experiments import profiles as experiment
from helpers.plots import profiles as plots
from helpers.runtime import NeedsGPUError
from support import committed_record

OPS = ("softmax naive", "softmax torch", "softmax fused", "elementwise chain unfused",
       "elementwise chain fused")


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run profiles, see below")
def test_smoke_run_checks_every_op_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.profiles(smoke=True)


@pytest.mark.gpu
def test_smoke_run_on_a_gpu_has_the_records_structure():
    _check_structure(experiment.profiles(smoke=True), calls=experiment.SMOKE["calls"])


def test_the_naive_softmax_launches_five_ops_whose_bytes_the_napkin_math_counts():
    import torch

    from helpers import intensity

    from helpers.kernels import softmax as sk

    x = torch.randn(8, 256, dtype=torch.float16)
    launches = experiment._launches(sk.naive_softmax, x)
    assert [op for op, _ in launches] == ["aten.amax", "aten.sub", "aten.exp", "aten.sum",
                                          "aten.div"]
    assert sum(b for _, b in launches) == intensity.softmax(8, 256, torch.float16, "naive").nbytes


def test_kernel_rows_match_each_launch_to_its_bytes_and_share():
    # Two calls, each launching a, b, a: a twice per call (100 and 300 bytes), b once.
    totals = {"a": (4, 40.0), "b": (2, 20.0)}
    order = ["a", "b", "a", "a", "b", "a"]
    got = experiment.kernel_rows(totals, order, [("x", 100), ("y", 200), ("z", 300)], calls=2)
    assert got["total_us"] == 30.0
    a, b = got["kernels"]
    assert (a["name"], a["calls_per_op"], a["us_per_call"]) == ("a", 2.0, 10.0)
    assert a["share"] == pytest.approx(2 / 3) and b["share"] == pytest.approx(1 / 3)
    assert a["bytes"] == 200 and b["bytes"] == 200          # a: the mean of 100 and 300
    assert a["op"] == "x, z" and b["op"] == "y"
    assert b["gbps"] == pytest.approx(200 / 10e-6 / 1e9)


def test_kernel_rows_leave_the_bytes_unknown_when_the_launches_do_not_match():
    got = experiment.kernel_rows({"k": (6, 60.0)}, ["k"] * 6, [("a", 100), ("b", 200)], calls=2)
    k = got["kernels"][0]
    assert k["bytes"] is None and k["gbps"] is None and k["op"] is None


def test_kernel_rows_trim_long_kernel_names():
    name = "void at::native::reduce_kernel<512, 1, " + "x" * 200
    got = experiment.kernel_rows({name: (1, 5.0)}, [name], [("op", 10)], calls=1)
    assert len(got["kernels"][0]["name"]) == experiment.NAME_CHARS


SYNTHETIC = {"ops": {"softmax naive": {
    "description": "five ops", "shape": [4096, 4096], "dtype": "fp16", "calls_profiled": 20,
    "total_us": 150.0, "kernels": [
        {"name": "reduce_kernel", "calls_per_op": 2.0, "us_per_call": 40.0, "share": 80 / 150,
         "bytes": 33562624, "gbps": 839.1},
        {"name": "elementwise_kernel", "calls_per_op": 3.0, "us_per_call": 70 / 3,
         "share": 70 / 150, "bytes": None, "gbps": None}]}},
    "profiler": {"torch": "2.11.0"}}


def test_kernel_table_lists_each_kernel_then_the_total():
    text = plots.kernel_table(SYNTHETIC, "softmax naive")
    lines = text.splitlines()
    assert lines[0].startswith("softmax naive: five ops")
    assert "4096x4096 fp16, 20 calls profiled" in lines[1]
    assert all(h in lines[2] for h in ("kernel", "calls", "µs", "share", "GB/s"))
    assert "reduce_kernel" in lines[4] and "53.3%" in lines[4] and "839" in lines[4]
    assert lines[5].rstrip().endswith("-"), "unknown bandwidth prints as -"
    assert lines[6].startswith("total per call") and "150.0" in lines[6]


def test_kernel_table_shows_what_each_kernel_computes_when_the_record_says():
    import copy

    rec = copy.deepcopy(SYNTHETIC)
    rec["ops"]["softmax naive"]["kernels"][0]["op"] = "aten.amax, aten.sum"
    rec["ops"]["softmax naive"]["kernels"][1]["op"] = None
    lines = plots.kernel_table(rec, "softmax naive").splitlines()
    assert lines[2].split()[:3] == ["kernel", "op", "calls"]
    assert "aten.amax, aten.sum" in lines[4] and " - " in lines[5]


def test_kernel_table_names_the_ops_it_has():
    with pytest.raises(KeyError, match="softmax naive"):
        plots.kernel_table(SYNTHETIC, "softmax")


def _check_structure(r, calls=experiment.CALLS):
    assert set(r["ops"]) == set(OPS) and r["profiler"]["torch"]
    for name, op in r["ops"].items():
        assert op["calls_profiled"] == calls and op["total_us"] > 0, name
        assert sum(k["share"] for k in op["kernels"]) == pytest.approx(1.0), name
        for k in op["kernels"]:
            assert len(k["name"]) <= experiment.NAME_CHARS and k["us_per_call"] > 0
            assert (k["bytes"] is None) == (k["gbps"] is None)


@pytest.fixture(scope="module")
def rec():
    return committed_record("profiles")


def test_record_is_complete(rec):
    _check_structure(rec.results)


def test_record_counts_the_kernels_each_op_launches(rec):
    per_call = {name: sum(k["calls_per_op"] for k in op["kernels"])
                for name, op in rec.results["ops"].items()}
    assert per_call["softmax naive"] == 5, per_call
    assert per_call["softmax fused"] == 1 and per_call["elementwise chain fused"] == 1
    assert per_call["elementwise chain unfused"] == 2


def test_record_tables_print(rec):
    for name in OPS:
        assert name in plots.kernel_table(rec, name)


def test_short_names_drop_pytorchs_namespaces_and_stay_distinct():
    maxed = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::Half, "
             "at::native::MaxOps<float>, unsigned int, c10::Half, 4> >(at::native::ReduceOp<")
    assert experiment.short_name(maxed).startswith("reduce_kernel<512, 1, ReduceOp<Half, MaxOps")
    long = "k" * 200
    first = experiment.short_name(long)
    second = experiment.short_name(long, [first])
    assert len(first) == len(second) == experiment.NAME_CHARS and first != second
