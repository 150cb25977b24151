"""Attention calls kept by their signature: a call like one seen before goes straight to
its compiled launches.

A forward call first checks its inputs, makes 4-D views, picks its setting (the tuner's,
or the split-KV plan's) and launches through Triton's JIT, which binds the arguments to a
specialization again; a backward call does that for three kernels. All of it is settled by
the call's *signature*: the shapes, strides, dtypes, devices and 16-byte alignment of the
tensors, the mask and the scale. So the first call of a signature that ran compiled
leaves a *kept call* here (the kernels' compiled launchers with every other argument
fixed, checked once against the first call's outputs:
:func:`~helpers.kernels.attention.forward.kept_call`,
:func:`~helpers.kernels.attention.decode.kept_call`,
:func:`~helpers.kernels.attention.backward.kept_call`), and a later call of the same
signature allocates its outputs and launches, nothing else. A backward whose inputs had to
be copied (not contiguous, or dO in another dtype) is not kept: its copies are its own.

Why: a decoding step against a short cache, or a forward over a few hundred tokens, takes
ten to a few tens of microseconds on the GPU, and the host's time per call was longer on
the lent H200 machine (the split-KV call: 49 us of host time against 23 us for SDPA's,
``tests/gpu/decode_call_probe.py``). Calls in a loop then run at the host's pace.
"""

from __future__ import annotations

import torch

from ... import runtime

ENABLED = True          # off: every call takes the usual path (and nothing is kept)
KEPT_CALLS: dict = {}   # signature (call_key, backward_key) -> the kept call, or USUAL
MAX_KEPT = 256          # past this many signatures (a sweep of shapes), start afresh
# A signature whose kept launches failed their check (another Triton's launcher, say, or
# outputs with NaN, which equal nothing): it takes the usual path, and is not tried again.
USUAL = "usual"
_SCALARS = (type(None), int, float)     # a scale keyed by value (a tensor's may change)


def call_key(q, k, v, causal, sm_scale) -> tuple | None:
    """Everything the forward's checks, setting and launch depend on, read straight off
    its arguments; ``None`` (not kept) for arguments that are not tensors with storage, a
    mask that is neither a bool nor a string, or a scale that is not a number (the usual
    path then says what is wrong, or takes them as it always did). ``type(causal)`` too: 1
    equals True, but only True is a mask the checks take."""
    if type(causal) not in (bool, str) or type(sm_scale) not in _SCALARS:
        return None
    try:
        return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype,
                k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(),
                q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16,
                type(causal), causal, sm_scale)
    except (AttributeError, TypeError, RuntimeError):     # RuntimeError: no storage
        return None


def backward_key(do, q, k, v, o, lse, causal, sm_scale) -> tuple | None:
    """As :func:`call_key`, for the backward: the forward's signature and dO's, O's and
    the log-sum-exps' (a key of its own kind: ``"backward"`` first)."""
    forward = call_key(q, k, v, causal, sm_scale)
    try:
        return None if forward is None else (
            "backward", forward, *((x.shape, x.stride(), x.dtype, x.get_device(),
                                    x.data_ptr() % 16) for x in (do, o, lse)))
    except (AttributeError, TypeError, RuntimeError):
        return None


def lookup(call):
    """The kept call of signature ``call``, :data:`USUAL`, or ``None`` (not seen)."""
    return KEPT_CALLS.get(call) if ENABLED and call is not None else None


def _compiled_here() -> bool:
    """Kernels run compiled here, and not under CUDA-graph capture (a kept call's first
    check synchronises, which a capture refuses)."""
    return runtime.is_gpu() and not torch.cuda.is_current_stream_capturing()


def worth_keeping(call) -> bool:
    """Whether to try keeping the launches of a call of signature ``call`` that was not
    found (:func:`lookup`)."""
    return ENABLED and call is not None and _compiled_here()


def keep(call, kept) -> None:
    """Keep ``kept`` under ``call``: the kept call, or ``None`` where none could be made
    (:data:`USUAL` is kept then, so that the next call does not try again)."""
    if len(KEPT_CALLS) >= MAX_KEPT:
        KEPT_CALLS.clear()
    KEPT_CALLS[call] = USUAL if kept is None else kept
