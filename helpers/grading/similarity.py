"""Copy detection, as a note for the instructor: is a learner's kernel one of the course's own?

A learner who pastes ``helpers.kernels.vector_add.add_kernel`` into the notebook and renames
it has a correct kernel and has learned little. The grader cannot tell honest convergence
from copying, so this is a *flag* in the report and the gradebook notes, never a verdict:
points are not deducted for it.

Two kernels are the same here when their code is identical up to

* the names the kernel chooses: its own name, its parameters, its locals (each is replaced
  by a placeholder in order of first appearance, so ``a, b`` and ``x, y`` agree but a
  swapped use of them does not);
* whitespace, comments, docstrings and decorators (``@triton.jit`` or none).

Everything else must match: attribute names (``tl.load``, ``.to``), keyword names
(``mask=``), global names (``tl``), operators, constants and the shape of the code. The
normal form is Python's own: :mod:`ast` parses the source and ``ast.unparse`` writes the
renamed tree back, so formatting and comments vanish by construction.

A second, looser form catches a copy edited to look different: statements that do nothing
(``pass``, a bare constant, ``x = x``, ``x = x + 0``) are dropped, each parameter is named
by its place and each local by a digest of the expression it holds, and the statements
are compared as a bag, so independent lines put in another order still match (and a line
that loads another input, or adds in another order, does not). It applies to kernels of at
least :data:`MIN_BAG` statements: shorter ones are too few lines to tell a copy from the
same idea written twice.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import inspect
import pkgutil
import textwrap

from .static import parse

KERNEL_PACKAGE = "helpers.kernels"
MIN_BAG = 5


def _function(tree: ast.AST) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


class _Renamer(ast.NodeTransformer):
    """Names of the function itself, its parameters and its locals -> ``_v0``, ``_v1``, ..."""

    def __init__(self, local: set[str]):
        self.local, self.names = local, {}

    def _name(self, name: str) -> str:
        if name not in self.local:
            return name
        return self.names.setdefault(name, f"_v{len(self.names)}")

    def visit_Name(self, node: ast.Name):
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node: ast.arg):
        node.arg = self._name(node.arg)
        self.generic_visit(node)            # the annotation (tl.constexpr) stays
        return node


def _first_function(source: str) -> ast.FunctionDef | None:
    """The first function in ``source``; None if there is none or it does not parse."""
    try:
        return _function(parse(textwrap.dedent(source)))
    except (SyntaxError, RecursionError, ValueError):
        return None


def _locals(fn) -> set[str]:
    """The names a function chooses: its parameters and what it assigns."""
    args = fn.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a}
    return local | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, (ast.Store, ast.Del))}


def normal_form(source: str) -> str | None:
    """The first function in ``source``, renamed and stripped; None if it does not parse."""
    fn = _first_function(source)
    if fn is None:
        return None
    fn.decorator_list = []
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        fn.body = body[1:] or [ast.Pass()]
    renamer = _Renamer(_locals(fn))
    fn.name = "_kernel"
    renamer.visit(fn)
    return ast.unparse(ast.Module(body=[fn], type_ignores=[]))


class _ByMeaning(ast.NodeTransformer):
    """Each name the function chooses replaced by what it holds (``meaning``)."""

    def __init__(self, meaning: dict[str, str]):
        self.meaning = meaning

    def visit_Name(self, node: ast.Name):
        if node.id in self.meaning:
            node.id = self.meaning[node.id]
        return node

    def visit_arg(self, node: ast.arg):
        node.arg = self.meaning.get(node.arg, node.arg)
        return node


def _digest(text: str) -> str:
    return "_v" + hashlib.sha1(text.encode()).hexdigest()[:10]


def _meant(node, meaning) -> str:
    return ast.unparse(_ByMeaning(meaning).visit(copy.deepcopy(node)))


def _bind(target, value: str, meaning: dict) -> None:
    """``target`` now holds ``value``: each name in it named after it (and its place)."""
    if isinstance(target, ast.Name):
        meaning[target.id] = _digest(value)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for i, element in enumerate(target.elts):
            _bind(element, f"{value}[{i}]", meaning)
    elif isinstance(target, ast.Starred):
        _bind(target.value, f"*{value}", meaning)


def _statements(body, meaning: dict, out: list[str]) -> None:
    """Each statement in its normal form, in order; compound statements as their header
    and then their bodies. A name is named by the expression it was last given, so lines
    that do not depend on each other may come in any order."""
    for stmt in body:
        if _no_op(stmt):
            continue
        if isinstance(stmt, ast.Assign):
            value = _meant(stmt.value, meaning)
            for target in stmt.targets:
                _bind(target, value, meaning)
            out.append(" = ".join([_meant(t, meaning) for t in stmt.targets] + [value]))
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            value = (f"{_meant(stmt.target, meaning)} {type(stmt.op).__name__} "
                     f"{_meant(stmt.value, meaning)}")
            _bind(stmt.target, value, meaning)
            out.append(f"{_meant(stmt.target, meaning)} = {value}")
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            iterated = _meant(stmt.iter, meaning)
            _bind(stmt.target, f"for {iterated}", meaning)
            out.append(f"for {_meant(stmt.target, meaning)} in {iterated}")
            _statements(stmt.body + stmt.orelse, meaning, out)
        elif isinstance(stmt, (ast.If, ast.While)):
            out.append(f"{type(stmt).__name__} {_meant(stmt.test, meaning)}")
            _statements(stmt.body + stmt.orelse, meaning, out)
        elif isinstance(stmt, (ast.With, ast.Try)):
            _statements(stmt.body, meaning, out)
        else:
            out.append(_meant(stmt, meaning))


def _no_op(node) -> bool:
    """``pass``, a bare constant (a docstring), ``x = x``, ``x = x + 0``, ``x = x * 1``."""
    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True
    if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            and isinstance(node.targets[0], ast.Name):
        value, name = node.value, node.targets[0].id
        if isinstance(value, ast.Name) and value.id == name:
            return True
        if isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name) \
                and value.left.id == name and isinstance(value.right, ast.Constant) \
                and (isinstance(value.op, (ast.Add, ast.Sub)) and value.right.value == 0
                     or isinstance(value.op, (ast.Mult, ast.Div)) and value.right.value == 1):
            return True
    if isinstance(node, ast.AugAssign) and isinstance(node.value, ast.Constant) \
            and (isinstance(node.op, (ast.Add, ast.Sub)) and node.value.value == 0
                 or isinstance(node.op, (ast.Mult, ast.Div)) and node.value.value == 1):
        return True
    return False


def bag_form(source: str) -> tuple[str, ...] | None:
    """The statements of the first function in ``source``, no-ops dropped, each parameter
    named by its place and each local by what it holds, sorted; None if it does not parse
    or is too short to judge."""
    fn = _first_function(source)
    if fn is None:
        return None
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    meaning = {name: f"_p{i}" for i, name in enumerate(params)}
    statements: list[str] = []
    _statements(fn.body, meaning, statements)
    if len(statements) < MIN_BAG:
        return None
    return tuple(sorted(statements))


def _jit_source(obj) -> tuple[str, str] | None:
    """``(module, source)`` of a ``@triton.jit`` function: a JITFunction, or in CPU mode an
    InterpretedFunction (both ``KernelInterface``), possibly under autotune/heuristics."""
    from triton.runtime.jit import KernelInterface

    if not isinstance(obj, KernelInterface):
        return None
    for _ in range(4):                       # Autotuner / Heuristics wrap the jitted function
        fn = getattr(obj, "fn", None)
        if fn is None:
            return None
        if inspect.isfunction(fn):
            try:
                return fn.__module__, inspect.getsource(fn)
            except (OSError, TypeError):
                return None
        obj = fn
    return None


@functools.lru_cache(maxsize=1)
def course_bags() -> dict[tuple[str, ...], str]:
    """``{bag form: qualified name}`` of the course's kernels long enough to have one."""
    return {bag: name for source, name in _course_sources()
            if (bag := bag_form(source)) is not None}


