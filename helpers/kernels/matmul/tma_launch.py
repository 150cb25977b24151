"""Lesson 07: launching a compiled kernel that takes host-side TMA descriptors, without
paying for the descriptors on every call.

A kernel argument that is a :class:`~triton.tools.tensor_descriptor.TensorDescriptor`
costs the host three things per call before the launch itself: building the Python
object (which checks alignment and box sizes), Triton encoding it into the 128-byte
``CUtensorMap`` the TMA unit reads (``cuTensorMapEncodeTiled``), and unpacking it into
the launcher's arguments. Measured on an H100 80GB HBM3 machine (triton 3.6, the
persistent matmul at 1000^3 bf16, a loop of 1000 calls): 47 us of host time per call with
three descriptors, against 22 us for ``torch.matmul``. The GPU needs 11-13 us for that
product: back-to-back calls run at the host's pace unless it is faster, and a benchmark
that flushes L2 between calls hides the host only while the flush lasts longer (81 us on
that H100, less on an H200, whose memory is faster). With the encodings kept, and the
plan's Python trimmed to what a call must read (``matmul()`` back to back, without an L2
flush, on one H100 in one process, medians of 7 rounds of 1000 calls): 14.4-15.0 us a call
before the trim, 11.6-11.8 us after, ``torch.matmul`` 12.0-12.8 us; at 4096 x 4096 x 1024,
where the GPU sets the pace, 55-56 us for both.

An encoding depends only on the tensor's address, shape, strides, dtype and the box, so
:func:`direct` keeps one per tensor it has seen and encodes only a new one. It calls
Triton's own launcher for the compiled kernel with the arguments Triton 3.6 gives it;
with another Triton, whose launcher takes other arguments, it returns ``None`` and the
caller launches the usual way. The caller checks the first direct launch against a usual
one (:func:`~helpers.kernels.matmul.persistent.launch` does).
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

# A launch hook set (a profiler's) sends a call the usual way. Triton 3.6 keeps a hook
# chain that is never None: read as "not None", every call took the usual path,
# descriptors and all (31 us a call at 1000^3 bf16 on an H100, against 13 us for
# torch.matmul).
from ..launch import hooked

# Encodings kept per launcher; past this many (a loop over fresh tensors) start afresh.
MAX_KEPT = 64
# Triton 3.6's launcher arguments before the kernel's own: grid x, y, z, stream, function,
# cooperative, PDL, global and profile scratch, metadata, launch metadata, enter and exit hooks.
_TRITON_36_LAYOUT = "iiiKKppOOOOOO"


def direct(compiled, grid: tuple, boxes: list) -> Callable | None:
    """``launch(tensors, args)`` for ``compiled``, whose first ``len(boxes)`` arguments are
    descriptors of ``tensors`` (box ``boxes[i]`` for tensor ``i``) and whose other
    arguments are ``args`` (constexprs included, as ``compiled[grid](...)`` takes them);
    or ``None`` where this Triton's launcher is not the one this calls.

    A launcher serves one plan: tensor ``i`` has the same shape, strides and dtype at every
    call (the plan is kept per shape and layout; its output is allocated to that shape),
    so an encoding is looked up by the tensor's address alone. Reading the shape, strides
    and dtype again cost about a microsecond a tensor, on a call the host paces."""
    try:
        from triton.backends.nvidia import driver as nvidia
        launcher = compiled.run
        unpack = launcher.launch            # Triton's wrapper that encodes the descriptors
        cells = dict(zip(unpack.__code__.co_freevars,
                         (cell.cell_contents for cell in unpack.__closure__ or ())))
        raw, metas = cells["launcher"], cells["tensordesc_meta"]
        ok = (getattr(nvidia, "_BASE_ARGS_FORMAT", None) == _TRITON_36_LAYOUT
              and cells["tensordesc_indices"] == set(range(len(boxes)))
              and len(metas) == len(boxes) and all(m is not None for m in metas)
              and not launcher.global_scratch_size and not launcher.profile_scratch_size)
        function, metadata = compiled.function, compiled.packed_metadata
        cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    except (AttributeError, KeyError, TypeError, ImportError):
        return None
    if not ok:
        return None
    current_stream = triton.runtime.driver.active.get_current_stream
    knobs = triton.knobs.runtime
    kept: dict = {}

    def encoded(i: int, t: torch.Tensor) -> tuple:
        key = (i, t.data_ptr())
        found = kept.get(key)
        if found is None:
            if len(kept) >= MAX_KEPT:
                kept.clear()
            desc = TensorDescriptor(t, list(t.shape), list(t.stride()), boxes[i])
            found = kept[key] = tuple(nvidia.make_tensordesc_arg(desc, metas[i]))
        return found

    def launch(tensors: tuple, args: tuple) -> None:
        if hooked(knobs.launch_enter_hook) or hooked(knobs.launch_exit_hook):
            # A profiler's hooks want the usual path, which calls them.
            descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), box)
                     for t, box in zip(tensors, boxes)]
            compiled[grid](*descs, *args)
            return
        unpacked = [x for i, t in enumerate(tensors) for x in encoded(i, t)]
        raw(*grid, current_stream(tensors[0].get_device()), function, cooperative, pdl,
            None, None, metadata, None, None, None, *unpacked, *args)

    return launch
