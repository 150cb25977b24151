"""The recipe for a lesson, walked for every lesson 00-08.

README.md's "Add a lesson" names, step by step, the files a lesson adds and the command that
checks each step; helpers/README.md's table "One topic name per lesson" names each lesson's
files. This test holds the two to each other and to the tree: every step names its check,
every path a step names exists for each lesson it applies to, every module the table names
exists, and a lesson's topic name is the same in every folder that has a module of its own
for it. A step or a row that stops being true fails here, not in a learner's hands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import experiments, syllabus
from helpers.grading import registry
from helpers.performance.extractors import EXTRACTORS, NOT_REPORTED

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"

# Where a lesson's module of a folder is not named after its topic (or, for lesson 03's
# plants, lives elsewhere), and why. Every other lesson that has a module in one of these
# folders has one named after its topic.
NOT_NAMED_AFTER_THE_TOPIC = {
    ("00", "experiment"): "lesson 00 measures the GPU's two ceilings, the probes every "
                           "later lesson reads",
    ("03", "plants"): "lesson 03's plants are graded as a class folder through the grader's "
                      "command line, whose gradebook tests/test_grading_03.py also tests",
    ("00", "plots"): "lesson 00 draws the GPU's anatomy from the GPU table (plots.machine), "
                     "which lesson 01 shares",
}


def _section(text: str, title: str) -> str:
    """From ``title`` (a Markdown heading) to the next heading of its level or above."""
    start = text.index(title)
    level = len(title) - len(title.lstrip("#"))
    ends = [m.start() for m in re.finditer(r"\n#{1,%d} " % level, text[start + len(title):])]
    return text[start:start + len(title) + ends[0] if ends else None]


def recipe_steps() -> list[tuple[str, str]]:
    """README.md's "Add a lesson" steps: (bold title, the step's whole text)."""
    section = _section((ROOT / "README.md").read_text(), "### Add a lesson")
    steps = re.split(r"\n(?=\d+\. \*\*)", section)[1:]
    return [(re.match(r"\d+\. \*\*(.+?)\*\*", s).group(1), s) for s in steps]


def _names(cell: str) -> list[str]:
    """The module names of a table cell: backticked words outside any parentheses."""
    outside = re.sub(r"\([^)]*\)", "", cell)
    return re.findall(r"`([A-Za-z_][\w.]*)`", outside)


def lesson_rows() -> dict[str, dict]:
    """helpers/README.md's table, one dict a lesson: topic, kernels, experiments, plots,
    exercises, grading, tests (module names)."""
    table = _section((HELPERS / "README.md").read_text(), "## One topic name per lesson")
    header = None
    rows = {}
    for line in table.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = [c.split(",")[0].strip() for c in cells]
            continue
        if set(cells[0]) <= set("-: "):
            continue
        row = dict(zip(header, cells))
        rows[row["lesson"]] = {"topic": _names(row["topic"])[0], "cells": row,
                               **{k: _names(row[k]) for k in header[2:]}}
    return rows


ROWS = lesson_rows()
LESSONS = {lesson.number: lesson for lesson in syllabus.LESSONS}


def test_the_table_has_one_row_per_lesson_of_the_syllabus():
    assert sorted(ROWS) == sorted(LESSONS), (
        f"helpers/README.md lists lessons {sorted(ROWS)}, the syllabus {sorted(LESSONS)}")


def test_every_step_names_the_command_that_checks_it():
    steps = recipe_steps()
    assert len(steps) >= 8, f"README.md's 'Add a lesson' has {len(steps)} steps"
    for title, text in steps:
        check = re.search(r"Check:\s*(.+)", text, re.DOTALL)
        assert check and "`" in check.group(1), f"step '{title}' names no check command"


def _module_exists(folder: Path, name: str) -> bool:
    path = folder.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


# The experiment column names registered experiments (one module may register several);
# the other columns name modules.
FOLDERS = {"kernels": HELPERS / "kernels", "plots": HELPERS / "plots",
           "exercises": HELPERS / "exercises", "grading": HELPERS / "grading" / "assignments",
           "tests": ROOT / "tests"}


@pytest.mark.parametrize("number", sorted(ROWS))
def test_every_module_the_table_names_exists(number):
    row = ROWS[number]
    for column, folder in FOLDERS.items():
        for name in row[column]:
            assert _module_exists(folder, name), (
                f"lesson {number}: helpers/README.md names {column} module `{name}`, but "
                f"{folder.relative_to(ROOT)} has no {name.replace('.', '/')}.py or package")


@pytest.mark.parametrize("number", sorted(ROWS))
def test_the_topic_name_is_the_same_across_folders(number):
    row, topic = ROWS[number], ROWS[number]["topic"]
    assert topic in row["exercises"], f"lesson {number}: no exercises module `{topic}`"
    for column in ("experiment", "plots", "grading"):
        if row[column] and (number, column) not in NOT_NAMED_AFTER_THE_TOPIC:
            assert topic in row[column], (
                f"lesson {number}'s {column} modules {row[column]} do not include its topic "
                f"`{topic}`: name the lesson's own module after its topic")
    assert f"test_exercises_{topic}" in row["tests"], f"lesson {number}: no exercise tests"


@pytest.mark.parametrize("number", sorted(ROWS))
def test_each_experiment_is_registered_recorded_and_reported(number):
    experiments.load_all()
    for name in ROWS[number]["experiment"]:
        assert name in experiments.EXPERIMENTS, (
            f"lesson {number}: helpers/README.md names experiment '{name}', which no module of "
            "helpers/experiments registers with @experiment")
        recorded = list((HELPERS / "records").glob(f"{name}__*.json"))
        if recorded:
            assert name in EXTRACTORS or name in NOT_REPORTED, (
                f"the '{name}' record is neither in the performance report's extractors nor "
                "in NOT_REPORTED with a reason (helpers/performance/extractors.py)")


@pytest.mark.parametrize("number", sorted(ROWS))
def test_a_graded_lesson_has_every_graded_file(number):
    lesson, row = LESSONS[number], ROWS[number]
    stem = Path(lesson.file).stem
    assert lesson.path.is_file(), f"lesson {number}: no notebook {lesson.path}"
    assert lesson.graded == bool(row["grading"]), (
        f"lesson {number}: the registry says graded={lesson.graded}, helpers/README.md "
        f"names grading modules {row['grading']}")
    if not lesson.graded:
        assert not (ROOT / "solutions" / lesson.file).exists()
        return
    topic = row["topic"]
    for path in (ROOT / "solutions" / lesson.file, ROOT / "assignments" / lesson.file):
        assert path.is_file(), f"lesson {number} is graded but {path.relative_to(ROOT)} is missing"
    if _grades_numbers(topic):
        assert (HELPERS / "grading" / "assignments" / f"keys_{topic}.py").is_file(), (
            f"lesson {number}: an assignment that grades numbers keeps their formulas in "
            f"keys_{topic}.py, sealed in a release")
    assert registry.modules()[stem].rsplit(".", 1)[-1] == topic, (
        f"assignment {stem} is graded by {registry.modules()[stem]}, not by the topic's module")
    graded_by = [name for name in row["tests"] if name.startswith("test_grading")]
    assert graded_by, f"lesson {number}: helpers/README.md names no grader test"


def test_the_grader_table_covers_every_graded_lesson_from_04():
    import test_grading_lessons as table

    covered = {cls.assignment for cls in vars(table).values()
               if isinstance(cls, type) and issubclass(cls, table.GradedLesson)
               and cls is not table.GradedLesson}
    graded = {Path(lesson.file).stem for lesson in syllabus.LESSONS
              if lesson.graded and lesson.number >= "04"}
    assert graded <= covered, f"not in tests/test_grading_lessons.py: {sorted(graded - covered)}"


def _grades_numbers(topic: str) -> bool:
    """Whether the assignment reads an answer key: it grades napkin-math numbers."""
    source = (HELPERS / "grading" / "assignments" / f"{topic}.py").read_text()
    return "answers.load_key" in source or "keys_" in source


_PLACEHOLDER = re.compile(r"<(topic|op)>|NN")


@pytest.mark.parametrize("number", sorted(ROWS))
def _applies(template: str, number: str, row) -> bool:
    """Whether a step's path is one this lesson must have."""
    folder = {"helpers/experiments/": "experiment", "helpers/plots/": "plots",
              "tests/plants_": "plants"}
    for prefix, column in folder.items():
        if template.startswith(prefix):
            has = column == "plants" or bool(row[column])
            return has and (number, column) not in NOT_NAMED_AFTER_THE_TOPIC
    if "keys_" in template:
        return _grades_numbers(row["topic"])
    return True


