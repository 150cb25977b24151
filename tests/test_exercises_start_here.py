"""Lesson 00's predictions: right answers pass, the classic slips are named, a wrong answer
never shows the value, unanswered predictions say so, and nonsense never crashes a check."""

from helpers import hardware
from helpers.exercises import start_here as ex
from support import assert_unanswered

H100 = hardware.GPUS["H100-SXM"]


def shows(feedback, value) -> bool:
    """Does the message give ``value`` away (as a whole number, or to 3 or 4 digits)?"""
    forms = [f"{value:.3g}", f"{value:.4g}"] + ([f"{value:,.0f}"] if value >= 10 else [])
    return any(form in feedback.message for form in forms)


def test_program_count():
    assert ex.check_program_count(9766, 10_000_019, 1024)
    assert ex.check_program_count(3, 10, 4)
    fb = ex.check_program_count(9765, 10_000_019, 1024)
    assert not fb and "rounded down" in fb.message and not shows(fb, 9766)
    assert "multiplied" in ex.check_program_count(10_000_019 * 1024, 10_000_019, 1024).message
    assert "too high" in ex.check_program_count(20_000, 10_000_019, 1024).message
    assert "too low" in ex.check_program_count(9000, 10_000_019, 1024).message
    assert "too low" in ex.check_program_count(9764, 10_000_019, 1024).message
    assert ex.check_program_count(2, 8, 4), "an exact multiple: no rounding to name"
    assert_unanswered(ex.check_program_count(..., 10, 4))
    assert "expected a number" in ex.check_program_count("3", 10, 4).message


def test_least_time():
    n = 2**28
    expected = 3 * n * 2 / 3350e9 * 1e6
    assert ex.check_least_time_us(expected, n, "fp16")
    assert ex.check_least_time_us(481, n, "fp16")
    fb = ex.check_least_time_us(expected * 2 / 3, n, "fp16")
    assert not fb and "not the write" in fb.message and not shows(fb, expected)
    assert "bits" in ex.check_least_time_us(expected * 8, n, "fp16").message
    assert "elements, not bytes" in ex.check_least_time_us(expected / 2, n, "fp16").message
    fb = ex.check_least_time_us(expected / 1000, n, "fp16")
    assert "too low" in fb.message and "1000" in fb.message and not shows(fb, expected)
    assert ex.check_least_time_us(3 * n * 4 / 4800e9 * 1e6, n, "fp32", gpu="H200")
    assert_unanswered(ex.check_least_time_us(..., n, "fp16"))


def test_tiny_fraction():
    nbytes, ms = 24576, 0.004352
    measured = nbytes / (ms * 1e-3) / 3350e9
    assert ex.check_tiny_fraction(measured, nbytes, ms)
    assert ex.check_tiny_fraction(measured * 2.5, nbytes, ms), "within a factor of 3"
    fb = ex.check_tiny_fraction(0.5, nbytes, ms)
    assert not fb and "fixed cost" in fb.message and "too high" in fb.message
    assert not shows(fb, measured)
    assert "too low" in ex.check_tiny_fraction(measured / 10, nbytes, ms).message
    assert "percentage" in ex.check_tiny_fraction(17, nbytes, ms).message
    assert "not a fraction" in ex.check_tiny_fraction(-0.1, nbytes, ms).message
    assert "not a fraction" in ex.check_tiny_fraction(250, nbytes, ms).message
    assert_unanswered(ex.check_tiny_fraction(..., nbytes, ms))
