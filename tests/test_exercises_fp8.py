"""The prediction checks of lesson 09 (eight-bit floats): right answers pass, each classic
slip is named, an unanswered prediction says so, and no wrong answer is told the expected
value (each prediction is checked before the cell that prints it).

Napkin answers are written out here from the formats' definitions; the record-based ones
use ``tests/fp8_fixture.py`` (made-up numbers)."""

import pytest

import fp8_fixture
from helpers.exercises import fp8 as ex
from support import assert_unanswered


def _hidden(feedback, *expected: str) -> None:
    """A wrong answer's message names none of the ``expected`` spellings of the answer."""
    assert not feedback
    for text in expected:
        assert text not in feedback.message, (text, feedback.message)


def test_largest():
    # e4m3fn: 1.75 x 2^8 (its top exponent holds numbers); e5m2: 1.75 x 2^15.
    assert ex.check_largest(448, "e4m3") and ex.check_largest(57344, "e5m2")
    assert "inf and NaN" in ex.check_largest(240, "e4m3").message
    assert "top exponent" in ex.check_largest(114688, "e5m2").message
    assert "too low" in ex.check_largest(400, "e4m3").message
    _hidden(ex.check_largest(240, "e4m3"), "448")
    _hidden(ex.check_largest(400, "e4m3"), "448")
    assert_unanswered(ex.check_largest(None))


def test_relative_step():
    assert ex.check_relative_step(0.125, "e4m3") and ex.check_relative_step(0.25, "e5m2")
    assert "half a step" in ex.check_relative_step(0.0625, "e4m3").message
    assert "next value" in ex.check_relative_step(1.125, "e4m3").message
    _hidden(ex.check_relative_step(0.0625, "e4m3"), "0.125", "1/8")
    assert_unanswered(ex.check_relative_step(..., "e5m2"))


def test_scale_bytes():
    # 3000 x 5000 in 1 x 128 groups: 40 groups a row (the last one partial), fp32 each.
    assert ex.check_scale_bytes(4 * 3000 * 40, (3000, 5000), "1x128")
    assert ex.check_scale_bytes(4 * 144 * 56, (18432, 7168), "128x128")
    assert "not their bytes" in ex.check_scale_bytes(3000 * 40, (3000, 5000), "1x128").message
    assert "partial groups" in ex.check_scale_bytes(4 * 3000 * 5000 / 128, (3000, 5000),
                                                    "1x128").message
    _hidden(ex.check_scale_bytes(3000 * 40, (3000, 5000), "1x128"), "480,000", "480000")
    assert_unanswered(ex.check_scale_bytes(None, (3000, 5000), "1x128"))


def test_amax_bytes():
    # bf16 read twice (amax, then divide), FP8 written once: 2 + 2 + 1 bytes a value.
    n = 8192 * 8192
    assert ex.amax_bytes((8192, 8192)) == 5 * n
    assert ex.amax_bytes((8192, 8192), delayed=True) == 3 * n
    assert ex.check_amax_bytes(5 * n, (8192, 8192))
    msg = lambda got: ex.check_amax_bytes(got, (8192, 8192)).message  # noqa: E731
    assert "second time" in msg(3 * n)
    assert "one byte" in msg(6 * n)
    assert "forgot the write" in msg(4 * n)
    assert "bits" in msg(40 * n)
    _hidden(ex.check_amax_bytes(3 * n, (8192, 8192)), f"{5 * n:,}", f"{5 * n:.4g}", str(5 * n))
    assert_unanswered(ex.check_amax_bytes(None, (8192, 8192)))


@pytest.mark.parametrize("best", ["tensor", "row", "block"])
def test_most_accurate_reads_the_table(best):
    worst = {s: 0.3 for s in ex.SCALINGS}
    worst[best] = 0.1
    table = fp8_fixture.accuracy_table(worst)
    assert ex.most_accurate(table) == best
    assert ex.check_most_accurate(best, table)
    for other in set(ex.SCALINGS) - {best}:
        fb = ex.check_most_accurate(other, table)
        assert not fb and "is not it" in fb.message and f"'{best}'" not in fb.message


def test_most_accurate_names_the_slips():
    table = fp8_fixture.accuracy_table()          # block best
    assert "every token's row" in ex.check_most_accurate("row", table).message
    assert "zero band" in ex.check_most_accurate("tensor", table).message
    assert "0.1" in ex.check_most_accurate("block", table).message   # the numbers, once right
    assert "0.1" not in ex.check_most_accurate("row", table).message
    assert "answer with one of" in ex.check_most_accurate("rows!", table).message
    assert_unanswered(ex.check_most_accurate(None, table))


@pytest.mark.parametrize("never,want", [({"mixed": 5.0, "positive": 100.0}, "positive"),
                                        ({"mixed": 50.0, "positive": 3.0}, "mixed"),
                                        ({"mixed": 1.2, "positive": 1.5}, "neither")])
def test_lost_bits_reads_the_record(never, want):
    rec = fp8_fixture.record(never=never)
    assert ex.lost_bits(rec) == want
    assert ex.check_lost_bits(want, rec)
    for other in set(ex.EXPOSES) - {want}:
        fb = ex.check_lost_bits(other, rec)
        assert not fb and "is not it" in fb.message and "e-0" not in fb.message


def test_lost_bits_names_the_slips():
    rec = fp8_fixture.record()
    assert "cancel" in ex.check_lost_bits("mixed", rec).message
    assert "14 bits" in ex.check_lost_bits("neither", rec).message
    assert "65,536" in ex.check_lost_bits("positive", rec).message
    assert_unanswered(ex.check_lost_bits(None, rec))


def test_fp8_speedup():
    rec = fp8_fixture.record()                    # 1260 / 700 TFLOP/s: 1.8x
    shape = fp8_fixture.SHAPES[1]
    assert ex.check_fp8_speedup(1.8, rec, shape) and ex.check_fp8_speedup(1.7, rec, shape)
    assert "1.8x" in ex.check_fp8_speedup(1.8, rec, shape).message
    msg = lambda got: ex.check_fp8_speedup(got, rec, shape).message  # noqa: E731
    assert "datasheet's two roofs" in msg(2.0)
    assert "FP8's time by bf16's" in msg(700 / 1260)
    assert "halved bytes" in msg(4.0)
    assert "too low" in msg(1.2) and "too high" in msg(3.0)
    for got in (2.0, 1.2, 3.0):
        _hidden(ex.check_fp8_speedup(got, rec, shape), "1.8")
    assert_unanswered(ex.check_fp8_speedup(None, rec, shape))


def test_fp8_speedup_at_the_roofs_ratio_passes():
    # Where the record's ratio is the datasheet's, 2x is right, not a slip.
    rec = fp8_fixture.record(tflops={"ours, tensor scales": 1400.0})
    assert ex.check_fp8_speedup(2.0, rec, fp8_fixture.SHAPES[0])


def test_fp8_speedup_without_the_versions():
    rec = fp8_fixture.record()
    rec.results["speed"][0]["versions"] = [v for v in rec.results["speed"][0]["versions"]
                                           if v["name"] != "torch.matmul, bf16"]
    fb = ex.check_fp8_speedup(1.8, rec, fp8_fixture.SHAPES[0])
    assert not fb and fb.status == "error"
