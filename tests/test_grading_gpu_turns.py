"""The GPU's turns (helpers/grading/gpu.py): a timing has the GPU alone, untimed work shares
it, and nobody waits past the grader's limit. File locks: they run on any machine."""

from __future__ import annotations

import threading
import time

import pytest

from helpers.grading import gpu


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "_folder", lambda: tmp_path)


def _hold(turn, seconds, log, name, started=None):
    with turn(5.0):
        log.append(f"{name} in")
        if started is not None:
            started.set()
        time.sleep(seconds)
        log.append(f"{name} out")


def test_untimed_turns_share_the_gpu():
    log, started = [], threading.Event()
    first = threading.Thread(target=_hold, args=(gpu.shared, 0.3, log, "a", started))
    first.start()
    started.wait(2)
    with gpu.shared(0.1):              # no wait: a second untimed turn runs beside the first
        log.append("b in")
    first.join()
    assert log == ["a in", "b in", "a out"], log


def test_a_timing_waits_for_untimed_work_and_runs_alone():
    log, started = [], threading.Event()
    cell = threading.Thread(target=_hold, args=(gpu.shared, 0.3, log, "cell", started))
    cell.start()
    started.wait(2)
    timing = threading.Thread(target=_hold, args=(gpu.alone, 0.3, log, "timing"))
    timing.start()
    time.sleep(0.1)                    # the timing now waits at the gate ...
    late = threading.Thread(target=_hold, args=(gpu.shared, 0.0, log, "late"))
    late.start()                       # ... and new untimed work waits behind it
    for t in (cell, timing, late):
        t.join()
    assert log == ["cell in", "cell out", "timing in", "timing out", "late in", "late out"], log


def test_nobody_waits_for_the_gpu_past_the_limit():
    started, release = threading.Event(), threading.Event()

    def hog():
        with gpu.alone(5.0):
            started.set()
            release.wait(5)

    t = threading.Thread(target=hog)
    t.start()
    started.wait(2)
    begin = time.monotonic()
    with pytest.raises(gpu.GpuBusy, match="busy"):
        with gpu.shared(0.2):
            pass
    with pytest.raises(gpu.GpuBusy):
        with gpu.alone(0.2):
            pass
    assert time.monotonic() - begin < 2
    release.set()
    t.join()
    with gpu.alone(0.5):               # free again once the holder is done
        pass
