"""The prediction checks of lesson 03 (vector add): right predictions pass, wrong ones are
told what they overlooked without the measured value, unanswered ones say so, and nonsense
never crashes a check."""

import pytest

from helpers import records
from helpers.exercises import vector_add as ex
from support import assert_unanswered

BIG = 2**28


def _run(big_gbps=3000.0, torch_ratio=1.0, small_us=4.4):
    """A run in the record's schema (its "sizes" rows), on the H100 SXM of the table."""
    rows = []
    for dtype, size in (("fp16", 2), ("fp32", 4)):
        for n, ms in ((4096, small_us / 1e3), (BIG, 3 * size * BIG / (big_gbps * 1e6))):
            rows.append({"dtype": dtype, "n": n, "bytes": 3 * size * n, "triton_ms": ms,
                         "torch_ms": ms * torch_ratio,
                         "triton_gbps": 3 * size * n / (ms * 1e6)})
    return records.Record("vector_add", {"gpu": "NVIDIA H100 80GB HBM3"},
                          {"sizes": rows, "big_n": BIG})


def test_fraction_of_peak():
    run = _run(big_gbps=3000.0)                       # 3000 / 3350 = 0.896
    assert ex.measured_fraction(run) == pytest.approx(3000 / 3350)
    assert ex.check_fraction_of_peak(0.9, run)
    high = ex.check_fraction_of_peak(1.0, run)
    assert not high and "too high" in high.message and "0.896" not in high.message
    low = ex.check_fraction_of_peak(0.5, run)
    assert not low and "too low" in low.message
    assert "percentage" in ex.check_fraction_of_peak(90, run).message
    assert "not a fraction" in ex.check_fraction_of_peak(-0.2, run).message
    assert "expected a number" in ex.check_fraction_of_peak("most", run).message
    assert_unanswered(ex.check_fraction_of_peak(..., run))


def test_small_time():
    run = _run(small_us=4.4)
    assert ex.check_small_time_us(4.56, run)          # lesson 02's floor is the prediction
    fb = ex.check_small_time_us(0.01, run)            # bytes over bandwidth alone
    assert not fb and "full bandwidth alone" in fb.message and "floor" in fb.message
    assert "4.4" not in fb.message
    fb = ex.check_small_time_us(40, run)
    assert not fb and "too high" in fb.message
    assert_unanswered(ex.check_small_time_us(None, run))


def test_one_slow_small_launch_does_not_move_the_small_time():
    run = _run(small_us=9.6)                          # the smallest size waited once
    run.results["sizes"] += [{"dtype": "fp16", "n": n, "bytes": 6 * n, "triton_ms": us / 1e3,
                              "torch_ms": us / 1e3, "triton_gbps": 6 * n / (us * 1e3)}
                             for n, us in ((2**14, 5.1), (2**16, 5.0), (2**18, 6.0))]
    assert ex.small_time_us(run)[0] == pytest.approx(5.1)    # median of 2^12 .. 2^16
    assert ex.check_small_time_us(4.56, run)


def test_versus_torch():
    same, faster = _run(torch_ratio=1.01), _run(torch_ratio=1.2)
    assert ex.versus_torch(same) == "same" and ex.versus_torch(faster) == "faster"
    assert ex.versus_torch(_run(torch_ratio=0.8)) == "slower"
    assert ex.check_versus_torch("Same", same)
    fb = ex.check_versus_torch("faster", same)
    assert not fb and "memory-bound" in fb.message
    assert "larger than" in ex.check_versus_torch("same", faster).message
    assert "one of" in ex.check_versus_torch("quicker", same).message
    assert_unanswered(ex.check_versus_torch(..., same))


def test_the_committed_record_answers_what_the_lesson_says():
    """The lesson's answers hold on the committed H100 record: the add reaches the 85 %
    target, a small add costs about lesson 02's launch floor, and torch.add is no faster."""
    run = records.load("vector_add", "H100-SXM")
    assert ex.measured_fraction(run) >= 0.85
    floor = records.load("roofline", "H100-SXM").results["launch_floor_us"]
    assert ex.check_small_time_us(floor, run)
    assert ex.check_versus_torch("same", run)
