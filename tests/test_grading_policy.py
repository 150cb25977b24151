"""The clean collection process's rules, one at a time (helpers/grading/policy.py,
clean_run.py, reuse.py, similarity.py): fast, no grading. The end-to-end attacks are in
tests/test_grading_clean.py."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.grading import clean_run, policy, reuse, similarity

REPO = Path(__file__).resolve().parents[1]


def test_only_definitions_run_in_the_clean_process():
    source = textwrap.dedent("""
        import torch
        from math import pi as PI
        N = 10
        N += 1
        a, (b, *c) = 1, (2, 3)
        del a
        def f(x):
            return x
        class K:
            pass
        if N > 3:
            M = 2
            print("not run")
        try:
            T = 1
        except Exception:
            T = 0
        print("not run")
        check_napkin_math()
        for i in range(3):
            N = i
        torch.backends.cudnn.allow_tf32 = False
        helpers_alias.registry.judge = None
        ns["x"] = 1
        with open("f") as fh:
            data = fh.read()
    """)
    kept = clean_run.definitions(ast.parse(source).body)
    text = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    for shown in ("import torch", "PI", "N = 10", "N += 1", "del a", "def f", "class K",
                  "M = 2", "T = 1", "T = 0"):
        assert shown in text, (shown, text)
    for hidden in ("print", "check_napkin_math", "for ", "allow_tf32", "judge", "ns[",
                   "open("):
        assert hidden not in text, (hidden, text)
    names = [n for node in kept for n in clean_run.bound_names(node)]
    assert {"torch", "PI", "N", "a", "b", "c", "f", "K", "M", "T"} <= set(names), names


GUARDED = r"""
import sys, typing, collections
from helpers.grading import policy
ns = {"__name__": "__main__"}
guard = policy.install(ns)
def run(code):
    try:
        exec(compile(code, "<cell 1>", "exec"), ns)
        return "ran"
    except RuntimeError as err:
        return "refused" if "not allowed while the grader" in str(err) else repr(err)
print(run("import sys\nf = sys._getframe()"))
print(run("import inspect\nf = inspect.currentframe()"))
print(run("import traceback\nfs = list(traceback.walk_stack(None))"))
print(run("try:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame"))
print(run("import sys\nsys.settrace(lambda *a: None)"))
print(run("import gc\nobjs = gc.get_objects()"))
print(run("import ctypes\nraw = ctypes.string_at(id(1), 8)"))
print(run("import collections\nP = collections.namedtuple('P', 'x y')\np = P(1, 2)"))
print(run("import typing\nT = typing.TypeVar('T')"))
print(run("import logging\nlogging.getLogger('x').warning('fine')"))
print(run("def mine(): pass\nmine.__defaults__ = ()"))
print(run("import json\njson.dumps.__defaults__ = None"))
print(";".join(guard.refused))
"""


def test_the_audit_hook_refuses_the_back_doors_and_lets_libraries_keep_their_books():
    out = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[:7] == ["refused"] * 7, lines        # frames, hooks, gc, ctypes
    assert lines[7:11] == ["ran"] * 4, lines          # named tuples, TypeVars, logging, own
    assert lines[11] == "refused", lines              # a library function's defaults
    assert "sys.settrace" in lines[-1] and "ctypes" in lines[-1], lines[-1]


def test_a_snapshot_names_what_was_rebound_and_not_what_triton_adds():
    import helpers.grading.registry as registry
    import helpers.kernels.vector_add as kernels

    snapshot = policy.Snapshot()
    original = registry.collect
    try:
        kernels._LangPatchScope = object()          # Triton's interpreter adds such names
        assert snapshot.changes() == []
        registry.collect = lambda *a: {}
        kernels.len = lambda x: 0                   # shadows a builtin the module calls
        found = snapshot.changes()
    finally:
        registry.collect = original
        del kernels._LangPatchScope
        vars(kernels).pop("len", None)
    assert "helpers.grading.registry.collect replaced" in found, found
    assert "helpers.kernels.vector_add.len added" in found, found


def test_a_course_kernel_edited_to_look_different_is_still_the_courses():
    import inspect

    from helpers.kernels import vector_add

    source = inspect.getsource(vector_add.add_kernel.fn)
    edited = (source.replace("a_ptr", "p").replace("b_ptr", "q")
              .replace("    mask = offsets", "    pass\n    mask = offsets"))
    lines = edited.splitlines()
    loads = [i for i, line in enumerate(lines) if "tl.load" in line]
    lines[loads[0]], lines[loads[1]] = lines[loads[1]], lines[loads[0]]   # independent lines
    assert similarity.course_copy("\n".join(lines)) == "helpers.kernels.vector_add.add_kernel"
    honest = textwrap.dedent("""
        @triton.jit
        def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            a = tl.load(a_ptr + offsets, mask=mask)
            b = tl.load(b_ptr + offsets, mask=mask)
            tl.store(c_ptr + offsets, a + b, mask=mask)
    """)
    assert similarity.course_copy(honest) is None


@pytest.mark.parametrize("assignment,functions", sorted(reuse.HANDED_OUT.items()))
def test_what_an_assignment_hands_out_is_named_in_its_text(assignment, functions):
    text = (REPO / "assignments" / f"{assignment}.ipynb").read_text()
    for qualified in functions:
        assert qualified.rsplit(".", 1)[1] + "(" in text, qualified
