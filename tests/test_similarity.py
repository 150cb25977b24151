"""Copy detection (helpers.grading.similarity): a course kernel renamed is found; a kernel
with a real change is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.grading.similarity import course_copy, course_kernels, normal_form

REPO = Path(__file__).resolve().parents[1]

RENAMED = '''
@triton.jit
def my_add(x, y, out, n, BLOCK: tl.constexpr):
    """Adds two vectors."""
    i = tl.program_id(axis=0)   # my block
    idx = i * BLOCK + tl.arange(0, BLOCK)
    keep = idx < n
    p = tl.load(x + idx, mask=keep)

    q = tl.load(y + idx, mask=keep)
    r = p.to(tl.float32) + q.to(tl.float32)
    tl.store(out + idx, r.to(out.dtype.element_ty), mask=keep)
'''


def test_the_course_kernels_are_found_and_cached():
    kernels = course_kernels()
    assert "helpers.kernels.vector_add.add_kernel" in kernels.values()
    assert course_kernels() is kernels


def test_a_renamed_copy_of_the_course_vector_add_is_flagged():
    assert course_copy(RENAMED) == "helpers.kernels.vector_add.add_kernel"
    assert course_copy(RENAMED.replace("@triton.jit\n", "")) == \
        "helpers.kernels.vector_add.add_kernel"
    indented = "\n".join("    " + line for line in RENAMED.splitlines())
    assert course_copy(indented) == "helpers.kernels.vector_add.add_kernel"


@pytest.mark.parametrize("change", [
    ("p.to(tl.float32) + q.to(tl.float32)", "p.to(tl.float32) - q.to(tl.float32)"),
    ("keep = idx < n", "keep = idx <= n"),
    ("p = tl.load(x + idx, mask=keep)", "p = tl.load(x + idx)"),
    ("p.to(tl.float32) + q.to(tl.float32)", "q.to(tl.float32) + p.to(tl.float32)"),
    ("tl.load(y + idx", "tl.load(x + idx"),
])
def test_a_kernel_with_a_real_change_is_not_flagged(change):
    old, new = change
    assert old in RENAMED
    assert course_copy(RENAMED.replace(old, new)) is None


def test_rubbish_is_not_flagged():
    assert course_copy("") is None
    assert course_copy("def (:") is None
    assert course_copy("x = 1") is None


def test_the_solution_kernel_of_03_is_its_own():
    """The solution's kernel adds in the inputs' dtype; the course's goes through fp32."""
    import nbformat

    nb = nbformat.read(str(REPO / "solutions" / "03_vector_add_intensity.ipynb"), as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code" and "@triton.jit" in c.source]
    assert sources
    for src in sources:
        assert normal_form(src) is not None
        assert course_copy(src) is None
