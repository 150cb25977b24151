"""Answers in code: the functions of a student release that answer a graded part.

A release must not carry an answer as code: the answer formulas stay home
(``keys_*.py``), the solutions' marked regions become stubs, and no other module may hold
the same function under another name (06's grader once held part 1's reference merge). A
strict release (``./course release``, :mod:`.release`) refuses one whose ``.py`` files hold
a function that is, up to renaming (:func:`.similarity.normal_form`), one of

* the functions of the course's answer formulas, ``helpers/grading/**/keys_*.py``;
* the functions in the solution regions of ``solutions/*.ipynb`` (those that hold a line
  between ``### BEGIN SOLUTION`` and ``### END SOLUTION``),

each of more than one statement (a one-line conversion is no answer), but for
:data:`KNOWN_ANSWERS`. Instructor's side only: it reads the solutions.
"""

from __future__ import annotations

import ast
from pathlib import Path

from . import build

REPO = Path(__file__).resolve().parents[2]

# Functions that travel although they are an answer up to renaming, and why (none today:
# assignment 05 once asked for the RMSNorm kernel lesson 05 runs; it asks for LayerNorm).
KNOWN_ANSWERS: dict[str, str] = {}


def _statements(body):
    """Every statement in ``body``, nested ones included (never an expression: fast)."""
    todo = list(body)
    while todo:
        stmt = todo.pop()
        yield stmt
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo += [s for s in getattr(stmt, field, ()) if isinstance(s, ast.AST)]


def _defs(tree, lines=None, sizes=None):
    """The functions of ``tree`` of more than one statement (a docstring aside) and their
    sizes, ``(statements, nodes)``, which renaming keeps: only those that hold one of
    ``lines``, and whose size is in ``sizes``, if given."""
    for fn in _statements(tree.body):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) \
            and isinstance(fn.body[0].value, ast.Constant) else fn.body
        if len(body) < 2 or lines is not None and not any(
                fn.lineno <= n <= fn.end_lineno for n in lines):
            continue
        statements = sum(1 for _ in _statements(body))
        if sizes is not None and statements not in {s for s, _ in sizes}:
            continue
        size = (statements, sum(1 for stmt in body for _ in ast.walk(stmt)))
        if sizes is None or size in sizes:
            yield fn, size


def _forms(source: str, lines=None, sizes=None) -> dict:
    """``{(name, size): normal form}`` of :func:`_defs` of ``source``; none if it does not
    parse."""
    from .similarity import normal_form
    from .static import parse

    try:
        tree = parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    text = source.splitlines(keepends=True)
    forms = {(fn.name, size): normal_form("".join(text[fn.lineno - 1:fn.end_lineno]))
             for fn, size in _defs(tree, lines, sizes)}
    return {k: form for k, form in forms.items() if form is not None}


def course_answers(repo: Path = REPO) -> dict:
    """``{(size, normal form): where}`` of the course's answers: the functions of its answer
    formulas (``keys_*.py``) and those of its solutions' marked regions."""
    import nbformat

    from .static import _python

    out = {}
    for path in sorted((repo / "helpers" / "grading").rglob("keys_*.py")):
        rel = path.relative_to(repo).as_posix()
        for (name, size), form in _forms(path.read_text()).items():
            out[(size, form)] = f"{rel}: {name}"
    for sol in sorted((repo / "solutions").glob("*.ipynb")):
        cells = [c for c in nbformat.read(sol, as_version=4).cells if c.cell_type == "code"]
        for number, cell in enumerate(cells, 1):
            lines = build.solution_lines(cell.source)
            forms = _forms(_python(cell.source), lines) if lines else {}
            for (name, size), form in forms.items():
                out[(size, form)] = f"{sol.name}, code cell {number}: {name}"
    return out


def answers_in(dest: Path, repo: Path = REPO) -> list[str]:
    """The functions of the release at ``dest`` that are, up to renaming, one of the
    course's answers (:func:`course_answers`), but for :data:`KNOWN_ANSWERS`."""
    known = course_answers(repo)
    sizes = {size for size, _ in known}
    problems = []
    for path in sorted(dest.rglob("*.py")):
        rel = path.relative_to(dest).as_posix()
        text = path.read_text(errors="replace")
        for (name, size), form in _forms(text, sizes=sizes).items() if "def " in text else ():
            where = f"{rel}: {name}"
            if (size, form) in known and where not in KNOWN_ANSWERS:
                problems.append(f"{where} is {known[(size, form)]} up to renaming: it "
                                "answers a graded part")
    return problems
