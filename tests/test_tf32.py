"""Lesson 04's TF32 experiment (helpers.experiments.tf32): its versions, its checks (they run
in CPU mode too), and the structure of its committed GPU record (skipped until one is
committed)."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch

from helpers.experiments import tf32 as experiment
from helpers.experiments.tiling import TF32_CONFIG
from helpers.runtime import NeedsGPUError
from support import committed_record


def test_the_sweep_starts_from_lesson_04s_config_and_every_config_fits_hopper():
    assert experiment.CONFIGS[0] == TF32_CONFIG
    assert TF32_CONFIG.as_dict(experiment.KEYS) == dict(
        block_m=128, block_n=128, block_k=32, group_m=8, num_stages=3, num_warps=4)
    for c in experiment.CONFIGS:
        sram = c.num_stages * (c.block_m * c.block_k + c.block_k * c.block_n) * 4   # fp32
        assert sram <= 227 * 1024, c
        assert c.fits("H100-SXM", torch.float32)[0], c


def test_versions_cover_torch_both_ways_and_every_config_in_both_layouts():
    a = b = torch.zeros(2, 2)
    versions = experiment._versions(a, b, b, experiment.CONFIGS)
    kinds = [info["kind"] for _, info in versions.values()]
    assert kinds.count("torch") == 2 and kinds.count("triton ieee") == 1
    assert kinds.count("triton tf32") == len(experiment.CONFIGS) * len(experiment.LAYOUTS)
    torch_rows = [info for _, info in versions.values() if info["kind"] == "torch"]
    assert {r["allow_tf32"] for r in torch_rows} == {False, True}
    assert sum(info.get("lesson_config", False) for _, info in versions.values()) == 2


def test_torch_versions_restore_the_precision_setting():
    before = torch.get_float32_matmul_precision()
    a = torch.randn(4, 4)
    for fn, info in experiment._versions(a, a, a, experiment.CONFIGS[:1]).values():
        if info["kind"] == "torch":
            fn()
    assert torch.get_float32_matmul_precision() == before


def test_best_picks_the_fastest_triton_tf32_row():
    rows = [{"kind": "torch", "layout": None, "ms": 0.1},
            {"kind": "triton tf32", "layout": "row-major B", "ms": 2.0},
            {"kind": "triton tf32", "layout": "column-major B", "ms": 1.0},
            {"kind": "triton ieee", "layout": "row-major B", "ms": 0.5}]
    assert experiment.best(rows)["ms"] == 1.0
    assert experiment.best(rows, "row-major B")["ms"] == 2.0
    with pytest.raises(ValueError, match="no Triton TF32 rows"):
        experiment.best(rows[:1])


def test_check_refuses_a_wrong_version():
    a = torch.randn(8, 8)
    exact = (a @ a).double()
    versions = {"wrong": (lambda: a @ a + 1, {"kind": "triton tf32"})}
    with pytest.raises(AssertionError, match="wrong is wrong"):
        experiment._check(versions, exact)


def test_check_sets_aside_a_config_that_does_not_compile():
    a = torch.randn(8, 8)
    exact = (a @ a).double()

    def too_big():
        raise RuntimeError("out of resource: shared memory, Required: 262144")

    versions = {"big": (too_big, {"kind": "triton tf32"}), "ok": (lambda: a @ a, {"kind": "torch"})}
    errors, failures = experiment._check(versions, exact)
    assert list(errors) == ["ok"] and "shared memory" in failures["big"]
    versions["big"] = (too_big, {"kind": "torch"})
    with pytest.raises(RuntimeError):
        experiment._check(versions, exact)


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run times, see below")
def test_smoke_run_checks_every_version_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.tf32(smoke=True)


@pytest.mark.gpu
def test_smoke_run_on_a_gpu_has_the_records_structure():
    _check_structure(experiment.tf32(smoke=True), configs=experiment.SMOKE["configs"])


def _check_structure(r, configs=experiment.CONFIGS):
    rows = r["rows"]
    assert len(rows) + len(r["failed"]) == 3 + len(configs) * len(experiment.LAYOUTS)
    assert len({x["name"] for x in rows}) == len(rows)
    for x in rows:
        assert x["ms_min"] <= x["ms"] <= x["ms_max"] and x["tflops"] > 0
        assert len(x["runs"]) == r["repeats"]
    by_kind = {x["kind"]: x for x in rows}
    assert by_kind["triton ieee"]["rel_error"] < 1e-4


@pytest.fixture(scope="module")
def rec():
    return committed_record("tf32")


def test_record_is_complete(rec):
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    _check_structure(rec.results)


def test_record_tf32_trades_digits_for_speed(rec):
    rows = rec.results["rows"]
    fp32, tf32 = (next(x for x in rows if x.get("allow_tf32") is v) for v in (False, True))
    assert tf32["ms"] < fp32["ms"], "cuBLAS with TF32 on is faster than in full fp32"
    assert tf32["rel_error"] > 10 * fp32["rel_error"], "and less precise"
    lesson = next(x for x in rows if x.get("lesson_config") and x["layout"] == "row-major B")
    assert experiment.best(rows)["ms"] <= lesson["ms"]


def test_record_table_names_each_version_once(rec):
    from helpers.plots import tiling as plots

    rows = plots.tf32_rows(rec)
    names = [r["version"] for r in rows]
    assert len(names) == len(set(names)) >= 5
    assert sum("torch.matmul" in n for n in names) == 2
