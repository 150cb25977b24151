"""The exercise checks of lesson 02 (the roofline): right answers pass, the classic slips
are named, unanswered exercises say so, and nonsense never crashes a check."""

import pytest

from helpers import hardware, intensity, prediction
from helpers.exercises import roofline as ex
from support import assert_unanswered

H100 = hardware.GPUS["H100-SXM"]


def test_vector_add_intensity():
    assert ex.check_vector_add_intensity(1 / 6, "fp16")
    assert ex.check_vector_add_intensity(1 / 12, "fp32")
    assert "write of c" in ex.check_vector_add_intensity(1 / 4, "fp16").message
    assert "inverted" in ex.check_vector_add_intensity(6, "fp16").message
    assert_unanswered(ex.check_vector_add_intensity(...))


def test_matmul_intensity():
    assert ex.check_matmul_intensity(4096 / 3, 4096, "bf16")
    assert "write of C" in ex.check_matmul_intensity(4096 / 2, 4096, "bf16").message
    assert "multiply-add is 2" in ex.check_matmul_intensity(4096 / 6, 4096, "bf16").message


def _right_answers(launch_us):
    return {label: prediction.predict(w, H100, launch_us=launch_us).bound
            for label, w in ex.classification_cases().items()}


def test_classification_cases_cover_all_three_bounds():
    assert set(_right_answers(5.0).values()) == set(prediction.BOUNDS)


def test_classification():
    answers = _right_answers(5.0)
    assert ex.check_classification(answers, launch_us=5.0)
    wrong = dict(answers, **{"matmul 64^3 bf16": "compute"})
    fb = ex.check_classification(wrong, launch_us=5.0)
    assert not fb and f"{len(answers) - 1} of {len(answers)} right" in fb.message
    assert "matmul 64^3 bf16: you said compute" in fb.message and "latency-bound" in fb.message
    partial = {k: (v if i < 2 else ...) for i, (k, v) in enumerate(answers.items())}
    assert "not answered yet" in ex.check_classification(partial, launch_us=5.0).message
    fb = ex.check_classification(dict(answers, typo="memory"), launch_us=5.0)
    assert not fb and "spelling" in fb.message
    assert "is not one of" in ex.check_classification(
        dict(answers, **{"matmul 64^3 bf16": 3}), launch_us=5.0).message
    assert_unanswered(ex.check_classification(..., launch_us=5.0))
    assert "expected a dict" in ex.check_classification(["memory"], launch_us=5.0).message


def test_predicted_time():
    work = intensity.vector_add(2**20, "fp32")
    pred = prediction.predict(work, H100, launch_us=5.0)
    assert ex.check_predicted_time(pred.time_ms * 1e3, work, launch_us=5.0)
    fb = ex.check_predicted_time(pred.memory_ms * 1e3, work, launch_us=5.0)
    assert not fb and "launch cost" in fb.message
    big = intensity.matmul(8192, 8192, 8192, "bf16")
    p = prediction.predict(big, H100, launch_us=5.0)
    fb = ex.check_predicted_time((p.memory_ms + p.compute_ms + p.launch_ms) * 1e3 * 1.2, big,
                                  launch_us=5.0)
    assert not fb and "off by" in fb.message
    assert_unanswered(ex.check_predicted_time(..., work, launch_us=5.0))
    assert not ex.check_predicted_time(float("nan"), work, launch_us=5.0)


@pytest.mark.parametrize("case", list(ex.BELOW_ROOF_CASES))
def test_below_roof(case, capsys):
    c = ex.BELOW_ROOF_CASES[case]
    assert ex.check_below_roof(c["answer"], case)
    assert ex.check_below_roof(c["answer"].upper() + " ", case)
    for letter in c["options"]:
        if letter != c["answer"]:
            fb = ex.check_below_roof(letter, case)
            assert not fb and "is not it" in fb.message
    assert "one of the letters" in ex.check_below_roof("z", case).message
    assert_unanswered(ex.check_below_roof(..., case))
    ex.show_below_roof(case)
    assert c["question"] in capsys.readouterr().out
    with pytest.raises(KeyError):
        ex.check_below_roof("a", "no such case")
