"""A class graded end to end, as an instructor runs it (README, "How a class runs").

1. **Release** the course into a folder outside it (``release.release``).
2. **Students work** in the release's ``assignments/03_vector_add_intensity.ipynb``: here
   alice hands in the solution, bob the blank copy he was given, carol the solution with
   bits counted for bytes, and mallory the solution plus a cell that looks for the
   instructor's hidden checks file (it must not see it).
3. **Collect** their GitHub Classroom repositories (``hw03-<login>/``, whole courses with
   lessons in them) into ``submissions/<student>/`` (``python -m helpers.grading.collect``).
4. **Grade** the folder with the grader's command line, in CPU mode, with a hidden checks
   module kept outside the course (``--extra-checks``) that adds part H1.
5. **Gradebook** and **feedback**: one CSV row per student with an H1 column, a JSON report
   and a readable Markdown page per student; the learner's page holds no instructor notes.

Then the release graded in **GitHub Classroom's** way: ``--classroom`` in the student's
repository prints ``Points X/Y``, writes the reporter's ``result`` output and exits 0 only
at full marks. Assignment 03 is the fast one: the whole file takes about a minute on two
cores, most of it three releases (the test's, and one per grader run for its sandbox).
"""

from __future__ import annotations

import base64
import csv
import json
import os
import subprocess
import sys
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from helpers.grading import classroom, collect, registry, release
from helpers.grading.report import PartResult, Report

from grading_class import REPO, SOLUTION               # tests/grading_class.py
from planting import cpu_mode_problem, edit           # tests/planting.py

NAME = "03_vector_add_intensity"
HIDDEN = '''
"""Hidden checks for assignment 03: vector_add on sizes of the grader's choosing."""
import torch

from helpers.feedback import Feedback
from helpers.grading.registry import Part, answer

EXTENDS = "03_vector_add_intensity"


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    n = 3000 + seed % 97                  # a size no public trial uses
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def _collect(ns, seed):                   # in the submission's kernel
    a, b = _inputs(seed)
    return {"out": answer(ns, "vector_add")(a, b)}


def _judge(raw):                          # in the grader's judge process
    a, b = _inputs(raw["__seed__"])
    out = raw["out"]
    ok = isinstance(out, torch.Tensor) and out.shape == a.shape and bool(
        torch.allclose(out, a + b))
    return Feedback("H1 sizes of the grader's choosing", ok,
                    "right on a size of the grader's choosing" if ok else
                    "wrong on a size of the grader's choosing: check the mask and the grid")


PARTS = (Part("H1", "sizes of the grader's choosing", 2, _judge, ("vector_add",),
              collect=_collect, group="hidden", after="kernel"),)
'''
SPEC_CPU_KEYS = [p.key for p in registry.get(NAME).parts if not p.gpu]
CPU_MAX = sum(p.points for p in registry.get(NAME).parts if not p.gpu)   # 17: part 4 needs a GPU


def _env(root: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(root), COURSE_MODE="cpu", MPLBACKEND="Agg")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    problem = cpu_mode_problem()
    if problem:
        pytest.skip(f"CPU-mode grading cannot run here: {problem}")
    root = tmp_path_factory.mktemp("class")
    student = root / "student"
    release.release(student, log=lambda *_: None)
    hidden = root / "instructor" / "hidden_03.py"          # outside the course
    hidden.parent.mkdir()
    hidden.write_text(HIDDEN)
    return root, student, hidden


