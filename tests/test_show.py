import pytest

from helpers.kernels.first_kernel import scale_shift, scale_shift_kernel
from helpers.show import Source, show, source_of


def test_kernel_source_is_the_real_one():
    src = source_of(scale_shift_kernel)
    assert src.startswith("@triton.jit\ndef scale_shift_kernel(")
    assert "tl.program_id" in src


def test_plain_functions_too():
    assert "def scale_shift(" in source_of(scale_shift)


def test_html_is_highlighted():
    html = Source(source_of(scale_shift_kernel), "k")._repr_html_()
    assert "<span" in html and "program_id" in html


def test_show_prints_outside_a_notebook(capsys):
    show(scale_shift_kernel)
    assert "tl.store" in capsys.readouterr().out


def test_objects_without_source_get_a_clear_error():
    with pytest.raises(TypeError, match="cannot find the source"):
        source_of(len)


def test_an_outline_leaves_out_the_marked_regions():
    from helpers.show import outline, _without_markers

    code = ("def f(x):\n    y = 1\n    # >>> assignment: the loop\n    for i in x:\n"
            "        y += i\n    # <<< assignment\n    return y\n")
    assert outline(code) == "def f(x):\n    y = 1\n    ...  # the loop\n    return y\n"
    assert "assignment" not in _without_markers(code) and "for i in x" in _without_markers(code)