def _fill(template: str, number: str, stem: str, row) -> list[str]:
    """The template's paths for this lesson: ``<op>`` gives one path per kernel op (tests:
    per op that has a test module of its name)."""
    base = (template.replace("<topic>", row["topic"]).replace("NN_topic", stem)
            .replace("NN", number))
    if "<op>" not in template:
        return [base]
    ops = {k.split(".")[0] for k in row["kernels"]}
    if template.startswith("tests/"):
        ops = {t.removeprefix("test_") for t in row["tests"]} & ops
    return [base.replace("<op>", op) for op in sorted(ops)]


@pytest.mark.parametrize("number", sorted(ROWS))
def test_the_paths_each_step_names_exist_for_this_lesson(number):
    """Each backticked path of a step, with ``<topic>``, ``<op>`` and ``NN`` filled in for this
    lesson, exists: once per kernel op where it names ``<op>``, for graded lessons only where
    the step is about grading."""
    lesson, row = LESSONS[number], ROWS[number]
    stem = Path(lesson.file).stem
    for title, text in recipe_steps():
        if "grading" in title.lower() and not lesson.graded:
            continue
        for template in re.findall(r"`((?:helpers|tests|notebooks|solutions|assignments)/"
                                   r"[^`\s]*)`", text):
            if (not _PLACEHOLDER.search(template) or "*" in template or "<gpu>" in template
                    or template.endswith("/")          # "or a package": the .py form is checked
                    or not _applies(template, number, row)):
                continue
            for path in _fill(template, number, stem, row):
                exists = (ROOT / path).exists() or (ROOT / path.removesuffix(".py")).is_dir()
                assert exists, (f"lesson {number}: step '{title}' names `{template}`, "
                                f"but {path} does not exist")
