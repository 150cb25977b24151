"""The exercise checks of lesson 01 (the memory wall): right answers pass, the classic slips
are named, unanswered exercises say so, and nonsense never crashes a check."""

import torch

from helpers import hardware, intensity
from helpers.exercises import memory_wall as ex
from support import assert_unanswered

H100 = hardware.GPUS["H100-SXM"]


def test_copy_bytes():
    assert ex.check_copy_bytes(2 * 1000 * 2, 1000, torch.float16)
    assert "reads but not the writes" in ex.check_copy_bytes(2000, 1000).message
    assert "bits" in ex.check_copy_bytes(32_000, 1000).message
    assert "elements, not bytes" in ex.check_copy_bytes(2000, 1000, "fp32").message
    assert_unanswered(ex.check_copy_bytes(..., 1000))
    assert "expected a number" in ex.check_copy_bytes("4000", 1000).message


def test_ridge_point():
    assert ex.check_ridge_point(989.4e12 / 3350e9)
    assert ex.check_ridge_point(H100.ridge_point("fp32"), dtype="fp32")
    assert "fp32 CUDA-core peak" in ex.check_ridge_point(H100.ridge_point("fp32")).message
    assert "bytes per FLOP" in ex.check_ridge_point(3350e9 / 989.4e12).message
    assert "unit prefix" in ex.check_ridge_point(989.4 / 3350).message
    assert ex.check_ridge_point(hardware.GPUS["T4"].ridge_point("fp16"), gpu="T4", dtype="fp16")


def test_percent_of_peak():
    assert ex.check_percent_of_peak(90, 3015, 3350)
    assert "fraction" in ex.check_percent_of_peak(0.9, 3015, 3350).message
    assert not ex.check_percent_of_peak(80, 3015, 3350)


def test_fusion_speedup():
    shape = (16384, 16384)
    expected = (intensity.bias_gelu(*shape, torch.float32, "unfused").nbytes
                / intensity.bias_gelu(*shape, torch.float32, "fused").nbytes)
    assert ex.check_fusion_speedup(expected, shape)
    assert ex.check_fusion_speedup(2, shape), "2x is within 2% of the exact byte ratio"
    assert "compared FLOPs" in ex.check_fusion_speedup(1, shape).message
    assert "inverted" in ex.check_fusion_speedup(0.5, shape).message


def test_regime():
    assert ex.check_regime("latency", 2**16, floor_us=5, peak_gbps=3350)
    assert ex.check_regime("bandwidth", 2**31, floor_us=5, peak_gbps=3350)
    fb = ex.check_regime("bandwidth", 2**16, floor_us=5, peak_gbps=3350)
    assert not fb and "launch floor" in fb.message
    assert not ex.check_regime("fast", 2**16, floor_us=5, peak_gbps=3350)
    assert_unanswered(ex.check_regime(..., 2**16, floor_us=5, peak_gbps=3350))


COALESCING = {"baseline": "copy, strips of rows (coalesced)", "dtype": "fp32",
              "rows": [{"name": "copy, strips of rows (coalesced)", "ms": 0.2},
                       {"name": "copy, strips of columns (strided)", "ms": 1.8},
                       {"name": "transpose, strips (reads coalesced, writes strided)", "ms": 1.4}]}


def test_l2_ratio_is_a_prediction_that_never_shows_the_value():
    assert ex.check_l2_ratio(2.5, 7331, 2928)
    assert ex.check_l2_ratio(3, 7331, 2928), "within a factor of 1.35"
    fb = ex.check_l2_ratio(1, 7331, 2928)
    assert not fb and "too low" in fb.message and "on the chip" in fb.message
    fb = ex.check_l2_ratio(10, 7331, 2928)
    assert not fb and "too high" in fb.message and "SRAM" in fb.message
    assert "2.50" not in fb.message and "2.504" not in fb.message and "GiB" not in fb.message
    assert_unanswered(ex.check_l2_ratio(..., 7331, 2928))


def test_strided_slowdown_reads_the_record_and_names_the_slips():
    assert ex.check_strided_slowdown(8, COALESCING), "the sector count, 32 / 4"
    assert ex.check_strided_slowdown(9, COALESCING)
    assert "sectors" in ex.check_strided_slowdown(1, COALESCING).message
    assert "a warp touches" in ex.check_strided_slowdown(32, COALESCING).message
    fb = ex.check_strided_slowdown(3, COALESCING)
    assert not fb and "too low" in fb.message and "9" not in fb.message
    assert "at most one" in ex.check_strided_slowdown(20, COALESCING).message
    assert_unanswered(ex.check_strided_slowdown(..., COALESCING))


CHAIN = {"kernels": [{"name": "bias_add_kernel", "calls_per_op": 1, "us_per_call": 710.0},
                     {"name": "gelu_kernel", "calls_per_op": 1, "us_per_call": 712.0}]}


def test_unfused_kernel_us_against_the_profiled_kernels():
    one_pass = 2 * 2**30 / 3016e9 * 1e6          # 1 GiB read + 1 GiB written at the copy's rate
    assert ex.check_unfused_kernel_us(one_pass, CHAIN)
    fb = ex.check_unfused_kernel_us(one_pass / 2, CHAIN)
    assert not fb and "one direction" in fb.message and "711" not in fb.message
    assert "whole chain" in ex.check_unfused_kernel_us(2 * 711, CHAIN).message
    assert "too high" in ex.check_unfused_kernel_us(5000, CHAIN).message
    assert "unit prefix" in ex.check_unfused_kernel_us(0.711, CHAIN).message   # ms for µs
    assert_unanswered(ex.check_unfused_kernel_us(..., CHAIN))
