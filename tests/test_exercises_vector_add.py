"""The prediction checks of lesson 03 (vector add): right predictions pass, wrong ones are
told what they overlooked without the measured value, unanswered ones say so, and nonsense
never crashes a check."""

import pytest

from helpers import records
from helpers.exercises import vector_add as ex
from support import assert_unanswered, committed_record

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


def test_one_slow_small_launch_does_not_move_the_small_time():
    run = _run(small_us=9.6)                          # the smallest size waited once
    run.results["sizes"] += [{"dtype": "fp16", "n": n, "bytes": 6 * n, "triton_ms": us / 1e3,
                              "torch_ms": us / 1e3, "triton_gbps": 6 * n / (us * 1e3)}
                             for n, us in ((2**14, 5.1), (2**16, 5.0), (2**18, 6.0))]
    assert ex.small_time_us(run)[0] == pytest.approx(5.1)    # median of 2^12 .. 2^16


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


def _blocks_run(small_block_ratio=2.4):
    """A run with a block-size sweep: BLOCK_SIZE 128 takes ``small_block_ratio`` times
    torch.add's time, 1024 the same time."""
    run = _run()
    ms = 6 * BIG / 3000e6                                           # fp16 at 3000 GB/s
    run.results["blocks"] = [
        {"dtype": "fp16", "n": BIG, "block_size": b, "bytes": 6 * BIG, "torch_ms": ms,
         "triton_ms": ms * r, "triton_gbps": 3000 / r, "torch_gbps": 3000.0}
        for b, r in ((128, small_block_ratio), (1024, 1.0))]
    return run


def test_versus_torch_with_a_small_block():
    run = _blocks_run()
    assert ex.versus_torch(run, block_size=128) == "slower"
    assert ex.versus_torch(run, block_size=1024) == "same"
    right = ex.check_versus_torch("slower", run, block_size=128)
    assert right and "BLOCK_SIZE 128" in right.part
    same = ex.check_versus_torch("same", run, block_size=128)        # the classic slip
    assert not same and "same bytes do not mean the same speed" in same.message
    assert "1 element per operand" in same.message and "in flight" in same.message
    faster = ex.check_versus_torch("faster", run, block_size=128)
    assert not faster and "more programs" in faster.message
    for fb in (same, faster):
        assert "2.4" not in fb.message, "a wrong answer is not told the measured gap"
    assert ex.check_versus_torch("same", run, block_size=1024)
    assert "one of" in ex.check_versus_torch("quicker", run, block_size=128).message
    assert_unanswered(ex.check_versus_torch(..., run, block_size=128))
    with pytest.raises(KeyError, match="BLOCK_SIZE 256"):
        ex.versus_torch(run, block_size=256)


def test_the_committed_record_answers_what_the_lesson_says():
    """The lesson's answers hold on the committed H100 record: the add reaches the 85 %
    target, a small add costs about lesson 02's launch floor, and torch.add is no faster."""
    run = committed_record("vector_add", "H100-SXM")
    assert ex.measured_fraction(run) >= 0.85
    floor = committed_record("roofline", "H100-SXM").results["launch_floor_us"]
    assert abs(ex.small_time_us(run)[0] - floor) <= ex.TIME_TOLERANCE * floor
    assert ex.check_versus_torch("same", run)
    assert ex.check_versus_torch("slower", run, block_size=128)   # the lesson's prediction
    assert not ex.check_versus_torch("same", run, block_size=128)


def _mid_run():
    """The committed record's schema at the sizes lesson 03 asks about (fp32 2^20, 2^24)."""
    run = _run(small_us=5.0)
    for n, us in ((2**20, 9.0), (2**24, 72.0)):
        run.results["sizes"].append({"dtype": "fp32", "n": n, "bytes": 12 * n,
                                     "triton_ms": us / 1e3, "torch_ms": us / 1e3,
                                     "triton_gbps": 12 * n / (us * 1e3)})
    return run


def test_fraction_of_peak_at_a_middle_size():
    run = _mid_run()                                  # 2^24 fp32: 201 MB in 72 µs
    frac = 12 * 2**24 / 72e-6 / 3350e9
    assert ex.measured_fraction(run, "fp32", 2**24) == pytest.approx(frac)
    assert ex.check_fraction_of_peak(frac + 0.03, run, "fp32", n=2**24)
    high = ex.check_fraction_of_peak(0.99, run, "fp32", n=2**24)
    assert not high and "launch floor" in high.message and f"{frac:.3f}" not in high.message
    low = ex.check_fraction_of_peak(0.3, run, "fp32", n=2**24)
    assert not low and "several times the launch floor" in low.message
    assert "2^24" in low.part
    assert_unanswered(ex.check_fraction_of_peak(..., run, "fp32", n=2**24))


def test_time_at_a_middle_size_needs_floor_and_bytes():
    run = _mid_run()                                  # 2^20 fp32: 12.6 MB, floor 5 µs
    bytes_us = 12 * 2**20 / 3350e9 * 1e6              # 3.76 µs at the table's peak
    assert ex.check_time_us(5.0 + bytes_us, run, 2**20)
    alone = ex.check_time_us(bytes_us, run, 2**20)
    assert not alone and "bytes' time at full bandwidth alone" in alone.message
    assert "9" not in alone.message.split("off")[1]
    floor = ex.check_time_us(5.0, run, 2**20)
    assert not floor and "launch floor alone" in floor.message
    assert "too high" in ex.check_time_us(40, run, 2**20).message
    assert "expected a number" in ex.check_time_us("fast", run, 2**20).message
    assert_unanswered(ex.check_time_us(..., run, 2**20))


def test_the_committed_record_answers_the_middle_sizes():
    run = committed_record("vector_add", "H100-SXM")
    assert 0.5 < ex.measured_fraction(run, "fp32", 2**24) < 0.9
    floor = committed_record("roofline", "H100-SXM").results["launch_floor_us"]
    bytes_us = 12 * 2**20 / (3350e9) * 1e6
    assert ex.check_time_us(floor + bytes_us, run, 2**20)
    assert not ex.check_time_us(floor, run, 2**20)
