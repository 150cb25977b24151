"""The exercise checks of lessons 01 and 02: right answers pass, the classic slips are
named, unanswered exercises say so, and nonsense never crashes a check."""

import pytest
import torch

from helpers import hardware, intensity, prediction
from helpers.exercises import lesson01 as ex1
from helpers.exercises import lesson02 as ex2
from helpers.kernels import memory_wall as mw

H100 = hardware.GPUS["H100-SXM"]


def _unanswered(fb):
    assert not fb and fb.status == "not implemented" and "no answer yet" in fb.message


# -- lesson 01 --------------------------------------------------------------------------------


def test_copy_bytes():
    assert ex1.check_copy_bytes(2 * 1000 * 2, 1000, torch.float16)
    assert "reads but not the writes" in ex1.check_copy_bytes(2000, 1000).message
    assert "bits" in ex1.check_copy_bytes(32_000, 1000).message
    assert "elements, not bytes" in ex1.check_copy_bytes(2000, 1000, "fp32").message
    _unanswered(ex1.check_copy_bytes(..., 1000))
    assert "expected a number" in ex1.check_copy_bytes("4000", 1000).message


def test_ridge_point():
    assert ex1.check_ridge_point(989.4e12 / 3350e9)
    assert ex1.check_ridge_point(H100.ridge_point("fp32"), dtype="fp32")
    assert "fp32 CUDA-core peak" in ex1.check_ridge_point(H100.ridge_point("fp32")).message
    assert "bytes per FLOP" in ex1.check_ridge_point(3350e9 / 989.4e12).message
    assert "unit prefix" in ex1.check_ridge_point(989.4 / 3350).message
    assert ex1.check_ridge_point(hardware.GPUS["T4"].ridge_point("fp16"), gpu="T4", dtype="fp16")


def test_percent_of_peak():
    assert ex1.check_percent_of_peak(90, 3015, 3350)
    assert "fraction" in ex1.check_percent_of_peak(0.9, 3015, 3350).message
    assert not ex1.check_percent_of_peak(80, 3015, 3350)


def test_fusion_speedup():
    shape = (16384, 16384)
    expected = (intensity.bias_gelu(*shape, torch.float32, "unfused").nbytes
                / intensity.bias_gelu(*shape, torch.float32, "fused").nbytes)
    assert ex1.check_fusion_speedup(expected, shape)
    assert ex1.check_fusion_speedup(2, shape), "2x is within 2% of the exact byte ratio"
    assert "compared FLOPs" in ex1.check_fusion_speedup(1, shape).message
    assert "inverted" in ex1.check_fusion_speedup(0.5, shape).message


def test_regime():
    assert ex1.check_regime("latency", 2**16, floor_us=5, peak_gbps=3350)
    assert ex1.check_regime("bandwidth", 2**31, floor_us=5, peak_gbps=3350)
    fb = ex1.check_regime("bandwidth", 2**16, floor_us=5, peak_gbps=3350)
    assert not fb and "launch floor" in fb.message
    assert not ex1.check_regime("fast", 2**16, floor_us=5, peak_gbps=3350)
    _unanswered(ex1.check_regime(..., 2**16, floor_us=5, peak_gbps=3350))


# -- lesson 02 --------------------------------------------------------------------------------


def test_vector_add_intensity():
    assert ex2.check_vector_add_intensity(1 / 6, "fp16")
    assert ex2.check_vector_add_intensity(1 / 12, "fp32")
    assert "write of c" in ex2.check_vector_add_intensity(1 / 4, "fp16").message
    assert "inverted" in ex2.check_vector_add_intensity(6, "fp16").message
    _unanswered(ex2.check_vector_add_intensity(...))


def test_matmul_intensity():
    assert ex2.check_matmul_intensity(4096 / 3, 4096, "bf16")
    assert "write of C" in ex2.check_matmul_intensity(4096 / 2, 4096, "bf16").message
    assert "multiply-add is 2" in ex2.check_matmul_intensity(4096 / 6, 4096, "bf16").message


def _right_answers(launch_us):
    return {label: prediction.predict(w, H100, launch_us=launch_us).bound
            for label, w in ex2.classification_cases().items()}


def test_classification_cases_cover_all_three_bounds():
    assert set(_right_answers(5.0).values()) == set(prediction.BOUNDS)


def test_classification():
    answers = _right_answers(5.0)
    assert ex2.check_classification(answers, launch_us=5.0)
    wrong = dict(answers, **{"matmul 64^3 bf16": "compute"})
    fb = ex2.check_classification(wrong, launch_us=5.0)
    assert not fb and f"{len(answers) - 1} of {len(answers)} right" in fb.message
    assert "matmul 64^3 bf16: you said compute" in fb.message and "latency-bound" in fb.message
    partial = {k: (v if i < 2 else ...) for i, (k, v) in enumerate(answers.items())}
    assert "not answered yet" in ex2.check_classification(partial, launch_us=5.0).message
    fb = ex2.check_classification(dict(answers, typo="memory"), launch_us=5.0)
    assert not fb and "spelling" in fb.message
    assert "is not one of" in ex2.check_classification(
        dict(answers, **{"matmul 64^3 bf16": 3}), launch_us=5.0).message
    _unanswered(ex2.check_classification(..., launch_us=5.0))
    assert "expected a dict" in ex2.check_classification(["memory"], launch_us=5.0).message


def test_predicted_time():
    work = intensity.vector_add(2**20, "fp32")
    pred = prediction.predict(work, H100, launch_us=5.0)
    assert ex2.check_predicted_time(pred.time_ms * 1e3, work, launch_us=5.0)
    fb = ex2.check_predicted_time(pred.memory_ms * 1e3, work, launch_us=5.0)
    assert not fb and "launch cost" in fb.message
    big = intensity.matmul(8192, 8192, 8192, "bf16")
    p = prediction.predict(big, H100, launch_us=5.0)
    fb = ex2.check_predicted_time((p.memory_ms + p.compute_ms + p.launch_ms) * 1e3 * 1.2, big,
                                  launch_us=5.0)
    assert not fb and "off by" in fb.message
    _unanswered(ex2.check_predicted_time(..., work, launch_us=5.0))
    assert not ex2.check_predicted_time(float("nan"), work, launch_us=5.0)


@pytest.mark.parametrize("case", list(ex2.BELOW_ROOF_CASES))
def test_below_roof(case, capsys):
    c = ex2.BELOW_ROOF_CASES[case]
    assert ex2.check_below_roof(c["answer"], case)
    assert ex2.check_below_roof(c["answer"].upper() + " ", case)
    for letter in c["options"]:
        if letter != c["answer"]:
            fb = ex2.check_below_roof(letter, case)
            assert not fb and "is not it" in fb.message
    assert "one of the letters" in ex2.check_below_roof("z", case).message
    _unanswered(ex2.check_below_roof(..., case))
    ex2.show_below_roof(case)
    assert c["question"] in capsys.readouterr().out
    with pytest.raises(KeyError):
        ex2.check_below_roof("a", "no such case")