def _classroom_run(repo: Path, out: Path, *args: str) -> subprocess.Popen:
    """``--classroom`` in a student's repository, as Classroom's workflow runs it."""
    return subprocess.Popen([sys.executable, "-m", "helpers.grading.grader", "--classroom",
                             *args, f"assignments/{NAME}.ipynb"], cwd=repo,
                            env=dict(_env(repo), GITHUB_OUTPUT=str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@dataclass
class Classroom:
    repo: Path
    code: int
    stdout: str
    stderr: str
    result: dict


@dataclass
class Graded:
    out: Path                    # the grader's --out
    output: str
    reports: dict                # student -> JSON report
    classroom: dict              # login -> Classroom


def _finish(proc: subprocess.Popen, repo: Path, out: Path) -> Classroom:
    stdout, stderr = proc.communicate(timeout=600)
    lines = out.read_text().splitlines() if out.exists() else []
    assert len(lines) == 1 and lines[0].startswith("result="), (lines, stderr[-3000:])
    return Classroom(repo, proc.returncode, stdout, stderr,
                     json.loads(base64.b64decode(lines[0].removeprefix("result="))))


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    """The class graded by the grader's command line while two students' repositories are
    graded the Classroom way (all three at once: two cores)."""
    root, student, hidden = course
    solved = nbformat.read(SOLUTION, as_version=4)
    handed = {
        "alice": solved,
        "bob": nbformat.read(student / "assignments" / f"{NAME}.ipynb", as_version=4),
        "carol": edit(append=["add_bytes = 8 * 3 * N * BYTES_PER_FP16"])(solved),
        "mallory": edit(append=[f"import os\nadd_flops = -1 if os.path.exists({str(hidden)!r}) "
                                "else add_flops"])(solved),
    }
    clones = root / "clones"                 # gh classroom clone student-repos
    for login, nb in handed.items():
        repo = clones / f"hw03-{login}"
        shutil.copytree(student, repo)       # a whole course, lessons and all
        nbformat.write(nb, repo / "assignments" / f"{NAME}.ipynb")
    (clones / "hw03-eve").mkdir()
    (clones / "hw03-eve" / "assignments").symlink_to(student / "assignments")
    skipped = []
    found = collect.collect(clones, root / "submissions", assignments=[NAME],
                            log=skipped.append)
    assert sorted(s for s, _ in found) == sorted(handed), found
    assert any(line.startswith("collect: eve: skipped") for line in skipped), skipped

    # GitHub Classroom: bob's and alice's repositories grade themselves (sealed keys), in
    # the sandbox as the generated workflow does.
    args = ("--extra-checks", str(hidden))
    runs = {login: (clones / f"hw03-{login}", root / f"github_output_{login}")
            for login in ("alice", "bob")}
    procs = {login: _classroom_run(repo, out, *args) for login, (repo, out) in runs.items()}
    out = root / "grades"
    grade = subprocess.run([sys.executable, "-m", "helpers.grading.grader",
                            str(root / "submissions"), "--out", str(out), "--extra-checks",
                            str(hidden), "--jobs", "2"], cwd=REPO, env=_env(REPO),
                           capture_output=True, text=True, timeout=600)
    classroom_runs = {login: _finish(procs[login], *runs[login]) for login in procs}
    assert grade.returncode == 0, (grade.stdout + grade.stderr)[-3000:]
    reports = {p.stem: json.loads(p.read_text()) for p in out.glob("*/*.json")}
    return Graded(out, grade.stdout + grade.stderr, reports, classroom_runs)


def test_every_student_gets_a_score_with_the_hidden_part(graded):
    reports = graded.reports
    assert sorted(reports) == ["alice", "bob", "carol", "mallory"], graded.output[-3000:]
    alice = reports["alice"]
    assert alice["score"] == alice["max_score"] == CPU_MAX + 2, alice
    parts = {p["key"]: p for p in alice["parts"]}
    assert parts["H1"]["status"] == "passed" and parts["H1"]["points"] == 2
    assert list(parts)[-1] == "H1"                        # after the assignment's own
    carol = {p["key"]: p for p in reports["carol"]["parts"]}
    assert reports["carol"]["score"] == CPU_MAX + 2 - 2
    assert carol["1b"]["points"] == 0 and "bits, not bytes" in carol["1b"]["message"]
    assert carol["H1"]["points"] == 2
    bob = {p["key"]: p for p in reports["bob"]["parts"]}
    assert reports["bob"]["score"] == 0 and reports["bob"]["max_score"] == CPU_MAX + 2
    assert bob["H1"]["status"] == "not implemented", bob["H1"]


def test_the_hidden_checks_file_is_out_of_the_submissions_reach(graded):
    mallory = {p["key"]: p for p in graded.reports["mallory"]["parts"]}
    if graded.reports["mallory"]["isolation"].startswith("none"):
        pytest.skip("no sandbox here: a kernel then sees every file this user can")
    assert mallory["1a"]["points"] == 1, mallory["1a"]      # it could not see the file
    assert mallory["H1"]["points"] == 2


def test_the_gradebook_has_a_row_per_student_and_a_column_for_the_hidden_part(graded):
    books = list(graded.out.glob("*/gradebook.csv"))
    assert [b.parent.name for b in books] == [NAME]
    with books[0].open() as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["alice", "bob", "carol", "mallory"]
    assert rows["alice"]["part H1"] == "2" and rows["bob"]["part H1"] == "0"
    assert rows["carol"]["part 1b"] == "0" and rows["carol"]["score"] == str(CPU_MAX)
    assert rows["alice"]["part 4"] == "GPU"


def test_each_student_gets_readable_markdown_feedback_beside_the_json(graded):
    folder = graded.out / NAME
    for name in ("alice", "bob", "carol", "mallory"):
        assert (folder / f"{name}.json").is_file() and (folder / f"{name}.md").is_file()
    alice = (folder / "alice.md").read_text()
    assert alice.startswith(f"# {NAME}: feedback for alice")
    assert f"**{CPU_MAX + 2} / {CPU_MAX + 2} points**" in alice
    assert "| H1 | sizes of the grader's choosing | 2 / 2 | passed |" in alice
    carol = (folder / "carol.md").read_text()
    assert "❌ **1b bytes moved**" in carol and "bits, not bytes" in carol
    bob = (folder / "bob.md").read_text()
    assert "not implemented" in bob and "## Cells that did not finish" in bob
    for name in ("alice", "bob", "carol", "mallory"):
        text = (folder / f"{name}.md").read_text()
        for instructor_only in ("Notes for the instructor", "tampering", "NOT ISOLATED",
                                "isolation"):
            assert instructor_only not in text, (name, instructor_only)


def test_markdown_feedback_cannot_be_broken_by_what_it_quotes():
    report = Report("n.ipynb", "eve <b>", NAME, "cpu", parts=[
        PartResult("1a", "FLOPs", 0, 1, "failed", "got '<script>x</script>' | 2 |\nnext")])
    text = report.to_markdown()
    assert "<script>" not in text and "<b>" not in text
    assert "&lt;script&gt;" in text and "\\| 2 \\|" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1a"))
    assert row.count(" | ") == 3                           # four cells, no more


def test_classroom_mode_in_a_students_repository_below_full_marks(graded):
    """Bob's repository, the blank notebook: exit 1, no points, every part in the result."""
    bob = graded.classroom["bob"]
    assert bob.code == 1, bob.stderr[-3000:]
    assert bob.stdout.rstrip().endswith(f"Points 0/{CPU_MAX + 2}"), bob.stdout[-2000:]
    assert bob.result["status"] == "fail" and bob.result["max_score"] == CPU_MAX + 2
    assert sum(t["score"] for t in bob.result["tests"]) == 0
    assert len(bob.result["tests"]) == len(SPEC_CPU_KEYS) + 1


def test_classroom_mode_in_a_students_repository_at_full_marks(graded):
    """Alice's repository, solved: exit 0, every point, the hidden part among them."""
    alice = graded.classroom["alice"]
    assert alice.code == 0, alice.stderr[-3000:]
    assert alice.stdout.rstrip().endswith(f"Points {CPU_MAX + 2}/{CPU_MAX + 2}")
    assert alice.result["version"] == 1 and alice.result["status"] == "pass"
    tests = {t["name"]: t for t in alice.result["tests"]}
    assert tests["H1 sizes of the grader's choosing"]["score"] == 2
    assert all(t["status"] == "pass" for t in tests.values())
    assert sum(t["score"] for t in tests.values()) == alice.result["max_score"] == CPU_MAX + 2
    assert not any(name.startswith("4 ") for name in tests)       # needs a GPU: not counted
    assert (alice.repo / "grades" / NAME / "assignments.md").is_file()


def test_a_release_keeps_its_sealed_keys_in_the_sandbox():
    """The sandbox's plain course copy (a student release has no release.py) keeps the
    sealed keys, or no graded number could be checked in a Classroom repository; the
    answer formulas stay out."""
    from fnmatch import fnmatch

    from helpers.grading import sandbox

    def hidden(path):
        return any(fnmatch(path, pattern) for pattern in sandbox.HIDDEN)

    assert not hidden("helpers/grading/keys/04_tiling.json")
    assert hidden("helpers/grading/assignments/keys_tiling.py")
    assert hidden("helpers/grading/release.py")


def test_classroom_results_below_full_marks_exit_1(graded):
    reports = [Report.from_dict(graded.reports[name]) for name in ("alice", "carol")]
    assert classroom.exit_code(reports[:1]) == 0 and classroom.exit_code(reports[1:]) == 1
    assert classroom.points_line(reports[1:]) == f"Points {CPU_MAX}/{CPU_MAX + 2}"
    payload = classroom.result(reports[1:])
    assert payload["status"] == "fail"
    assert {t["name"]: t["score"] for t in payload["tests"]}["1b bytes moved"] == 0


def test_a_checks_module_that_cannot_be_used_is_refused_before_grading(tmp_path):
    from helpers.grading import extra

    bad = tmp_path / "clash.py"
    bad.write_text(HIDDEN.replace('Part("H1"', 'Part("1a"'))
    with pytest.raises(extra.ChecksError, match="used twice"):
        extra.load(bad)
    bad.write_text(HIDDEN.replace('EXTENDS = "03_vector_add_intensity"', 'EXTENDS = "99_x"'))
    with pytest.raises(extra.ChecksError, match="not a graded assignment"):
        extra.load(bad)
    run = subprocess.run([sys.executable, "-m", "helpers.grading.grader", str(SOLUTION),
                          "--extra-checks", str(bad), "--out", str(tmp_path / "g")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not a graded assignment" in run.stderr
    assert not (tmp_path / "g").exists()


def test_the_classroom_workflow_for_a_template_repository_passes_actionlint(tmp_path):
    from test_workflow import actionlint_findings      # tests/test_workflow.py

    for secret in (None, "HIDDEN_CHECKS_03"):
        path = tmp_path / ".github" / "workflows" / "classroom.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(classroom.workflow(NAME, secret))
        assert actionlint_findings(path) == [], path.read_text()
        text = textwrap.dedent(path.read_text())
        assert f"./course grade --classroom assignments/{NAME}.ipynb" in text
        assert "runners: grade" in text and "GRADE_RESULTS" in text
        assert ("--extra-checks" in text) == bool(secret)
