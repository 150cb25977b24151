"""The note at the top of every student copy: Run All stops at the first stub, and each part
can be checked as soon as it is written (its ``check_*`` call, listed part by part)."""

from pathlib import Path

import nbformat
import pytest

from helpers.grading import build

SOLUTIONS = sorted(build.SOLUTIONS.glob("*.ipynb"))


def _note(nb):
    """The one cell holding the note."""
    notes = [c for c in nb.cells if c.cell_type == "markdown" and build.NOTE_MARK in c.source]
    assert len(notes) == 1, f"{len(notes)} cells hold the run-all note"
    assert notes[0].source.count(build.NOTE_MARK) == 1
    return notes[0]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_every_assignment_starts_with_the_note(solution: Path):
    committed = nbformat.read(build.ASSIGNMENTS / solution.name, as_version=4)
    note = _note(committed)
    assert committed.cells.index(note) == 0 and note.source.startswith("# "), \
        "the note belongs in the title cell, where the learner starts"
    source = nbformat.read(solution, as_version=4)
    assert len(committed.cells) == len(source.cells), \
        "the note adds no cell: the copy keeps the solution's cell numbers"
    assert note.source.startswith(source.cells[0].source.rstrip())
    text = note.source
    assert "Run All stops at the first part you have not written yet" in text
    assert "raise NotImplementedError()" in text and "Run All Above Selected Cell" in text
    assert "Restart Kernel and Run All Cells" in text
    parts = build.part_checks(source)
    assert parts, f"{solution.name}: no '## Part' heading followed by a check_*() cell"
    for title, calls in parts:
        row = f"> | {title} | {', '.join(f'`{c}`' for c in calls)} |"
        assert row in text.splitlines(), f"{title} is not listed with its check: {text}"
        for call in calls:   # the call listed is one the student copy really has
            assert any(c.cell_type == "code" and c.source.strip() == call
                       for c in committed.cells), call
    guarded = any(c.cell_type == "code" and "helpers.guarded()" in c.source
                  for c in source.cells)
    assert ("helpers.guarded()" in text) == guarded
    assert all(build.NOTE_MARK not in c.source for c in source.cells), \
        "the note is for student copies; the solution runs to the end"


def test_the_note_reads_the_parts_from_the_notebook():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 99 · Assignment: fake"),
        nbformat.v4.new_code_cell("import helpers"),
        nbformat.v4.new_markdown_cell("## Part 1 · Bytes (2 points)\n\nCount them."),
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
        nbformat.v4.new_code_cell("check_bytes()"),
        nbformat.v4.new_markdown_cell("## Part 2 · Kernel (3 points)"),
        nbformat.v4.new_code_cell("with helpers.guarded():\n    y = f(x)"),
        nbformat.v4.new_code_cell("  check_kernel()\n"),
        nbformat.v4.new_code_cell("check_kernel(globals())"),   # not a bare call: not listed
        nbformat.v4.new_markdown_cell("## Hand in"),
    ])
    assert build.part_checks(nb) == [("Part 1 · Bytes (2 points)", ["check_bytes()"]),
                                     ("Part 2 · Kernel (3 points)", ["check_kernel()"])]
    copy = build.student_copy(nb, Path("99_fake.ipynb"))
    note = _note(copy)
    assert copy.cells.index(note) == 0 and len(copy.cells) == len(nb.cells)
    assert note.source.startswith("# 99 · Assignment: fake\n\n> **Run All stops")
    assert "> | Part 2 · Kernel (3 points) | `check_kernel()` |" in note.source
    assert "helpers.guarded()" in note.source
    assert "x = 1" not in "".join(c.source for c in copy.cells)
    nbformat.validate(copy)     # the inserted cell has a valid id


def test_a_notebook_without_parts_still_gets_the_run_all_advice():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")])
    copy = build.student_copy(nb, Path("99_fake.ipynb"))
    note = _note(copy)     # no Markdown cell first: the note gets a cell of its own
    assert copy.cells.index(note) == 0 and note.id == build.NOTE_ID
    assert "Run All stops" in note.source and "| part |" not in note.source
    assert "helpers.guarded()" not in note.source
