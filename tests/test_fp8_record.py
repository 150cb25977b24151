"""Lesson 09's record (experiment fp8), every committed GPU: complete, reproducible in its
drawn shapes, and saying what the lesson reads from it: finer scales survive larger
outliers, the tensor cores' unpromoted sum loses bits as K grows (most on operands of one
sign), and the per-tensor kernel holds the targets it is held to."""

import pytest

from helpers.experiments import fp8 as experiment
from helpers.performance import extractors

from support import committed_record  # tests/support.py


def _committed() -> list:
    from helpers import records

    return records.available("fp8") or [None]


@pytest.fixture(scope="module", params=_committed())
def rec(request):
    return committed_record("fp8", request.param)


def test_every_version_ran_or_was_refused_by_cublas_alone(rec):
    for e in rec.results["speed"]:
        for v in e["versions"]:
            if "error" in v:
                assert v["name"].startswith("torch._scaled_mm") and "divisible by 16" in v["error"], v
                assert any(w["name"] == experiment.PADDED and "tflops" in w for w in e["versions"]), \
                    f"{e['shape']}: cuBLAS refused the shape, so its padded run must stand in"
            else:
                assert v["tflops"] > 0 and v["ms_min"] <= v["ms"] <= v["ms_max"], v


def test_the_drawn_shapes_come_from_the_printed_seed(rec):
    config = rec.results["config"]
    drawn = experiment.drawn_shapes(config["seed"])
    assert [list(s) for s in drawn] == config["drawn"]
    assert [e["shape"] for e in rec.results["speed"] if e["drawn"]] == config["drawn"]


def test_finer_scales_survive_larger_outliers(rec):
    table = {r["outlier_scale"]: r["errors"] for r in rec.results["accuracy"]}
    calm, wild = table[1.0], table[max(table)]
    assert max(calm[s] for s in experiment.SCALINGS) < 1.2 * min(calm[s] for s in experiment.SCALINGS)
    assert wild["block"] < wild["row"] < wild["tensor"], wild


def test_the_unpromoted_sum_loses_bits_as_k_grows(rec):
    """What the lesson reads: without promotion the error grows with K, far more on
    operands of one sign (no cancellation hides the lost low bits); promoted every 128
    values, or block-scaled, it stays at the level of the shortest K."""
    rows = rec.results["accumulation"]
    for signs in experiment.SIGNS:
        mine = sorted((r for r in rows if r["signs"] == signs), key=lambda r: r["K"])
        never = [r["errors"]["never promoted"] for r in mine]
        assert never == sorted(never) and never[-1] > 5 * never[0], (signs, never)
        for r in mine:
            promoted = r["errors"][f"promoted every {experiment.PROMOTE}"]
            assert promoted < 2 * mine[0]["errors"]["block scales"], (signs, r)
        assert mine[-1]["errors"]["never promoted"] > 10 * promoted
    longest = max(r["K"] for r in rows)
    by_sign = {r["signs"]: r["errors"]["never promoted"] for r in rows if r["K"] == longest}
    assert by_sign["positive"] > 10 * by_sign["mixed"]


def test_the_per_tensor_kernel_holds_its_targets(rec):
    """Against torch._scaled_mm on the lesson's fixed shapes only: a shape drawn at record
    time is reported, met or missed, in the README's table (the H200 record at 8904cba drew
    5540 x 8056 x 4528, where ours ran 0.92x torch._scaled_mm on operands padded to 16; the
    goal, 0.95x, stays open in the report). Every other goal on every shape."""
    rows = extractors.fp8(rec)
    assert any("(drawn)" in r.shape for r in rows), "no drawn shapes recorded"
    held = {v.target: [] for r in rows for v in r.verdicts}
    for r in rows:
        for v in r.verdicts:
            if not (v.target == "fp8_vs_scaled_mm" and "(drawn)" in r.shape):
                held[v.target].append(v.met)
    assert held["fp8_vs_scaled_mm"] and all(held["fp8_vs_scaled_mm"]), "per-tensor vs cuBLAS"
    assert held["fp8_vs_bf16"] and all(held["fp8_vs_bf16"]), "FP8 vs the course's bf16"
    assert all(held["fp8_quantize"]), "the quantisation kernel vs a copy"
    # Every ratio the report shows against cuBLAS is under 1.5x (the course's rule: a larger
    # win is explained or withdrawn). Against bf16 the FP8 roof is twice as high.
    for r in rows:
        if "_scaled_mm" in r.baseline and r.ratio is not None:
            assert r.ratio < 1.5, (r.kernel, r.shape, r.ratio)


def test_the_lessons_reading_of_promotion_and_block_scales(rec):
    """Lesson 09, section 5: promotion lands near the napkin math (a CUDA-core FMA per
    element per K block, not overlapped with the tensor cores), block scales fall further,
    and in the committed record they miss their target (the lesson says so)."""
    from helpers import hardware

    gpu = hardware.lookup(rec.gpu)
    tensor_core, cuda_core = 2 * 128 / gpu.peak("fp8"), 2 / gpu.peak("fp32")
    napkin = tensor_core / (tensor_core + cuda_core)
    big = next(e for e in rec.results["speed"] if tuple(e["shape"]) == experiment.SHAPES[1])
    tflops = {v["name"]: v["tflops"] for v in big["versions"] if "tflops" in v}
    base = tflops["ours, tensor scales"]
    promoted = tflops[f"ours, tensor scales, promoted every {experiment.PROMOTE}"] / base
    block = tflops["ours, block scales"] / base
    assert abs(promoted / napkin - 1) < 0.1, (promoted, napkin)
    assert block < promoted
    assert block < experiment.BLOCK_VS_TENSOR[0], "the lesson says block scales miss"
