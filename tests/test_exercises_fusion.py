"""The exercise checks of lesson 05 (fusion): the bytes of eager SwiGLU and of the online
softmax; the predictions (the softmax against its bytes, the end-to-end speed-up, the
compilations for three shapes); Amdahl's law, the hottest kernel of a profile and the
compile-counting backend. Right answers pass; each classic slip is named; unanswered
exercises say so.

The expected values are written out here by hand (the bytes from the kernels' reads and
writes), so a change to the napkin math or the helpers that breaks them fails this test."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo

from helpers.exercises import fusion as ex
from support import assert_unanswered, committed_record

M, N = 4096, 16384


def test_swiglu_bytes():
    # SiLU reads gate, writes silu(gate); the product reads it and up, writes y: 5 MN
    # elements of 2 bytes (bf16).
    assert ex.check_swiglu_bytes(10 * M * N, M, N)
    assert ex.check_swiglu_bytes(20 * M * N, M, N, torch.float32)
    assert "fused kernel" in ex.check_swiglu_bytes(6 * M * N, M, N).message
    assert "silu(gate) once" in ex.check_swiglu_bytes(8 * M * N, M, N).message
    assert "elements, not bytes" in ex.check_swiglu_bytes(5 * M * N, M, N).message
    assert not ex.check_swiglu_bytes(11 * M * N, M, N)
    assert_unanswered(ex.check_swiglu_bytes(..., M, N))
    assert not ex.check_swiglu_bytes("many", M, N)


def test_online_softmax_bytes():
    n = 65536
    # Pass 1 reads each row (max and sum), pass 2 reads it again and writes y: 3 MN
    # elements of 2 bytes (fp16).
    assert ex.check_online_softmax_bytes(6 * M * n, M, n)
    assert ex.check_online_softmax_bytes(12 * M * n, M, n, torch.float32)
    assert "reads each row twice" in ex.check_online_softmax_bytes(4 * M * n, M, n).message
    assert "writes y once" in ex.check_online_softmax_bytes(8 * M * n, M, n).message
    assert "elements, not bytes" in ex.check_online_softmax_bytes(3 * M * n, M, n).message
    assert_unanswered(ex.check_online_softmax_bytes(..., M, n))


def _record(naive_ms, fused_ms, naive_bytes=8, fused_bytes=2):
    rows = [{"name": "naive (5 PyTorch ops)", "ms": naive_ms, "bytes": naive_bytes},
            {"name": "fused Triton", "ms": fused_ms, "bytes": fused_bytes}]
    return SimpleNamespace(gpu="a test GPU", results={"softmax": [
        {"dtype": "fp16", "m": 4096, "n": 4096, "rows": rows}]})


def test_softmax_vs_bytes():
    # The bytes predict 8 / 2 = 4x; "about" is within 10 % of that.
    assert ex.softmax_vs_bytes(_record(6.0, 1.0))["verdict"] == "more"
    assert ex.softmax_vs_bytes(_record(4.3, 1.0))["verdict"] == "about"
    assert ex.softmax_vs_bytes(_record(3.0, 1.0))["verdict"] == "less"
    assert ex.check_softmax_vs_bytes("more", _record(6.0, 1.0))
    wrong = ex.check_softmax_vs_bytes("about", _record(6.0, 1.0))
    assert not wrong and "6.00x measured, 4.00x from the bytes" in wrong.message
    assert_unanswered(ex.check_softmax_vs_bytes(None, _record(6.0, 1.0)))
    assert_unanswered(ex.check_softmax_vs_bytes(..., _record(6.0, 1.0)))
    with pytest.raises(KeyError):
        ex.softmax_vs_bytes(_record(6.0, 1.0), n=1024)


def test_amdahl():
    assert ex.amdahl(0.5, 2) == pytest.approx(1 / 0.75)            # 0.5 + 0.25 of the time
    assert ex.amdahl(0.01, 3) == pytest.approx(1 / (0.99 + 0.01 / 3))
    assert ex.amdahl(0.01, 3) < 1.007                     # 3x on 1 % of the time: 0.7 %
    assert ex.amdahl(0.0, 100) == 1                      # nothing sped up
    assert ex.amdahl(1.0, 4) == pytest.approx(4)         # everything sped up
    assert ex.amdahl(0.75, math.inf) == pytest.approx(4)  # the limit 1 / (1 - p)
    assert ex.amdahl(0.5, 0.5) == pytest.approx(1 / 1.5)  # a slower kernel slows the whole
    for p, k in ((1.5, 2), (-0.1, 2), (0.5, 0)):
        with pytest.raises(ValueError):
            ex.amdahl(p, k)


PROFILE = {"sum_kernel_us": 100.0, "kernels": [
    {"op": "aten.amax", "name": "reduce_kernel", "us": 20.0, "bytes": 10_000_000},
    {"op": "aten.div", "name": "elementwise_kernel", "us": 50.0, "bytes": 40_000_000},
    {"op": "aten.exp", "name": "vectorized_elementwise_kernel", "us": 30.0, "bytes": 40_000_000}]}


def test_hottest_kernel():
    hot = ex.hottest_kernel(PROFILE, copy_gbps=2000)
    assert hot["op"] == "aten.div"
    assert hot["p"] == pytest.approx(0.5)
    assert hot["floor_us"] == pytest.approx(20.0)       # 40 MB at 2000 GB/s
    assert hot["k"] == pytest.approx(2.5)
    unmatched = {**PROFILE, "kernels": [{"name": "k", "us": 1.0}]}
    with pytest.raises(ValueError, match="no kernel's bytes"):
        ex.hottest_kernel(unmatched, copy_gbps=2000)



def test_hottest_profiled():
    # Kernels grouped by name: sub and div are one row of two launches.
    op = {"total_us": 100.0, "kernels": [
        {"name": "elementwise_kernel", "calls_per_op": 2, "us_per_call": 25.0, "share": 0.5,
         "bytes": 40_000_000},
        {"name": "reduce_kernel", "calls_per_op": 2, "us_per_call": 15.0, "share": 0.3,
         "bytes": 10_000_000},
        {"name": "unknown", "calls_per_op": 1, "us_per_call": 60.0, "share": 0.6, "bytes": None},
        {"name": "vectorized_elementwise_kernel", "calls_per_op": 1, "us_per_call": 20.0,
         "share": 0.2, "bytes": 40_000_000}]}
    hot = ex.hottest_profiled(op, copy_gbps=2000)
    assert hot["op"] == "elementwise_kernel" and hot["launches"] == 2 and hot["computes"] == ""
    assert hot["p"] == pytest.approx(0.5) and hot["us"] == pytest.approx(50.0)
    assert hot["floor_us"] == pytest.approx(40.0)      # two launches of 40 MB at 2000 GB/s
    assert hot["k"] == pytest.approx(1.25)
    with pytest.raises(ValueError, match="no kernel's bytes"):
        ex.hottest_profiled({"total_us": 1.0, "kernels": [op["kernels"][2]]}, copy_gbps=2000)

def test_check_end_to_end():
    p, k = 0.5, 2.5                                     # 1 / (0.5 + 0.2) = 1.43x
    assert ex.check_end_to_end(1.43, p, k)
    assert not ex.check_end_to_end(1.6, p, k)
    assert "other kernels" in ex.check_end_to_end(2.5, p, k).message
    assert "no time at all" in ex.check_end_to_end(2.0, p, k).message
    assert "inverse" in ex.check_end_to_end(0.7, p, k).message
    assert "more than 1" in ex.check_end_to_end(1 / (0.5 + 0.5 * 2.5), p, k).message  # k inverted
    assert_unanswered(ex.check_end_to_end(None, p, k))
    assert_unanswered(ex.check_end_to_end(..., p, k))   # the lesson's placeholder


def test_check_hottest_speedup_reads_p_and_k_from_the_profile():
    op = {"total_us": 100.0, "kernels": [
        {"name": "elementwise_kernel", "calls_per_op": 1, "us_per_call": 50.0, "share": 0.5,
         "bytes": 40_000_000},                          # 20 µs at 2000 GB/s: k = 2.5
        {"name": "reduce_kernel", "calls_per_op": 1, "us_per_call": 30.0, "share": 0.3,
         "bytes": 10_000_000}]}                         # slower per byte, a smaller share
    assert ex.check_hottest_speedup(1 / (0.5 + 0.5 / 2.5), op, copy_gbps=2000)
    slip = ex.check_hottest_speedup(2.5, op, copy_gbps=2000)      # k alone
    assert not slip and "other kernels" in slip.message
    assert not ex.check_hottest_speedup(1.6, op, copy_gbps=2000)
    assert_unanswered(ex.check_hottest_speedup(..., op, copy_gbps=2000))


def _compile_on_widths(dynamic, widths=(8, 12, 16)):
    torch._dynamo.reset()
    counter = ex.CompileCounter()
    f = torch.compile(lambda x, b: torch.relu(x + b), backend=counter, dynamic=dynamic)
    for n in widths:
        x, b = torch.randn(3, n), torch.randn(n)
        assert torch.equal(f(x, b), torch.relu(x + b))  # the graphs run unchanged
    return counter


def test_compile_counter_sees_automatic_dynamic_shapes():
    counter = _compile_on_widths(None)
    assert counter.count == 2
    assert counter.graphs[0] == {"x": "[3, 8]", "b": "[8]"}
    assert counter.graphs[1] == {"x": "[3, s0]", "b": "[s0]"}  # the width became a symbol
    assert str(counter).splitlines()[0] == "2 compilations:"


def test_compile_counter_static_and_dynamic():
    assert _compile_on_widths(False).count == 3
    dynamic = _compile_on_widths(True)
    assert dynamic.count == 1
    assert dynamic.graphs[0] == {"x": "[s0, s1]", "b": "[s1]"}
    assert str(dynamic).startswith("1 compilation:")


def test_check_compilations():
    assert ex.check_compilations(2, 2)
    assert not ex.check_compilations(2.5, 2)
    assert "dynamic=False" in ex.check_compilations(3, 2).message
    assert "dynamic=True" in ex.check_compilations(1, 2).message
    assert_unanswered(ex.check_compilations(None, 2))
    assert_unanswered(ex.check_compilations(..., 2))


def test_the_profiles_record_bears_out_the_lessons_attribution():
    """Section 1's claims, against the committed profiles record: the generic elementwise
    launches (sub, div, a broadcast operand each) take the largest share of the five-op
    softmax and stream at most at about half the rate of the vectorized one (exp), which runs
    near the copy rate; the kernels' time is nearly all of the call's; Amdahl's hottest kernel
    is one of the generic launches."""
    from helpers.plots import fusion as plots

    prof, fusion = committed_record("profiles"), committed_record("fusion")
    rows = {r["kernels"]: r for r in plots.kernel_families(prof)}
    generic, exp = rows["generic elementwise (sub, div)"], rows["vectorized elementwise (exp)"]
    assert generic["launches"] == 2 and exp["launches"] == 1
    assert generic["share %"] == max(r["share %"] for k, r in rows.items() if k != "all")
    rate = lambda text: [float(v.replace(",", "")) for v in text.split(" to ")]  # noqa: E731
    copy = fusion.results["copy"]["gbps"]
    assert max(rate(generic["GB/s"])) < 0.6 * rate(exp["GB/s"])[0]
    assert rate(exp["GB/s"])[0] > 0.9 * copy
    assert rows["all"]["launches"] == 5
    naive_ms = next(r["ms"] for e in fusion.results["softmax"]
                    if (e["dtype"], e["n"]) == ("fp16", 4096)
                    for r in e["rows"] if r["name"] == "naive (5 PyTorch ops)")
    assert rows["all"]["us"] > 0.9 * 1e3 * naive_ms
    hot = ex.hottest_profiled(prof.results["ops"]["softmax naive"], copy)
    assert "elementwise_kernel" in hot["op"] and "vectorized" not in hot["op"]
    assert hot["computes"] in ("aten.sub", "aten.div")   # one launch, not the sub + div family
    # The lesson's prediction: Amdahl's law on that launch, read before p and k print.
    naive = prof.results["ops"]["softmax naive"]
    assert ex.check_hottest_speedup(ex.amdahl(hot["p"], hot["k"]), naive, copy)
    assert not ex.check_hottest_speedup(hot["k"], naive, copy)


def test_compile_and_call_counts_the_lessons_widths():
    from helpers.kernels import gelu

    counter = ex.compile_and_call(gelu.bias_gelu_eager, "cpu")
    assert counter.count == 2 and counter.graphs[1] == {"x": "[4, s0]", "bias": "[s0]"}
    assert ex.compile_and_call(gelu.bias_gelu_eager, "cpu", dynamic=False).count == 3
