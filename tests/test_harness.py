"""The grading harness's one version check: a GPU machine whose Triton interpreter cannot run
loops (Triton < 3.7 under NumPy >= 2.4) cannot watch a looping kernel's loads and stores, and
says so; every other machine, and every kernel without a loop, is watched."""

import numpy
import pytest
import triton

from helpers import runtime
from helpers.grading import harness
from helpers.grading.assignments import attention, tiling


@pytest.mark.parametrize("gpu,triton_version,numpy_version,stops", [
    (True, "3.6.0", "2.4.1", True),       # the GPU machine's pair: the interpreter stops
    (True, "3.7.1", "2.4.1", False),      # fixed in Triton 3.7
    (True, "3.6.0", "2.3.5", False),      # older NumPy: loops run
    (False, "3.6.0", "2.4.1", False),     # CPU mode runs the course's own environment
])
def test_loops_are_unwatchable_only_where_the_interpreter_stops(
        monkeypatch, gpu, triton_version, numpy_version, stops):
    monkeypatch.setattr(runtime, "is_gpu", lambda: gpu)
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(numpy, "__version__", numpy_version)
    why = harness.loops_unwatchable()
    assert (why is not None) == stops, why
    if stops:
        assert f"Triton {triton_version}" in why and f"NumPy {numpy_version}" in why
        assert "./course env" in why, "the message says how to grade anyway"

    class Straight(harness.KernelTask):      # no loop: always watchable
        pass

    class Looping(harness.KernelTask):
        loops = True

    assert Straight().unwatchable() is None
    assert Looping().unwatchable() == why


def test_the_looping_assignments_declare_their_loops():
    # Lesson 04's matmul loops over K, lesson 06's forward over the key blocks: both take
    # the harness's check instead of a copy of it.
    assert tiling.TASK.loops and attention.TASK.loops
