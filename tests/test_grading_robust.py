"""A grader no submission can kill, and the solution handed in flagged for the instructor.

One class of assignment 03 graded by ``grader.main`` as ``./course grade FOLDER`` runs it:
beside an honest student, a notebook with a code cell nested 100,000 deep (``ast.parse``
raises ``MemoryError``), one whose cells and graded function raise with a lone surrogate in
the message (UTF-8 cannot write it), and one that breaks the grader while it judges (a
test-only injection: no notebook can make the grader's own code raise there), in a folder
whose name the file system cannot decode. Each gets its report, the honest one stays
intact, the command exits 0 and the gradebook holds every student. Then the pieces, fast:
the writers, the flags of a solution and a blank notebook.
"""

from __future__ import annotations

import copy
import csv
import json
import os
from pathlib import Path

import nbformat
import pytest

from helpers.grading import build, flags, grader, parts, registry, static
from helpers.grading.report import ERROR, NEEDS_GPU, PartResult, Report, write_gradebook

from grading_class import ASSIGNMENT, SOLUTION         # tests/grading_class.py
from planting import cpu_mode_problem, edit            # tests/planting.py

NAME = "03_vector_add_intensity"
SPEC = registry.get(NAME)
LIMITS = ["--cell-timeout", "60", "--part-timeout", "60", "--memory-gb", "3"]
DEEP = "x = " + "-" * 100_000 + "1"
SURROGATE = '"bad \\udcff byte"'             # in the cell's source: the escape, as text
BROKEN = "# the grader breaks while it judges this one"
MALLORY = os.fsdecode(b"mallory\xff")           # "mallory\udcff"
NOT_GRADED = "not graded: the grader could not grade this notebook (RuntimeError)"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if cpu_mode_problem():
        pytest.skip(f"CPU-mode grading cannot run here: {cpu_mode_problem()}")
    root, out = tmp_path_factory.mktemp("class"), tmp_path_factory.mktemp("grades")
    solved = nbformat.read(SOLUTION, as_version=4)
    blank = nbformat.read(ASSIGNMENT, as_version=4)
    students = {            # the blank notebook runs fast: the planted cells come last
        "alice": solved,
        "deep": edit(append=[DEEP])(blank),
        "surrogates": edit(append=[f"print({SURROGATE})", f"raise ValueError({SURROGATE})",
                                   f"def vector_add(a, b):\n    raise ValueError({SURROGATE})"]
                           )(blank),
        MALLORY: edit(append=[BROKEN])(blank),
    }
    for name, nb in students.items():
        (root / name).mkdir()
        nbformat.write(nb, str(root / name / SOLUTION.name))

    real = parts.grade_parts

    def breaks_on_one(spec, run, cells, *args):
        if any(BROKEN in source for _, source in cells):
            raise RuntimeError("the grader broke \udcff while judging")
        return real(spec, run, cells, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parts, "grade_parts", breaks_on_one)
        code = grader.main([str(root), "--out", str(out), "--jobs", "2", *LIMITS])
    folder = out / NAME
    reports = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    with (folder / "gradebook.csv").open(encoding="utf-8") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {"code": code, "reports": reports, "rows": rows, "folder": folder}


def _parts(report) -> dict:
    return {p["key"]: p for p in report["parts"]}


def test_the_class_is_graded_and_the_gradebook_holds_every_student(graded):
    assert graded["code"] == 0
    assert sorted(graded["reports"]) == sorted(["alice", "deep", "surrogates", MALLORY])
    assert sorted(graded["rows"]) == ["alice", "deep", "mallory?", "surrogates"]
    for name in graded["reports"]:
        assert (graded["folder"] / f"{name}.md").is_file(), name
    alice = graded["reports"]["alice"]
    assert not alice["error"] and alice["cells"] == []
    assert alice["score"] == alice["max_score"] == sum(p.points for p in SPEC.parts if not p.gpu)


def test_a_cell_nested_too_deeply_to_read_withholds_the_verdicts(graded):
    deep = graded["reports"]["deep"]
    assert deep["score"] == 0 and not deep["error"]
    assert all(p["status"] in (ERROR, NEEDS_GPU) and p["message"].startswith("not graded: ")
               and "nested too deeply" in p["message"] for p in deep["parts"]), deep["parts"]
    assert any("nested too deeply for the grader to read" in n for n in deep["notes"])
    assert "nested too deeply" in graded["rows"]["deep"]["notes"]


def test_a_surrogate_in_messages_is_written_replaced(graded):
    report = graded["reports"]["surrogates"]
    got = _parts(report)
    assert got["3a"]["status"] == "failed" and "bad ? byte" in got["3a"]["message"], got["3a"]
    assert any(c["ename"] == "ValueError" and c["evalue"].startswith("bad ")
               for c in report["cells"]), report["cells"]
    assert "bad ? byte" in (graded["folder"] / "surrogates.md").read_text(encoding="utf-8")


