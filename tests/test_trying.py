"""``helpers.guarded()``: a learner's try cell runs its launches under the bounds guard.

In CPU mode an unmasked kernel's stray stores would corrupt the heap and kill the notebook's
kernel process; under the guard they are not performed and the block ends with an
:class:`~helpers.trying.OutOfBounds` that names the kernel, the tensor, the indices and the
fix. In GPU mode the block runs as it is.
"""

import pytest
import torch
import triton
import triton.language as tl

import helpers
from helpers import runtime, trying

BLOCK = 64


@triton.jit
def unmasked_add(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(c_ptr + offsets, tl.load(a_ptr + offsets) + tl.load(b_ptr + offsets))


@triton.jit
def masked_add(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask)
    tl.store(c_ptr + offsets, a + tl.load(b_ptr + offsets, mask=mask), mask=mask)


def add(kernel, a, b):
    c = torch.zeros_like(a)
    kernel[(triton.cdiv(a.numel(), BLOCK),)](a, b, c, a.numel(), BLOCK_SIZE=BLOCK)
    return c


def inputs(n=BLOCK + 5):
    a = torch.arange(n, dtype=torch.float32, device=helpers.device())
    return a, 2 * a


cpu_only = pytest.mark.skipif(runtime.is_gpu(), reason="the guard watches interpreted kernels "
                              "(CPU mode); on a GPU the block runs as it is")


def _guard_installed() -> bool:
    import triton.runtime.interpreter as itp

    return "create_masked_load" in vars(itp.interpreter_builder)


def test_helpers_exports_the_guard():
    assert helpers.guarded is trying.guarded and helpers.OutOfBounds is trying.OutOfBounds


@cpu_only
def test_an_unmasked_kernel_is_stopped_and_named():
    a, b = inputs()
    with pytest.raises(trying.OutOfBounds) as caught:
        with helpers.guarded():
            c = add(unmasked_add, a, b)
    message = str(caught.value)
    assert message.startswith("unmasked_add read and wrote outside its tensors"), message
    for words in ("program 1 of 2 read a_ptr[69:128], past the end of a_ptr (69 elements)",
                  "read b_ptr[69:128]", "wrote c_ptr[69:128], past the end of c_ptr",
                  "mask = offsets < n_elements", "Nothing was overwritten"):
        assert words in message, (words, message)
    assert {v.op for v in caught.value.violations} == {"load", "store"}
    assert [launch.name for launch in caught.value.launches] == ["unmasked_add"]
    # The in-bounds lanes ran; the learner's tensors are intact and usable.
    assert torch.equal(c, a + b) and torch.equal(b, 2 * a)
    assert not _guard_installed(), "the guard's patches outlive the block"


@cpu_only
def test_a_masked_kernel_runs_silently_and_is_listed():
    a, b = inputs()
    with helpers.guarded() as guard:
        c = add(masked_add, a, b)
    assert torch.equal(c, a + b)
    assert guard.watched and [launch.name for launch in guard.launches] == ["masked_add"]
    assert not _guard_installed()


@cpu_only
def test_the_blocks_own_error_goes_through_with_a_note():
    a, b = inputs()
    with pytest.raises(NotImplementedError) as caught:
        with helpers.guarded():
            add(unmasked_add, a, b)
            raise NotImplementedError()          # a stub further down the launcher
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert notes.startswith("Before this error: unmasked_add read and wrote"), notes
    with pytest.raises(ValueError, match="plain"):
        with helpers.guarded():
            raise ValueError("plain")
    assert not _guard_installed()


@cpu_only
def test_a_hint_replaces_the_generic_advice():
    a, b = inputs()
    with pytest.raises(trying.OutOfBounds) as caught:
        with helpers.guarded(hint="Mask the K tail."):
            add(unmasked_add, a, b)
    assert "Mask the K tail." in str(caught.value)
    assert trying.MASK_HINT not in str(caught.value)


@cpu_only
def test_many_accesses_are_summed_up_not_listed_one_by_one():
    a, b = inputs(5 * BLOCK + 1)          # 6 programs; the last one hangs over the end
    with pytest.raises(trying.OutOfBounds) as caught:
        with helpers.guarded():
            for _ in range(3):
                add(unmasked_add, a, b)
    message = str(caught.value)
    assert "in 3 launches" in message and "(and 2 more such accesses)" in message, message
    assert message.count("\n  * ") == 3, message


def test_gpu_mode_runs_the_block_as_it_is(monkeypatch):
    a, b = inputs()
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    with helpers.guarded() as guard:
        assert not _guard_installed()
        c = add(masked_add, a, b)
    assert not guard.watched and guard.launches == []
    assert torch.equal(c, a + b)
