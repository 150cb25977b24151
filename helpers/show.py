"""``helpers.show(kernel)``: the real source of a kernel, highlighted, in the notebook.

Lessons show the code they run instead of a copy that could drift from it.
"""

from __future__ import annotations

import inspect
import textwrap


class Source:
    """Highlighted in Jupyter (HTML); plain source text everywhere else."""

    def __init__(self, code: str, name: str):
        self.code = code
        self.name = name

    def __repr__(self) -> str:
        return self.code

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        return highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, style="friendly"))


def _unwrap(obj):
    # @triton.jit wraps the Python function in a JITFunction (or, in CPU mode, an
    # InterpretedFunction); @triton.autotune / @triton.heuristics wrap that again.
    seen = set()
    while id(obj) not in seen:
        seen.add(id(obj))
        inner = getattr(obj, "fn", None)
        if inner is None or inner is obj:
            break
        obj = inner
    return obj


def source_of(obj) -> str:
    """The source text of a function, kernel, class or module."""
    target = _unwrap(obj)
    try:
        return textwrap.dedent(inspect.getsource(target)).rstrip() + "\n"
    except (TypeError, OSError) as err:
        raise TypeError(
            f"helpers.show cannot find the source of {obj!r}: pass a kernel, a function, a "
            "class or a module defined in a file (not one typed at the prompt)."
        ) from err


def show(obj) -> None:
    """Display ``obj``'s source: highlighted in a notebook, printed in a terminal."""
    src = Source(source_of(obj), getattr(_unwrap(obj), "__name__", repr(obj)))
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(src.code)
        return
    if get_ipython() is None:
        print(src.code)
    else:
        display(src)
