"""GitHub Classroom: the grader as an autograding step in each student's repository.

Classroom's autograding runs a workflow in the student's repository (made from a template:
the student release of ``./course release``). Its reporter step
(``classroom-resources/autograding-grading-reporter``) adds up the ``score`` of every test
in the ``result`` output of each grading step, and the ``autograding-command-grader`` step
gives a test its points when its command exits 0. ``--classroom`` fits both::

    ./course grade --classroom assignments/03_vector_add_intensity.ipynb

* it grades as usual (table, JSON report and Markdown feedback under ``grades/``), then
  prints ``Points <score>/<max>``;
* where ``$GITHUB_OUTPUT`` is set (inside a workflow step), it writes the step's ``result``
  output in the reporter's format: base64 JSON with one test per graded part and its
  points, so partial credit reaches Classroom part by part;
* it exits 0 at full marks and 1 below them (2 when there is nothing to grade), so a command
  grader gives all of its points or none.

``python -m helpers.grading.classroom ASSIGNMENT`` prints a ready workflow for the template
repository (``.github/workflows/classroom.yml``).

Parts graded on a GPU count only on a GPU runner; on GitHub's CPU runners they are "needs a
GPU" and left out of both the score and the maximum, as everywhere else.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path

from .report import PASSED, Report

REPORTER = "classroom-resources/autograding-grading-reporter@v1"
STEP = "grade"           # the grading step's id: the reporter reads GRADE_RESULTS


def points(reports: list[Report]) -> tuple[float, float]:
    """Score and maximum over ``reports``; a notebook that could not be graded scores 0 of
    its parts' points (a refused file) or of none (no assignment could be told)."""
    return sum(r.score for r in reports), sum(r.max_score for r in reports)


def full_marks(reports: list[Report]) -> bool:
    score, top = points(reports)
    return bool(reports) and not any(r.error for r in reports) and top > 0 and score >= top


def points_line(reports: list[Report]) -> str:
    score, top = points(reports)
    return f"Points {score:g}/{top:g}"


def result(reports: list[Report]) -> dict:
    """The step's result in the reporter's format (version 1): one test per counted part."""
    tests = []
    for r in reports:
        if r.error:
            tests.append({"name": f"{r.assignment}: not graded", "status": "error", "score": 0,
                          "message": r.error, "test_code": r.notebook, "filename": r.notebook,
                          "line_no": 0, "duration": int(r.seconds * 1000)})
        for p in r.parts:
            if not p.counted:
                continue
            tests.append({"name": f"{p.key} {p.title}",
                          "status": "pass" if p.status == PASSED else "fail",
                          "score": p.points, "message": p.message,
                          "test_code": f"{r.notebook}, part {p.key}",
                          "filename": r.notebook, "line_no": 0,
                          "duration": int(p.seconds * 1000)})
    _, top = points(reports)
    status = "error" if any(r.error for r in reports) else \
        "pass" if full_marks(reports) else "fail"
    return {"version": 1, "status": status, "max_score": top, "tests": tests}


def write_output(reports: list[Report], path: str | None = None) -> str | None:
    """Append ``result=<base64 JSON>`` to the step's outputs (``$GITHUB_OUTPUT``), if any."""
    path = path or os.environ.get("GITHUB_OUTPUT")
    if not path:
        return None
    encoded = base64.b64encode(json.dumps(result(reports)).encode()).decode()
    with open(path, "a") as f:
        f.write(f"result={encoded}\n")
    return path


def exit_code(reports: list[Report]) -> int:
    return 0 if full_marks(reports) else 1


# --------------------------------------------------------------------------------------
# The template repository's workflow.
# --------------------------------------------------------------------------------------

WORKFLOW = """\
# Autograding for GitHub Classroom: {assignment}.
# Written by `python -m helpers.grading.classroom {assignment}`; put it in the template
# repository (the student release) as .github/workflows/classroom.yml.
name: Autograding Tests
on:
  push:
  repository_dispatch:
  workflow_dispatch:
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    timeout-minutes: 60
    env:
      # CPU runners: the CPU build of the pinned torch (no CUDA libraries to download).
      PIP_EXTRA_INDEX_URL: https://download.pytorch.org/whl/cpu
      PYTHON: python
    steps:
      - uses: actions/checkout@v5
      - uses: actions/setup-python@v6
        with:
          python-version: "3.12"
          cache: pip
          cache-dependency-path: pyproject.toml
      - name: The grader's sandbox (bubblewrap, user namespaces)
        run: |
          sudo apt-get update -qq
          sudo apt-get install -y -qq bubblewrap
          if [ -e /proc/sys/kernel/apparmor_restrict_unprivileged_userns ]; then
            sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0
          fi
      - name: Set up the course
        run: ./course env
      - name: Grade {notebook}
        id: {step}
        run: ./course grade --classroom {notebook}{extra}
      - name: Autograding Reporter
        if: always()
        uses: {reporter}
        env:
          {env}_RESULTS: "${{{{ steps.{step}.outputs.result }}}}"
        with:
          runners: {step}
      - name: Feedback for the student
        if: always()
        uses: actions/upload-artifact@v6
        with:
          name: feedback
          path: grades/
"""

HIDDEN_STEP = """\
      - name: Hidden checks (the instructor's, from a secret)
        env:
          HIDDEN_CHECKS: ${{{{ secrets.{secret} }}}}
        run: printf '%s\\n' "$HIDDEN_CHECKS" > "$RUNNER_TEMP/hidden_checks.py"
"""


def workflow(assignment: str, hidden_secret: str | None = None) -> str:
    """The Classroom workflow for ``assignment``; with ``hidden_secret``, hidden checks come
    from that repository or organisation secret (see the README: a student who edits the
    workflow can print a secret, so keep checks that must stay hidden for ./course grade)."""
    notebook = f"assignments/{assignment}.ipynb"
    text = WORKFLOW.format(assignment=assignment, notebook=notebook, step=STEP,
                           env=STEP.upper(), reporter=REPORTER,
                           extra=' --extra-checks "$RUNNER_TEMP/hidden_checks.py"'
                           if hidden_secret else "")
    if hidden_secret:
        marker = "      - name: Grade "
        text = text.replace(marker, HIDDEN_STEP.format(secret=hidden_secret) + marker, 1)
    return text


def main(argv: list[str] | None = None) -> int:
    from . import registry

    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading.classroom",
        description="Print the GitHub Classroom autograding workflow for an assignment.")
    parser.add_argument("assignment", choices=sorted(registry.MODULES))
    parser.add_argument("--hidden-checks-secret", metavar="NAME",
                        help="also run hidden checks kept in this Actions secret")
    parser.add_argument("--out", type=Path, help="write it here instead of printing it")
    args = parser.parse_args(argv)
    text = workflow(args.assignment, args.hidden_checks_secret)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
