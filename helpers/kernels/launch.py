"""Launching a compiled kernel again without Triton's per-call Python.

``kernel[grid](*args)`` binds the arguments to a specialization, finds or compiles the
binary and launches it; on later calls of the same shapes, most of that is host time
spent to reach the same binary. A plan that keeps the compiled kernel
(``compiled = kernel[grid](...)`` on its first call) can call ``compiled[grid](*args)``
instead, which is leaner, but still builds a closure, asks the driver for the current
device and stream and builds launch metadata for hooks on every call. :func:`lean` calls
the compiled kernel's launcher as that path does, and nothing else.

Why it matters: a small product or a decoding step takes a few microseconds of GPU time,
and its launches follow one another only as fast as the host issues them. On the lent
H200 machine the matmul's kept plan spent 27-42 us of host time a call (a copy and a
kernel, two launches through ``compiled[grid]``) against 4-6 us of kernels, and the split-KV
decoding call 49 us against SDPA's 23 us (``tests/gpu/matmul_kept_plan_probe.py``,
``tests/gpu/decode_call_probe.py``).

A profiler that sets Triton's launch hooks gets the usual path, which calls them.
Kernels that take host-side TMA descriptors have their own launcher, which also keeps the
descriptors' encodings (:mod:`~helpers.kernels.matmul.tma_launch`).
"""

from __future__ import annotations

from typing import Callable

import triton


def hooked(hook) -> bool:
    """Whether a launch hook is set: ``None`` means none in older Tritons; newer ones keep
    a ``HookChain`` that is never ``None`` and holds its hooks in ``calls``."""
    return hook is not None and bool(getattr(hook, "calls", True))


def lean(compiled, grid: tuple, device: int, current_stream=None) -> Callable:
    """``launch(*args)``: ``compiled[grid](*args)`` on the current stream of ``device`` (an
    index), without Triton's per-call Python; every argument as ``compiled[grid]`` takes
    it, constexprs included. ``grid``: three ints. ``current_stream``: the driver's
    (``device -> stream``; given by tests, which have no driver)."""
    if len(grid) != 3:
        raise ValueError(f"a launcher's grid has three axes, got {grid!r}")
    usual = compiled[grid]
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    current_stream = current_stream or triton.runtime.driver.active.get_current_stream
    knobs = triton.knobs.runtime
    x, y, z = grid

    def launch(*args) -> None:
        if hooked(knobs.launch_enter_hook) or hooked(knobs.launch_exit_hook):
            usual(*args)
        else:
            run(x, y, z, current_stream(device), function, metadata, None, None, None, *args)

    return launch
