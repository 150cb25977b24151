from helpers.feedback import check_choice, check_number


def test_right_answer_within_tolerance():
    fb = check_number("bytes", 6.02e9, 6e9, rel=0.01, unit="bytes")
    assert fb.passed and "right" in str(fb)


def test_named_mistake():
    fb = check_number("bytes", 4e9, 6e9, unit="bytes", mistakes=[(4e9, "you forgot the write of C")])
    assert not fb.passed and "forgot the write of C" in fb.message


def test_bits_vs_bytes_is_spotted():
    fb = check_number("bytes", 48e9, 6e9, unit="bytes")
    assert not fb.passed and "bits vs bytes" in fb.message


def test_off_by_percent_and_no_answer():
    assert "+50.0%" in check_number("t", 1.5, 1.0).message
    assert check_number("t", ..., 1.0).status == "not implemented"
    assert not check_number("t", float("nan"), 1.0).passed
    assert "expected a number" in check_number("t", "fast", 1.0).message


def test_choice():
    assert check_choice("bound", "Memory", "memory", ("memory", "compute")).passed
    assert "one of" in check_choice("bound", "gpu", "memory", ("memory", "compute")).message
