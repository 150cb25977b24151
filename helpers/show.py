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


# A kernel marks the lines a graded assignment asks the learner to write; a lesson shows
# the kernel's outline, with those lines left out.
HIDDEN_START, HIDDEN_END = "# >>> assignment", "# <<< assignment"


def outline(code: str) -> str:
    """``code`` with each marked region replaced by one ``...`` line at its indent."""
    out, hiding = [], False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith(HIDDEN_START):
            hiding = True
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}...  # {stripped[len(HIDDEN_START):].strip(' :') or 'yours to write'}")
        elif stripped.startswith(HIDDEN_END):
            hiding = False
        elif not hiding:
            out.append(line)
    return "\n".join(out) + "\n"


def _without_markers(code: str) -> str:
    return "".join(line for line in code.splitlines(keepends=True)
                   if not line.strip().startswith((HIDDEN_START, HIDDEN_END)))


def show(obj, hide_assignment: bool = False) -> None:
    """Display ``obj``'s source: highlighted in a notebook, printed in a terminal.

    ``hide_assignment`` leaves out the regions a graded assignment asks for (marked
    ``# >>> assignment: what`` ... ``# <<< assignment``), each shown as ``...``."""
    code = source_of(obj)
    code = outline(code) if hide_assignment else _without_markers(code)
    src = Source(code, getattr(_unwrap(obj), "__name__", repr(obj)))
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
