"""``./course leaderboard``: a class of four raced (helpers/grading/leaderboard.py).

In CPU mode the race is the interpreter's on a small input (the page says so); what is
tested here is what does not depend on the machine: fresh inputs re-checked, a wrong
kernel and the course's kernel pasted taken off the board with the reason, the others
ranked by the median of their rounds, and the page written. On a GPU the same class runs
compiled (tests/gpu/device.sh leaderboard)."""

from __future__ import annotations

import nbformat
import pytest

import helpers
from helpers.grading import leaderboard

from planting import cpu_mode_problem, edit, solution  # tests/planting.py
from test_grading_clean import PASTED  # the course's add kernel, trivially edited

ASSIGNMENT = "03_vector_add_intensity"


def _kernel(source):
    def plant(nb):
        nb = edit()(nb)
        (cell,) = [c for c in nb.cells if c.cell_type == "code" and "def add_kernel" in c.source]
        cell.source = source
        return nb
    return plant


CLASS = {
    "alice": edit(),
    "carol": edit(replace=[("BLOCK_SIZE = 1024", "BLOCK_SIZE = 16")]),
    "bob": edit(replace=[("tl.store(c_ptr + offsets, a + b, mask=mask)",
                          "tl.store(c_ptr + offsets, a - b, mask=mask)")]),
    "mallory": _kernel(PASTED.strip() + "\n"),
}


@pytest.fixture(scope="module")
def graded_board(tmp_path_factory):
    problem = None if helpers.is_gpu() else cpu_mode_problem()
    if problem:
        pytest.skip(f"CPU-mode grading cannot run here: {problem}")
    root = tmp_path_factory.mktemp("class")
    source = nbformat.read(solution(ASSIGNMENT), as_version=4)
    notebooks = []
    for student, plant in CLASS.items():
        path = root / student / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir()
        nbformat.write(plant(source), path)
        notebooks.append((path, student))
    entries, facts = leaderboard.race(notebooks, ASSIGNMENT, rounds=2)
    page = leaderboard.write_page(entries, facts, ASSIGNMENT, root / "grades")
    return entries, facts, page.parent


def test_the_correct_kernels_are_ranked_by_the_median_of_their_rounds(graded_board):
    entries, facts, _ = graded_board
    ranked = [e for e in entries if not e.problem]
    assert {e.student for e in ranked} == {"alice", "carol"}, entries
    assert all(len(e.times) == 2 for e in ranked)
    assert ranked[0].median <= ranked[1].median
    assert facts["rounds"] == 2 and facts["device"]


def test_a_wrong_kernel_and_the_courses_kernel_are_off_the_board_with_the_reason(graded_board):
    entries, _, _ = graded_board
    off = {e.student: e.problem for e in entries if e.problem}
    assert set(off) == {"bob", "mallory"}, off
    assert "differ" in off["bob"], off["bob"]
    assert "helpers.kernels.vector_add.add_kernel" in off["mallory"], off["mallory"]


def test_the_page_names_the_machine_the_input_and_what_cpu_mode_means(graded_board):
    _, facts, folder = graded_board
    print((folder / "leaderboard.md").read_text())     # the figures, for a GPU run's log
    page = (folder / "leaderboard.md").read_text()
    assert facts["device"] in page and facts["case"] in page
    assert ("CPU mode" in page) == helpers.is_cpu()
    assert "| 1 |" in page and "bob:" in page
    html = (folder / "leaderboard.html").read_text()
    assert "<table>" in html and "mallory" in html