def test_a_failure_of_the_grader_is_that_students_report(graded):
    report = graded["reports"][MALLORY]
    assert report["score"] == 0 and not report["error"]
    assert [p["key"] for p in report["parts"]] == [p.key for p in SPEC.parts]
    for p in report["parts"]:
        assert p["message"].startswith(NOT_GRADED) and p["message"].endswith("instructor")
        assert p["status"] == (NEEDS_GPU if registry.get(NAME).part(p["key"]).gpu else ERROR)
    assert any(n.startswith("the grader could not grade this notebook: RuntimeError: the "
                            "grader broke ? while judging") for n in report["notes"])
    row = graded["rows"]["mallory?"]
    assert row["score"] == "0" and "could not grade" in row["notes"]


def test_the_solution_handed_in_is_flagged_in_the_gradebook_and_the_blank_is_not(graded):
    alice = graded["reports"]["alice"]
    assert alice["flags"] == ["solution markers", "matches the solution (100%)"]
    assert any("solution markers" in n for n in alice["notes"])
    assert graded["rows"]["alice"]["flags"] == "solution markers; matches the solution (100%)"
    assert graded["reports"][MALLORY]["flags"] == [] and graded["rows"]["mallory?"]["flags"] == ""
    text = Report.from_dict(alice).to_text()
    assert "FLAGGED for the instructor: solution markers" in text
    page = (graded["folder"] / "alice.md").read_text(encoding="utf-8")
    assert "FLAGGED" not in page and "markers" not in page      # the instructor's only


# --------------------------------------------------------------------------------------
# The pieces, without a kernel.
# --------------------------------------------------------------------------------------


def test_every_writer_survives_text_it_cannot_encode(tmp_path):
    bad = "got \udcff\ud800"
    report = Report("n.ipynb", f"eve{bad}", NAME, "cpu", notes=[bad], flags=[bad], parts=[
        PartResult("1a", "FLOPs", 0, 1, "failed", bad), PartResult("4", "x", 0, 3, NEEDS_GPU, bad)])
    report.write_json(tmp_path / "r.json")
    report.write_markdown(tmp_path / "r.md")
    book = write_gradebook([report], tmp_path / "gradebook.csv")
    assert "got ??" in report.to_text() and "got ??" in report.summary_line()
    assert json.loads((tmp_path / "r.json").read_text())["parts"][0]["message"] == "got ??"
    assert "got ??" in (tmp_path / "r.md").read_text(encoding="utf-8")
    assert "got ??" in book.read_text(encoding="utf-8")


def test_a_grader_failure_anywhere_becomes_not_graded_parts(monkeypatch):
    def boom(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(grader, "_grade", boom)
    report = grader.grade_notebook(SOLUTION, assignment=NAME, mode="cpu")
    assert {p.status for p in report.parts} == {ERROR, NEEDS_GPU} and report.score == 0
    assert all(p.message == "not graded: the grader could not grade this notebook "
               "(MemoryError); see the instructor" for p in report.parts)
    assert report.notes[-1].startswith("the grader could not grade this notebook: MemoryError")
    unknown = grader.grade_notebook(Path("x.ipynb"), mode="cpu")
    assert unknown.parts == [] and "could not grade" in unknown.error


def test_static_reading_calls_a_cell_too_deep_to_parse_hidden():
    changes, hidden = static.tampering([(1, "x = 1"), (2, DEEP), (3, "y = " + "+1" * 50_000)])
    assert changes == [] and [h.split(":")[0] for h in hidden] == ["code cell 2", "code cell 3"]
    assert not static.launches_a_kernel([(1, DEEP)])


def test_the_flags_look_for_the_markers_the_build_strips():
    assert flags.MARKERS == (build.BEGIN, build.END)


@pytest.mark.parametrize("assignment", sorted(registry.MODULES))
def test_a_solution_is_flagged_and_its_blank_release_is_not(assignment):
    solved = nbformat.read(build.SOLUTIONS / f"{assignment}.ipynb", as_version=4)
    blank = nbformat.reads(build.render(build.SOLUTIONS / f"{assignment}.ipynb"), as_version=4)
    found, notes = flags.solution_flags(solved, assignment)
    assert found[0] == "solution markers" and found[1].startswith("matches the solution")
    assert len(notes) == 2
    assert flags.solution_flags(blank, assignment) == ([], [])
    unmarked = copy.deepcopy(solved)           # the markers taken out: still the solution
    for cell in unmarked.cells:
        cell.source = "\n".join(line for line in cell.source.splitlines()
                                if not line.strip().startswith(flags.MARKERS))
    found, _ = flags.solution_flags(unmarked, assignment)
    assert [f.split(" (")[0] for f in found] == ["matches the solution"]