@functools.lru_cache(maxsize=1)
def course_kernels() -> dict[str, str]:
    """``{normal form: qualified name}`` of every ``@triton.jit`` function in helpers.kernels."""
    found = {}
    for source, name in _course_sources():
        form = normal_form(source)
        if form is not None:
            found.setdefault(form, name)
    return found


@functools.lru_cache(maxsize=1)
def _course_sources() -> list[tuple[str, str]]:
    """``(source, qualified name)`` of every ``@triton.jit`` function in helpers.kernels."""
    package = importlib.import_module(KERNEL_PACKAGE)
    found = []
    # walk_packages goes into the op families (helpers.kernels.matmul.ladder, ...) too.
    for info in sorted(pkgutil.walk_packages(package.__path__, KERNEL_PACKAGE + "."),
                       key=lambda i: i.name):
        name = info.name
        module = importlib.import_module(name)
        for attr, obj in sorted(vars(module).items()):
            got = _jit_source(obj)
            if got is None or got[0] != name:       # defined elsewhere, imported here
                continue
            found.append((got[1], f"{name}.{attr}"))
    return found


def course_copy(source: str) -> str | None:
    """The qualified name of the course kernel that ``source`` copies up to renaming, or None.

    ``source`` is a kernel's text as ``inspect.getsource`` gives it (decorator or not).
    """
    try:
        form = normal_form(source)
        exact = None if form is None else course_kernels().get(form)
        if exact:
            return exact
        bag = bag_form(source)
    except (RecursionError, MemoryError, ValueError):   # nested too deep to write back
        return None
    return None if bag is None else course_bags().get(bag)
