"""Roofline arithmetic (the chart is tested in test_plots_roofline.py)."""

import pytest

from helpers import roofline
from helpers.hardware import GPUS

H100 = GPUS["H100-SXM"]


def test_memory_slope_left_of_the_ridge():
    # 1 FLOP/byte at 3350 GB/s can only reach 3.35 TFLOP/s.
    assert roofline.attainable_tflops(1.0, H100, "bf16") == pytest.approx(3.35)
    assert roofline.bound(1.0, H100, "bf16") == "memory"


def test_flat_roof_right_of_the_ridge():
    assert roofline.attainable_tflops(10_000, H100, "bf16") == pytest.approx(989.4)
    assert roofline.bound(10_000, H100, "bf16") == "compute"


def test_the_ridge_is_where_both_limits_meet():
    ridge = H100.ridge_point("fp16")
    assert roofline.attainable_tflops(ridge, H100, "fp16") == pytest.approx(H100.peak("fp16"))
    assert roofline.bound(ridge * 0.99, H100, "fp16") == "memory"


def test_predicted_time_of_a_vector_add():
    # C = A + B, 1e9 fp16 elements: 6e9 bytes at 3.35 TB/s = 1.79 ms; 1e9 FLOPs is nothing.
    t = roofline.predicted_time_ms(1e9, 6e9, H100, "fp16")
    assert t == pytest.approx(6e9 / 3350e9 * 1e3)


def test_predicted_time_adds_the_launch_cost():
    t0 = roofline.predicted_time_ms(0, 4096, H100, "fp32")
    t1 = roofline.predicted_time_ms(0, 4096, H100, "fp32", launch_us=5)
    assert t1 - t0 == pytest.approx(0.005)


def test_nonsense_intensity_is_refused():
    with pytest.raises(ValueError, match="positive"):
        roofline.attainable_tflops(0, H100, "fp32")
