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
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import textwrap

from .static import parse

KERNEL_PACKAGE = "helpers.kernels"


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


def normal_form(source: str) -> str | None:
    """The first function in ``source``, renamed and stripped; None if it does not parse."""
    try:
        tree = parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    fn = _function(tree)
    if fn is None:
        return None
    fn.decorator_list = []
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        fn.body = body[1:] or [ast.Pass()]
    args = fn.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
              and isinstance(n.ctx, (ast.Store, ast.Del))}
    renamer = _Renamer(local)
    fn.name = "_kernel"
    renamer.visit(fn)
    return ast.unparse(ast.Module(body=[fn], type_ignores=[]))


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
def course_kernels() -> dict[str, str]:
    """``{normal form: qualified name}`` of every ``@triton.jit`` function in helpers.kernels."""
    package = importlib.import_module(KERNEL_PACKAGE)
    found = {}
    # walk_packages goes into the op families (helpers.kernels.matmul.ladder, ...) too.
    for info in sorted(pkgutil.walk_packages(package.__path__, KERNEL_PACKAGE + "."),
                       key=lambda i: i.name):
        name = info.name
        module = importlib.import_module(name)
        for attr, obj in sorted(vars(module).items()):
            got = _jit_source(obj)
            if got is None or got[0] != name:       # defined elsewhere, imported here
                continue
            form = normal_form(got[1])
            if form is not None:
                found.setdefault(form, f"{name}.{attr}")
    return found


def course_copy(source: str) -> str | None:
    """The qualified name of the course kernel that ``source`` copies up to renaming, or None.

    ``source`` is a kernel's text as ``inspect.getsource`` gives it (decorator or not).
    """
    form = normal_form(source)
    return None if form is None else course_kernels().get(form)
