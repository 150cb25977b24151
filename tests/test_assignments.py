"""assignments/: generated from solutions/, up to date, and runnable as handed out.

`./course test` runs nbval over notebooks/ and solutions/ only; the student copies are
covered here: each must execute top to bottom in a fresh kernel, and the only cells that
fail must be the stubs' ``raise NotImplementedError`` (and cells that call them).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers.grading import build

REPO = Path(__file__).resolve().parents[1]
ASSIGNMENTS = sorted((REPO / "assignments").glob("*.ipynb"))


def test_assignments_are_up_to_date_with_the_solutions():
    problems = build.build(check=True)
    assert not problems, "\n".join(problems)


def test_every_solution_has_an_assignment_and_a_registered_grader():
    from helpers.grading import registry

    for sol in sorted((REPO / "solutions").glob("*.ipynb")):
        assert (REPO / "assignments" / sol.name).exists()
        assert sol.stem in registry.MODULES, f"{sol.name} has no graded parts in the registry"


def test_student_copies_hold_no_solution_and_no_outputs():
    for path in ASSIGNMENTS:
        nb = nbformat.read(path, as_version=4)
        solution = nbformat.read(REPO / "solutions" / path.name, as_version=4)
        for cell, source in zip(nb.cells, solution.cells):
            assert build.BEGIN not in cell.source and build.END not in cell.source
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None
            if build.BEGIN in source.source:
                assert "raise NotImplementedError()" in cell.source
        assert nb.metadata["course"]["assignment"] == path.stem


def _execute(path: Path) -> list[tuple[int, str, str]]:
    """Run a notebook in a fresh kernel; every (cell, error name, message)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append((i, out["ename"], out["evalue"]))
    return errors


@pytest.fixture(scope="module")
def executed():
    # In the machine's own mode; kernels inherit this environment.
    env = {"MPLBACKEND": "Agg"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            return dict(zip(ASSIGNMENTS, pool.map(_execute, ASSIGNMENTS)))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("path", ASSIGNMENTS, ids=lambda p: p.name)
def test_the_blank_assignment_runs_and_only_its_stubs_fail(executed, path):
    errors = executed[path]
    others = [e for e in errors if e[1] != "NotImplementedError"]
    assert not others, f"{path.name}: cells fail for other reasons than a stub: {others}"
    assert errors, "no stub raised: is there anything left for the learner to do?"
