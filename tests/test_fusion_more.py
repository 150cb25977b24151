"""Lesson 05's second experiment (helpers.experiments.fusion_more): the keepdim spelling of
the five-op softmax, the readers of generated code and of profiler kernels (pure, so
tested on a CPU), the checks the smoke run makes in CPU mode, and the structure of the
committed GPU record (skipped until one is committed)."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch

from helpers import intensity, launches
from helpers.experiments import fusion_more as experiment
from helpers.kernels import softmax
from helpers.runtime import NeedsGPUError
from support import committed_record

DEV = helpers.device()


# --------------------------------------------------------------------------------------
# The keepdim spelling: the same op and bytes in eager mode
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (4, 1000), (7, 33)], ids=str)
def test_keepdim_spelling_is_the_same_softmax(shape):
    x = 3 * torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(DEV)
    want = softmax.softmax_reference(x)
    for fn in (softmax.naive_softmax, softmax.naive_softmax_keepdim):
        assert torch.allclose(fn(x), want, rtol=1e-5, atol=1e-7), fn.__name__


def test_keepdim_spelling_dispatches_the_same_five_ops_and_bytes():
    x = torch.randn(4, 1000, device=DEV, dtype=torch.float16)
    plain, keepdim = (launches.trace(f, x) for f in (softmax.naive_softmax,
                                                     softmax.naive_softmax_keepdim))
    assert [c.op for c in keepdim] == [c.op for c in plain] == [
        "aten.amax", "aten.sub", "aten.exp", "aten.sum", "aten.div"]
    assert keepdim.bytes == plain.bytes == intensity.softmax(4, 1000, torch.float16,
                                                             "naive").nbytes


# --------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------


def test_code_facts_count_loops_loads_and_online_softmax():
    src = ("for r0_offset in a:\n tl.load(in_ptr0 + x)\nfor r0_offset in b:\n"
           " tl.load(in_ptr0 + y)\n m, s = triton_helpers.online_softmax_reduce(m, s, 1)")
    facts = experiment.code_facts({"kernels": [{"name": "k0", "source": src}]})
    assert facts == {"kernels": 1, "names": ["k0"], "row_loops": 2, "input_loads": 2,
                     "online_softmax": True}
    assert experiment.code_facts({"kernels": []})["kernels"] == 0


def _profile(per_call_names, calls, flush="fill"):
    events, t = [], 0.0
    for c in range(calls):
        events.append((flush, t, 80.0))
        t += 100
        for i, name in enumerate(per_call_names):
            events.append((name, t, 10.0 + i + c))      # kernel i takes 10 + i + c us
            t += 12 + i + c
    return events


def test_kernel_table_groups_kernels_by_their_place_in_a_call():
    rows, span = experiment.kernel_table(_profile(["a", "b", "c"], 5), {"fill"}, 5)
    assert [r["kernel"] for r in rows] == ["a", "b", "c"]
    assert rows[1]["us"] == 13.0 and rows[1]["us_min"] == 11.0 and rows[1]["us_max"] == 15.0
    # call 2 (the median): kernels start at 0, 14, 29 and the last lasts 14: span 43
    assert span == 43.0
    shuffled = list(reversed(_profile(["a", "b", "c"], 2)))
    assert experiment.kernel_table(shuffled, {"fill"}, 2)[0][0]["kernel"] == "a"


def test_kernel_table_refuses_sequences_that_do_not_repeat():
    with pytest.raises(ValueError, match="do not split"):
        experiment.kernel_table(_profile(["a", "b", "c"], 1), {"fill"}, 2)
    events = _profile(["a", "b"], 2)
    events[-1] = ("z", *events[-1][1:])
    with pytest.raises(ValueError, match="differs between calls"):
        experiment.kernel_table(events, {"fill"}, 2)
    rows, _ = experiment.kernel_table(_profile(["a", "b"], 2), {"other"}, 2)
    assert [r["kernel"] for r in rows] == ["fill", "a", "b"], "nothing skipped: 3 a call"


@pytest.mark.parametrize("name, short", [
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::Half>>(at::native::"
     "ReduceOp<c10::Half>)", "reduce_kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>(int)",
     "vectorized_elementwise_kernel"),
    ("softmax_kernel_v1", "softmax_kernel_v1"),
])
def test_kernel_name_drops_namespaces_and_templates(name, short):
    assert experiment.kernel_name(name) == short


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run times, see below")
def test_smoke_run_checks_what_a_cpu_can_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.fusion_more(smoke=True)


@pytest.mark.gpu
def test_smoke_run_on_a_gpu_has_the_records_structure():
    s = experiment.SMOKE
    _check_structure(experiment.fusion_more(smoke=True), s["spelling_ns"], s["epilogue_ns"],
                     s["profile_ns"])


# --------------------------------------------------------------------------------------
# The committed record
# --------------------------------------------------------------------------------------


def _check_structure(r, spelling_ns=experiment.SPELLING_NS, epilogue_ns=experiment.EPILOGUE_NS,
                     profile_ns=experiment.PROFILE_NS):
    assert [e["n"] for e in r["spellings"]] == list(spelling_ns)
    for e in r["spellings"]:
        assert set(e["code"]) == set(experiment.SPELLINGS)
        names = {x["name"] for x in e["rows"]}
        assert set(experiment.SPELLINGS) | {"torch.softmax", "fused Triton"} == names
    assert [e["n"] for e in r["epilogue"]] == list(epilogue_ns)
    for e in r["epilogue"]:
        assert len(e["rows"]) == 6 and all(x["ms"] > 0 for x in e["rows"])
    assert [e["n"] for e in r["profile"]] == list(profile_ns)
    for e in r["profile"]:
        assert [k["op"] for k in e["kernels"]] == [
            "aten.amax", "aten.sub", "aten.exp", "aten.sum", "aten.div"]
        assert sum(k["bytes"] for k in e["kernels"]) == e["naive_bytes"]
        assert e["sum_kernel_us"] <= e["span_us"] * 1.001


@pytest.fixture(scope="module")
def rec():
    return committed_record("fusion_more")


def test_record_is_complete(rec):
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    _check_structure(rec.results)


def test_record_fused_epilogue_costs_less_than_the_extra_pass(rec):
    for e in rec.results["epilogue"]:
        by = {x["name"]: x["ms"] for x in e["rows"]}
        fused = by["Triton, leaky_relu in the epilogue (1 kernel)"]
        assert fused < by["Triton, then F.leaky_relu (2 kernels)"], e["n"]
        assert all(c["within_tolerance"] for k, c in e["checks"].items() if "leaky" in k
                   and "cuBLAS" not in k), e["checks"]


def test_record_tables(rec):
    from helpers.plots import fusion_more as plots

    for e in rec.results["profile"]:
        rows = plots.profile_rows(e, copy_gbps=3000.0)
        assert [r["aten op"] for r in rows][0] == "aten.amax" and "us at copy rate" in rows[0]
        s = plots.profile_summary(e)
        assert s["gaps_us"] >= 0 and s["kernels_us"] > 0
    assert [r["N"] for r in plots.spelling_rows(rec)] == list(experiment.SPELLING_NS)
    rows = plots.epilogue_rows(rec)
    assert [r["n"] for r in rows] == list(experiment.EPILOGUE_NS)
    assert all(r["2nd kernel adds"] > 0 for r in rows)
