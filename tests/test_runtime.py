"""Mode logic and the messages for setups that cannot work."""

import sys

import pytest
import torch

import helpers
from helpers import runtime
from helpers.runtime import CPU, GPU, SetupError, decide_mode


@pytest.mark.parametrize(
    "requested, cuda, interpret, expected",
    [
        (None, True, None, GPU),      # a GPU is used when present
        (None, False, None, CPU),     # otherwise the interpreter
        (None, True, "1", CPU),       # TRITON_INTERPRET=1 asks for the interpreter
        ("cpu", True, None, CPU),     # COURSE_MODE=cpu forces it on a GPU machine
        ("GPU ", True, None, GPU),    # case and spaces are forgiven
        ("cpu", False, None, CPU),
    ],
)
def test_decide_mode(requested, cuda, interpret, expected):
    assert decide_mode(requested, cuda, interpret) == expected


def test_gpu_mode_without_a_gpu_says_what_to_check():
    with pytest.raises(SetupError, match="no CUDA device.*nvidia-smi"):
        decide_mode("gpu", False, None)


def test_gpu_mode_with_interpreter_forced_is_refused():
    with pytest.raises(SetupError, match="TRITON_INTERPRET"):
        decide_mode("gpu", True, "1")


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(SetupError, match="COURSE_MODE=gpu, COURSE_MODE=cpu"):
        decide_mode("tpu", True, None)


def test_old_triton_interpreter_with_new_numpy_is_stopped():
    with pytest.raises(SetupError, match=r"Triton >= 3.7.*pip install 'triton>=3.7'"):
        runtime.check_versions(CPU, "3.6.0", "2.5.0")


@pytest.mark.parametrize("mode, triton_v, numpy_v", [
    (CPU, "3.7.1", "2.4.6"),   # the pinned pair
    (CPU, "3.6.0", "2.3.5"),   # old interpreter, old numpy: fine
    (GPU, "3.6.0", "2.5.2"),   # compiled kernels are not affected
    (CPU, "3.10.0+git1234", "2.4.0"),
])
def test_good_version_combinations_pass(mode, triton_v, numpy_v):
    runtime.check_versions(mode, triton_v, numpy_v)


def test_missing_triton_points_to_linux_wsl_or_cloud(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` fail
    with pytest.raises(SetupError, match="Linux.*WSL.*cloud"):
        runtime._import_triton()


def test_cpu_mode_is_active_in_ci_and_sets_the_interpreter():
    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    import os

    assert helpers.MODE == CPU
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert helpers.device() == "cpu"


def test_pick_size_follows_the_mode():
    expected = 1 << 28 if runtime.is_gpu() else 1 << 12
    assert helpers.pick_size(gpu=1 << 28, cpu=1 << 12) == expected


def test_bf16_dot_refused_in_cpu_mode_only():
    runtime.check_dot_dtype(torch.float16)
    if runtime.is_cpu():
        with pytest.raises(runtime.InterpreterLimitationError, match="float16 or torch.float32"):
            runtime.check_dot_dtype(torch.bfloat16)
    else:
        runtime.check_dot_dtype(torch.bfloat16)


def test_timing_needs_a_gpu():
    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    with pytest.raises(runtime.NeedsGPUError, match="recorded GPU run"):
        runtime.require_gpu("timing a kernel")


def test_report_names_versions_device_and_mode(capsys):
    helpers.report()
    out = capsys.readouterr().out
    import numpy
    import triton

    for needle in (torch.__version__, triton.__version__, numpy.__version__, "mode", "device"):
        assert needle in out
