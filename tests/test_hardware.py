"""The GPU table: complete, sourced, and physically sensible."""

import pytest
import torch

from helpers import bench, hardware
from helpers.hardware import GPUS, lookup

REQUIRED = ["T4", "L4", "A10G", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200",
            "RTX4090", "B200"]


def test_every_required_gpu_is_in_the_table():
    assert set(REQUIRED) <= set(GPUS)


@pytest.mark.parametrize("key", REQUIRED)
def test_row_is_complete_and_sourced(key):
    g = GPUS[key]
    assert g.hbm_bandwidth_gbs > 100 and g.sm_count > 0 and g.smem_per_sm_kib >= 64
    assert g.l2_mib > 0 and g.memory_gib >= 16
    text = " ".join(g.sources).lower()
    for field in ("bandwidth", "compute", "sm_count", "smem", "l2", "memory"):
        assert field in text, f"{key}: no source for {field}"
    assert all(src.strip() for src in g.sources.values())


@pytest.mark.parametrize("key", REQUIRED)
def test_tensor_cores_beat_cuda_cores(key):
    g = GPUS[key]
    assert g.peak("fp16") > g.peak("fp32")
    if "fp8" in g.peak_tflops:
        assert g.peak("fp8") >= g.peak("fp16")
    if "bf16" in g.peak_tflops:
        assert g.peak("bf16") == g.peak("fp16")


def test_ridge_point_is_peak_over_bandwidth():
    h100 = GPUS["H100-SXM"]
    # 989.4 TFLOP/s / 3.35 TB/s: about 295 FLOPs must be done per byte loaded.
    assert h100.ridge_point("bf16") == pytest.approx(989.4e12 / 3350e9)
    assert 250 < h100.ridge_point(torch.bfloat16) < 350
    assert h100.ridge_point("fp32") == pytest.approx(20.0, rel=0.01)


def test_newer_gpus_need_more_flops_per_byte():
    # The memory wall in one line: compute grew faster than bandwidth, V100 -> A100 -> H100.
    assert GPUS["A100-80GB"].ridge_point("fp16") < GPUS["H100-SXM"].ridge_point("fp16")


def test_missing_dtype_says_which_ones_exist():
    with pytest.raises(ValueError, match="T4 has no bf16.*fp32, fp16"):
        GPUS["T4"].peak("bf16")


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("NVIDIA B200", "B200"),
])
def test_driver_names_map_to_rows(name, key):
    assert lookup(name).key == key


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(KeyError, match="H100-SXM"):
        lookup("Voodoo 3")


@pytest.mark.parametrize("dtype, key", [(torch.float32, "fp32"), (torch.float16, "fp16"),
                                        (torch.bfloat16, "bf16"), ("float8_e4m3fn", "fp8"),
                                        ("tf32", "tf32")])
def test_dtype_keys(dtype, key):
    assert hardware.dtype_key(dtype) == key


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown data type"):
        hardware.dtype_key(torch.int64)


def test_current_gpu_in_cpu_mode_is_none_and_default_is_h100():
    from helpers import runtime

    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    assert hardware.current_gpu() is None
    assert hardware.current_or().key == "H100-SXM"


def test_probes_refuse_to_run_without_a_gpu():
    from helpers import runtime

    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    with pytest.raises(runtime.NeedsGPUError):
        bench.measure_copy_bandwidth()


@pytest.mark.gpu
def test_probes_on_a_gpu_are_plausible():
    from helpers import runtime

    if not runtime.is_gpu():
        pytest.skip("needs a GPU")
    spec = hardware.current_gpu()
    copy = bench.measure_copy_bandwidth(1 << 28)
    mm = bench.measure_matmul_tflops(4096)
    assert copy["gbps"] > 0 and mm["tflops"] > 0
    if spec is not None:
        assert copy["gbps"] < 1.05 * spec.hbm_bandwidth_gbs
        assert mm["tflops"] < 1.05 * spec.peak("bf16")
