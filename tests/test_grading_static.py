"""The grader's reading of a notebook's source: tampering found, honest notebooks untouched."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.grading import static

REPO = Path(__file__).resolve().parents[1]
HONEST = sorted([*REPO.glob("solutions/*.ipynb"), *REPO.glob("notebooks/*.ipynb")])


def _cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    return list(enumerate((c.source for c in nb.cells if c.cell_type == "code"), 1))


@pytest.mark.parametrize("path", HONEST, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_course_own_notebooks_tamper_with_nothing(path):
    assert static.tampering(_cells(path)) == ([], [])


@pytest.mark.parametrize("source,found", [
    ("import torch\ntorch.save = print", "changes torch.save"),
    ("import torch as t\nt.Tensor.clone = lambda self: self", "changes torch.Tensor.clone"),
    ("from helpers.grading import registry as r\nr.judge = None",
     "changes helpers.grading.registry.judge"),
    ("import triton.runtime.interpreter as itp\nitp.interpreter_builder.create_masked_store = 1",
     "changes triton.runtime.interpreter.interpreter_builder.create_masked_store"),
    ("import torch\nvars(torch)['save'] = print", "changes vars(torch)[...]"),
    ("import sys\nsys.modules['torch'].save = print", "changes sys.modules[...].save"),
    ("import torch\nsetattr(torch, 'save', print)", "setattr on torch"),
    ("def __import__(name, *a, **k):\n    return None", "redefines __import__"),
    ("import sys\nsys.meta_path.insert(0, object())", "sys.meta_path"),
    ("get_ipython().input_transformers_post.append(str)", "input transformers"),
    ("import ctypes", "ctypes"),
    ("import gc\ngc.get_referrers(1)", "gc.get_referrers"),
    ("object.__setattr__(part, 'judge', None)", "__setattr__"),
    ("from helpers.bounds import _active", "machinery (helpers.bounds._active)"),
    ("import helpers\nhelpers.bounds._active[-1].launches.append(1)",
     "machinery (helpers.bounds._active)"),
    ("from helpers.grading.harness import collect", "machinery (helpers.grading.harness"),
    ("import helpers.grading.policy as p", "machinery (helpers.grading.policy)"),
    ("from helpers.grading import registry as r\nx = r.judge", "machinery"),
])
def test_changes_to_what_the_grader_relies_on_are_found(source, found):
    changes, _ = static.tampering([(7, source)])
    assert any(found in c and c.startswith("code cell 7") for c in changes), changes


@pytest.mark.parametrize("source", [
    "exec('import torch; torch.save = print')", "x = eval('1e9')",
    "code = compile('1', 'x', 'eval')", "m = __import__('to' + 'rch')"])
def test_code_that_hides_what_it_runs_is_found(source):
    assert static.tampering([(1, source)])[1]


@pytest.mark.parametrize("source", [
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True",
    "import torch\ntorch.manual_seed(0)", "import os\nos.environ['X'] = '1'",
    "from torch import save\nsave = 3", "import torch\nf = getattr(torch, 'add')",
    "%matplotlib inline\nimport torch", "x = torch.empty(3)\nx.data = x"])
def test_ordinary_code_is_left_alone(source):
    assert static.tampering([(1, source)]) == ([], [])


def test_a_launch_of_the_notebook_own_kernel_is_found():
    kernel = "import triton\n@triton.jit\ndef k(x_ptr):\n    pass\n"
    assert static.launches_a_kernel([(1, kernel), (2, "k[(1,)](x)")])
    assert not static.launches_a_kernel([(1, kernel), (2, "def f(a, b):\n    return a + b")])
    assert not static.launches_a_kernel([(1, "other[(1,)](x)")])


def test_a_spurious_ast_recursion_error_is_parsed_again(monkeypatch):
    """CPython 3.11 before 3.11.8 raises this SystemError now and then (python/cpython
    #106905): the grader parses again instead of failing the whole grading."""
    import ast

    real, calls = ast.parse, []

    def flaky(source, *args, **kwargs):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=28)")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", flaky)
    assert isinstance(static.parse("x = 1"), ast.Module) and len(calls) == 2

    def broken(source, *args, **kwargs):
        raise SystemError("another interpreter error")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(SystemError, match="another"):
        static.parse("x = 1")
