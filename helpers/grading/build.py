"""``./course build-assignments``: write assignments/ from solutions/, the single source.

In a solution notebook, the answer sits between two marker lines::

    def vector_add(a, b):
        ### BEGIN SOLUTION
        c = torch.empty_like(a)
        ...
        ### END SOLUTION

The student copy keeps everything else and replaces each marked region by a stub at the
same indentation::

    def vector_add(a, b):
        # YOUR CODE HERE
        raise NotImplementedError()

(in a Markdown cell, by "YOUR ANSWER HERE"). Outputs and execution counts are cleared,
so the answers printed by the solution's checks do not travel either. The notebook's
metadata records which assignment it is (the grader reads it) and where it came from.

The first cell of the student copy (its title and introduction) ends with a note
(:func:`run_all_note`), just above the first code cell: *Run All* stops at the first stub,
which is expected, and each part can be checked as soon as it is written, with the
``check_*`` call that ends it (listed part by part, read from the notebook). The note joins
that cell rather than making one, so the copy keeps the solution's cell numbers.

``--check`` writes nothing: it lists the assignments that are missing or out of date
and exits 1 if there are any (the test suite runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
ASSIGNMENTS = REPO / "assignments"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"   # .flags looks for them too
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
NOTE_MARK = "> **Run All stops at the first part you have not written yet.**"
NOTE_ID = "run-all-note"     # the note's own cell, where the notebook has no Markdown first
PART_HEADING = re.compile(r"^##\s+(Part\b.*)$", re.MULTILINE)
CHECK_CALL = re.compile(r"^\s*(check_\w+)\(\)\s*$")


class MarkerError(ValueError):
    """Solution markers that do not pair up; the message names the cell and line."""


def _marked(source: str, where: str = ""):
    """``(line number, line, what)`` for each line of ``source``, ``what`` being "begin",
    "end", "inside" or "outside" (a solution region); :class:`MarkerError` where the
    markers do not pair up."""
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        text = line.strip()
        if text.startswith(BEGIN):
            if inside:
                raise MarkerError(f"{where}line {number}: {BEGIN} inside another solution")
            inside = True
            yield number, line, "begin"
        elif text.startswith(END):
            if not inside:
                raise MarkerError(f"{where}line {number}: {END} without a {BEGIN}")
            inside = False
            yield number, line, "end"
        else:
            yield number, line, "inside" if inside else "outside"
    if inside:
        raise MarkerError(f"{where}{BEGIN} is never closed by {END}")


def strip_solutions(source: str, stub=CODE_STUB, where: str = "") -> tuple[str, int]:
    """``source`` with every marked region replaced by ``stub``; and how many there were."""
    out, regions = [], 0
    for _, line, what in _marked(source, where):
        if what == "begin":
            regions += 1
            indent = line[: len(line) - len(line.lstrip())]
            out += [f"{indent}{s}\n" for s in stub]
        elif what == "outside":
            out.append(line)
    text = "".join(out)
    if text.endswith("\n") and not source.endswith("\n"):
        text = text[:-1]
    return text, regions


def solution_lines(source: str) -> dict[int, str]:
    """The lines inside the solution regions of ``source``, by line number (1-based)."""
    return {number: line for number, line, what in _marked(source) if what == "inside"}


def part_checks(nb) -> list[tuple[str, list[str]]]:
    """``[(part heading, [its check calls])]``: each ``## Part ...`` heading of the notebook
    with the ``check_*()`` cells that follow it, before the next part."""
    parts: list[tuple[str, list[str]]] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = PART_HEADING.search(cell.source)
            if heading:
                parts.append((heading.group(1).strip(), []))
        elif cell.cell_type == "code" and parts:
            call = CHECK_CALL.match(cell.source)
            if call:
                parts[-1][1].append(f"{call.group(1)}()")
    return [(title, calls) for title, calls in parts if calls]


def run_all_note(nb) -> str:
    """The note at the top of a student copy: Run All stops at the first stub; how to
    check each part as it is done."""
    import textwrap

    def quoted(text: str) -> list[str]:
        return ["> " + line for line in textwrap.wrap(text, 88, break_on_hyphens=False)]

    lines = quoted(
        f"{NOTE_MARK[2:]} Every answer you still owe is a stub, `raise NotImplementedError()`, "
        "and *Run All* halts at the first cell that raises it: the cells below it do not run. "
        "That is expected while you work.")
    lines += [">"] + quoted(
        "**Check each part as soon as it is written.** Run the cells from the top down to that "
        "part's check cell, one at a time (Shift+Enter), skipping the answer cells of parts "
        "you have not written yet; each check judges its own part only. Once the parts above "
        "it are all written, *Run → Run All Above Selected Cell* from the check cell does it "
        "in one go.")
    parts = part_checks(nb)
    if parts:
        lines += [">", "> | part | its check |", "> |---|---|"]
        lines += [f"> | {title} | {', '.join(f'`{c}`' for c in calls)} |"
                  for title, calls in parts]
    if any(cell.cell_type == "code" and "helpers.guarded()" in cell.source
           for cell in nb.cells):
        lines += [">"] + quoted(
            "The *try it* cells run your kernel inside `with helpers.guarded():`. In CPU mode "
            "a load or store outside a tensor is then stopped and reported (which kernel, which "
            "tensor, which indices) instead of crashing the notebook's kernel process; on a GPU "
            "your kernel runs as it is, unwatched, and the `check_*` call is what watches it.")
    lines += [">"] + quoted("Before you hand in, *Kernel → Restart Kernel and Run All Cells* "
                            "must run to the end without an error.")
    return "\n".join(lines)


def student_copy(nb, solution_path: Path):
    """The assignment notebook for one solution notebook (a new object)."""
    import copy

    nb = copy.deepcopy(nb)
    regions = 0
    for i, cell in enumerate(nb.cells):
        where = f"{solution_path.name}, cell {i + 1}, "
        if cell.cell_type == "code":
            cell.source, n = strip_solutions(cell.source, CODE_STUB, where)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source, n = strip_solutions(cell.source, MARKDOWN_STUB, where)
        else:
            n = 0
        regions += n
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    if not regions:
        raise MarkerError(f"{solution_path.name} has no {BEGIN} ... {END} region: nothing "
                          "for the learner to do")
    note = run_all_note(nb)
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = nb.cells[0].source.rstrip() + "\n\n" + note
    else:
        cell = nbformat_v4().new_markdown_cell(note)
        cell.id = NOTE_ID
        nb.cells.insert(0, cell)
    nb.metadata.pop("widgets", None)
    course = dict(nb.metadata.get("course", {}))
    course.update({"assignment": solution_path.stem,
                   "generated_from": f"solutions/{solution_path.name}",
                   "note": "generated by ./course build-assignments; edit the solution instead"})
    nb.metadata["course"] = course
    return nb


def nbformat_v4():
    import nbformat

    return nbformat.v4


def render(solution_path: Path) -> str:
    import nbformat

    nb = nbformat.read(str(solution_path), as_version=4)
    return nbformat.writes(student_copy(nb, solution_path)) + "\n"


def build(solutions: Path = SOLUTIONS, assignments: Path = ASSIGNMENTS,
          check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) every assignment; returns the problems found."""
    problems = []
    wanted = set()
    for sol in sorted(Path(solutions).glob("*.ipynb")):
        target = Path(assignments) / sol.name
        wanted.add(target.name)
        text = render(sol)
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if check:
            problems.append(f"{target} is {'missing' if current is None else 'out of date'} "
                            f"(rebuild with ./course build-assignments)")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target}")
    for extra in sorted(Path(assignments).glob("*.ipynb")):
        if extra.name not in wanted:
            problems.append(f"{extra} has no solution in {solutions}: remove it, or add "
                            f"solutions/{extra.name}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./course build-assignments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if assignments/ is out of date")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--assignments", type=Path, default=ASSIGNMENTS)
    args = parser.parse_args(argv)
    try:
        problems = build(args.solutions, args.assignments, check=args.check)
    except MarkerError as err:
        print(f"build-assignments: {err}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if not problems and args.check:
        print("assignments/ is up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
