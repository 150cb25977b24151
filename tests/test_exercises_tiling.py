"""Lesson 04's prediction checks: right answers pass, known slips are named, a wrong
answer never prints the expected value, and a blank one is a neutral "no answer yet"."""

import pytest

from helpers import compiled
from helpers.exercises import tiling as ex

# A ladder with the two rungs check_order_gain reads (made-up speeds: the check's logic,
# not a record, is under test here).
LADDER = [{"step": "v2", "n": 4096, "dtype": "fp16", "tflops": 400.0},
          {"step": "v3", "n": 4096, "dtype": "fp16", "tflops": 420.0}]


def _neutral(fb):
    assert not fb.passed and fb.status == "not implemented" and "no answer yet" in fb.message


def test_blank_answers_are_neutral():
    occ = compiled.Occupancy(by_registers=1, by_shared=1, by_warps=8, by_blocks=32)
    _neutral(ex.check_tile_intensity(..., 128, 256))
    _neutral(ex.check_max_stages(..., "H100-SXM", "fp16", 128, 256, 64))
    _neutral(ex.check_warps_to_avoid_spills(None, 128, 256))
    _neutral(ex.check_order_gain(..., LADDER))
    _neutral(ex.check_programs_per_sm(..., occ))


def test_tile_intensity_right_and_slips():
    assert ex.check_tile_intensity(85.3, 128, 256)
    assert ex.check_tile_intensity(64, 128, 128)                  # square: B/2 in fp16
    assert "2 FLOPs" in ex.check_tile_intensity(42.7, 128, 256).message
    assert "bytes, not elements" in ex.check_tile_intensity(170.7, 128, 256).message
    assert "square" in ex.check_tile_intensity(64, 128, 256).message
    wrong = ex.check_tile_intensity(50, 128, 256)
    assert not wrong and "85" not in wrong.message and "too low" in wrong.message
    assert not ex.check_tile_intensity("85", 128, 256)


def test_max_stages():
    args = ("H100-SXM", "fp16", 128, 256, 64)                    # 48 KiB a stage, 227 KiB
    assert ex.check_max_stages(4, *args)
    assert "registers" in ex.check_max_stages(3, *args).message   # counted the C tile
    assert "fp32" in ex.check_max_stages(2, *args).message        # tiles counted as fp32
    too_many = ex.check_max_stages(5, *args)
    assert not too_many and "too many" in too_many.message and "4" not in too_many.message
    assert not ex.check_max_stages(3.5, *args)


def test_max_stages_on_a_smaller_gpu():
    # 99 KiB per program on Ada: three 32 KiB stages fit, four do not
    assert ex.check_max_stages(3, "RTX4090", "fp16", 128, 128, 64)
    assert not ex.check_max_stages(4, "RTX4090", "fp16", 128, 128, 64)


def test_warps_to_avoid_spills():
    assert ex.check_warps_to_avoid_spills(8, 128, 256)           # 128 registers a thread
    few = ex.check_warps_to_avoid_spills(4, 128, 256)            # 256: over 255
    assert not few and "256" in few.message and "too few" in few.message
    assert "fewer warps" in ex.check_warps_to_avoid_spills(16, 128, 256).message
    assert "power of two" in ex.check_warps_to_avoid_spills(6, 128, 256).message
    assert ex.check_warps_to_avoid_spills(4, 128, 128)           # 128 registers at 4 warps


def test_order_gain_reads_the_ladder():
    assert ex.check_order_gain(1.05, LADDER)                     # recorded 1.05
    assert ex.check_order_gain(1.01, LADDER)                     # within 0.05
    high = ex.check_order_gain(1.5, LADDER)
    assert not high and "too high" in high.message and "1.05" not in high.message
    assert "too low" in ex.check_order_gain(0.8, LADDER).message
    assert not ex.check_order_gain(-1, LADDER)
    with pytest.raises(KeyError):
        ex.check_order_gain(1.0, LADDER, n=8192)


def test_programs_per_sm():
    big = compiled.Occupancy(by_registers=1, by_shared=1, by_warps=8, by_blocks=32)
    right = ex.check_programs_per_sm(1, big)
    assert right and "registers and shared memory" in right.message   # both limits named
    assert not ex.check_programs_per_sm(2, big)
    reg = compiled.Occupancy(by_registers=2, by_shared=6, by_warps=16, by_blocks=32)
    slip = ex.check_programs_per_sm(6, reg)                       # shared memory alone
    assert not slip and "registers" in slip.message and "2" not in slip.message
    assert "shared memory" in ex.check_programs_per_sm(
        3, compiled.Occupancy(by_registers=3, by_shared=2, by_warps=16, by_blocks=32)).message
    assert "too few" in ex.check_programs_per_sm(1, reg).message
