"""``./course release DIR``: what students get holds no solution, no answer formula and no
expected value of a graded part, and its checks still judge right and wrong answers.

A small fake course (one graded assignment whose formulas sit in ``keys_fake.py``) shows
the whole path: formulas -> sealed key -> a ``check_*`` call in the release. The real
course is released too and searched for its own expected values.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.grading import release

REPO = release.REPO
VALUES = {"1a": (6e9, 0.02, [(4.8e10, "you count bits, not bytes")]),
          "1b": (1.791044776119403, 0.02, [(1.791044776119403e-3, "you give seconds")])}

FAKE = {
    "helpers/__init__.py": "",
    "helpers/grading/__init__.py": "",
    "helpers/grading/registry.py": """
        MODULES = {"99_fake": "helpers.grading.assignments.fake"}
    """,
    "helpers/grading/assignments/__init__.py": "",
    "helpers/grading/assignments/fake.py": """
        from .. import answers
        KEY = answers.load_key("99_fake", "helpers.grading.assignments.keys_fake")
        NAMES = {"1a": "add_bytes", "1b": "add_min_time_ms"}

        def check_napkin_math(ns):
            out = []
            for part, name in NAMES.items():
                entry, got = KEY[part], ns[name]
                if entry.matches(got):
                    out.append((part, True, "right"))
                else:
                    out.append((part, False, entry.mistake(got) or "wrong"))
            return out
    """,
    "helpers/grading/assignments/keys_fake.py": f"""
        def answer_key():
            return {VALUES!r}
    """,
    "tests/test_kernel.py": "def test_ok():\n    assert True\n",
    "tests/test_napkin.py": "def test_bytes():\n    assert 2 * 3 * 10**9 == 6e9\n",
    "tests/test_grading_fake.py": "from helpers.grading import registry\n",
    "tests/gpu/device.sh": "echo gpu\n",
    "submissions/alice/99_fake.ipynb": "{}",
    "grades/99_fake/gradebook.csv": "student,score\n",
    ".venv/bin/python": "",
    "helpers/__pycache__/x.cpython-311.pyc": "",
    "notebooks/99_fake.ipynb": "{}",
    "environment.yml": "name: x\n",
}


_formats, _trivial = release.number_formats, release.too_round


def _leaks(root: Path, values: dict[str, float]) -> list[str]:
    found = []
    for p in (p for p in root.rglob("*") if p.is_file()):
        text = p.read_text(errors="replace")
        for label, x in values.items():
            found += [f"{p.relative_to(root)}: {label} = {f}" for f in release.mentions(text, [x])]
    return found


def _solution_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "add_bytes = ...\n### BEGIN SOLUTION\nadd_bytes = 6e9\nadd_min_time_ms = "
        "1.791044776119403\n### END SOLUTION\n"),
        nbformat.v4.new_code_cell("check_napkin_math(globals())")]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


@pytest.fixture
def fake_course(tmp_path) -> Path:
    root = tmp_path / "course"
    for rel, text in FAKE.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    shutil.copy(REPO / "helpers" / "grading" / "answers.py", root / "helpers" / "grading")
    for name in ("course", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    (root / "README.md").write_text("# Course\n\n## Layout\n\nsolutions/  answers\n\n"
                                    "## For instructors\n\n### BEGIN SOLUTION\n")
    _solution_notebook(root / "solutions" / "99_fake.ipynb")
    return root


def _run_in(release_dir: Path, code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(release_dir), COURSE_MODE="cpu", MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=release_dir,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_a_fake_course_is_released_with_a_sealed_key_that_still_judges(fake_course, tmp_path):
    dest = tmp_path / "release"
    result = release.release(dest, repo=fake_course, log=lambda *_: None)
    files = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert result["keys"] == {"99_fake": "helpers.grading.assignments.keys_fake"}
    assert result["warnings"] == []
    assert "helpers/grading/keys/99_fake.json" in files
    assert "assignments/99_fake.ipynb" in files and "tests/test_kernel.py" in files
    for gone in ("helpers/grading/assignments/keys_fake.py", "solutions/99_fake.ipynb",
                 "tests/test_napkin.py",
                 "tests/test_grading_fake.py", "tests/gpu/device.sh",
                 "submissions/alice/99_fake.ipynb", "grades/99_fake/gradebook.csv",
                 ".venv/bin/python", "helpers/__pycache__/x.cpython-311.pyc"):
        assert gone not in files, gone
    assert os.access(dest / "course", os.X_OK)
    text = "".join((dest / f).read_text(errors="replace") for f in files)
    assert "### BEGIN SOLUTION" not in text and "### END SOLUTION" not in text
    assert "For instructors" not in (dest / "README.md").read_text()
    assert '"grading/keys/*.json"' in (dest / "pyproject.toml").read_text()
    assert _leaks(dest, {"1a": 6e9, "1b": 1.791044776119403, "1a mistake": 4.8e10}) == []
    out = _run_in(dest, """
        import json
        from helpers.grading.assignments import fake
        from helpers.grading.answers import Sealed
        assert isinstance(fake.KEY["1a"].expected, Sealed)
        print(json.dumps([fake.check_napkin_math({"add_bytes": 6.05e9, "add_min_time_ms": 1.79}),
                          fake.check_napkin_math({"add_bytes": 4.8e10, "add_min_time_ms": 1.79e-3}),
                          fake.check_napkin_math({"add_bytes": 7e9, "add_min_time_ms": 3.0})]))
    """)
    right, mistaken, wrong = json.loads(out)
    assert all(ok for _, ok, _ in right)
    assert mistaken == [["1a", False, "you count bits, not bytes"], ["1b", False, "you give seconds"]]
    assert wrong == [["1a", False, "wrong"], ["1b", False, "wrong"]]


def test_release_refuses_a_non_empty_folder_or_the_course_itself(fake_course, tmp_path):
    dest = tmp_path / "release"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(release.ReleaseError, match="not empty"):
        release.release(dest, repo=fake_course, log=lambda *_: None)
    (dest / "helpers").mkdir()
    (dest / "helpers" / "stale_keys.py").write_text("x = 1")
    release.release(dest, repo=fake_course, force=True, log=lambda *_: None)
    assert (dest / "notes.txt").read_text() == "mine"           # not ours: left alone
    assert not (dest / "helpers" / "stale_keys.py").exists()    # ours: replaced whole
    for inside in (fake_course, fake_course / "release", fake_course.parent):
        with pytest.raises(release.ReleaseError, match="course itself"):
            release.release(inside, repo=fake_course, force=True, log=lambda *_: None)


def test_strict_refuses_formulas_that_would_travel(fake_course, tmp_path):
    (fake_course / "helpers/grading/assignments/keys_fake.py").unlink()
    (fake_course / "helpers/grading/assignments/fake.py").write_text(
        f"from ..answers import exact_key\n\ndef answer_key():\n    return {VALUES!r}\n\n"
        "KEY = exact_key(answer_key())\n")
    with pytest.raises(release.ReleaseError, match="answers would travel"):
        release.release(tmp_path / "r", repo=fake_course, strict=True, log=lambda *_: None)


def test_strict_refuses_a_function_that_answers_a_graded_part(fake_course, tmp_path):
    """A grader module that holds an answer formula's function under another name (as 06's
    once held part 1's reference merge) is refused; --no-strict writes it."""
    formula = "def {}(nbytes):\n    bits = 8 * nbytes\n    return bits / 2\n"
    keys = fake_course / "helpers/grading/assignments/keys_fake.py"
    keys.write_text(keys.read_text() + "\n\n" + formula.format("half_bits"))
    fake = fake_course / "helpers/grading/assignments/fake.py"
    fake.write_text(fake.read_text() + "\n\n" + formula.format("reference")
                    .replace("nbytes", "n").replace("bits", "b"))
    with pytest.raises(release.ReleaseError, match="fake.py: reference is .*keys_fake.py: "
                       "half_bits up to renaming"):
        release.release(tmp_path / "r", repo=fake_course, strict=True, log=lambda *_: None)
    release.release(tmp_path / "r", repo=fake_course, force=True, log=lambda *_: None)
    assert "def reference" in (tmp_path / "r/helpers/grading/assignments/fake.py").read_text()


def test_the_command_is_strict_unless_told_otherwise(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(release, "release", lambda dest, **kw: seen.append(kw["strict"]))
    assert release.main([str(tmp_path / "r")]) == 0
    assert release.main([str(tmp_path / "r"), "--no-strict"]) == 0
    assert seen == [True, False]


# ------------------------------------------------------------------------------------
# The real course.
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_release(tmp_path_factory):
    """The whole course released strictly, as ``./course release`` does by default: it
    raises if an answer would travel."""
    course = Path(os.environ.get("COURSE_RELEASE_TEST_COURSE", REPO))
    dest = tmp_path_factory.mktemp("student") / "release"
    return dest, release.release(dest, repo=course, strict=True, log=lambda *_: None)


def test_the_real_release_has_no_solutions_and_imports(real_release):
    dest, result = real_release
    assert not (dest / "solutions").exists() and not (dest / ".git").exists()
    assert not list(dest.rglob("keys_*.py"))
    for p in dest.rglob("*"):
        if p.is_file():
            text = p.read_text(errors="replace")
            assert "### BEGIN SOLUTION" not in text, p
    assert sorted(p.name for p in (dest / "assignments").glob("*.ipynb")) == \
        sorted(p.name for p in (REPO / "solutions").glob("*.ipynb"))
    out = _run_in(dest, """
        from helpers.grading import registry
        print(sorted(registry.MODULES))
        for name in registry.MODULES:
            registry.get(name)
    """)
    assert "03_vector_add_intensity" in out


# Overlaps of graded answers with what the lessons measure, known and reported: the
# records of the lessons' experiments hold the intensities and bytes of the very ops
# the assignments ask about (fusion__*.json: 05's 1a and 1b at the assignment's shape;
# roofline__*.json: 03's 1/6 and 1/12), and 49152 as a block size or a shared-memory
# figure. The lessons read them, so they travel; the instructor decides (see README).
KNOWN_OVERLAPS = {"helpers/records/",
                  # Its list of candidate plans prints the H100 record's times of
                  # 333x777x1999 bf16 in microseconds, 19.9: a timing that happens to equal
                  # assignment 03's answer 5e, and says nothing about it.
                  "notebooks/07_autotuning.ipynb: 03_vector_add_intensity 5e = 19.9"}


def test_no_expected_value_of_a_graded_part_is_in_the_real_release(real_release):
    dest, result = real_release
    values = {f"{name} {part}": v[0] for name, vals in result["values"].items() if vals
              for part, v in vals.items()}
    if not values:
        pytest.skip("no assignment has answer_key() yet: nothing to search for")
    leaks = [leak for leak in _leaks(dest, values)
             if not any(leak.startswith(k) for k in KNOWN_OVERLAPS)]
    assert leaks == []


def test_the_release_checks_judge_right_and_wrong_answers(real_release):
    dest, result = real_release
    values = result["values"].get("03_vector_add_intensity")
    if not values:
        pytest.skip("03 has no answer_key() yet")
    out = _run_in(dest, f"""
        import json
        from helpers.grading import registry
        a = registry.get("03_vector_add_intensity")
        mod = __import__(registry.MODULES[a.name], fromlist=["x"])
        values = {values!r}
        names = {{p.key: p.names[0] for p in a.parts if p.key in values}}
        other = {{"memory": "compute", "compute": "memory"}}      # the wrong choice
        right = {{names[k]: v[0] for k, v in values.items() if k in names}}
        wrong = {{names[k]: other[v[0]] if isinstance(v[0], str) else v[0] * 8
                  for k, v in values.items() if k in names}}
        # 1d is a function judged on the grader's draws, with no key value: by hand.
        import math
        def smallest(f, s, bw, floor):
            return max(1, math.ceil(f / (1 - f) * bw * 1e3 * floor / (3 * s)))
        right["smallest_add"], wrong["smallest_add"] = smallest, lambda *a: 8 * smallest(*a)
        print(json.dumps([[fb.passed, fb.message] for fb in mod.check_napkin_math(right)]
                         + [[fb.passed, fb.message] for fb in mod.check_napkin_math(wrong)]))
    """)
    rows = json.loads(out)
    n = len(rows) // 2
    assert all(ok for ok, _ in rows[:n] if True), rows[:n]
    assert not any(ok for ok, _ in rows[n:]), rows[n:]
    messages = "\n".join(m for _, m in rows[n:])
    for part, v in values.items():
        if not isinstance(v[0], (str, list)) and not _trivial(v[0]):
            for f in _formats(v[0]):
                assert not re.search(r"(?<![\w.])" + re.escape(f) + r"(?![\w])", messages), \
                    (part, f)


# Tests that start processes of their own (ranks, a JupyterLab): the main suite runs them on
# the same files; in the release they are collected (their imports checked), not run again.
SPAWNING = ("tests/test_moe_parallel.py", "tests/test_course_lab.py")


def test_the_tests_a_release_keeps_run_there(real_release):
    """Every test that travels imports what travels with it, and passes in the release (all
    but :data:`SPAWNING`, whose imports are checked)."""
    dest, _ = real_release
    tests = sorted(str(p.relative_to(dest)) for p in (dest / "tests").glob("test_*.py"))
    assert tests, "the release keeps no test at all"
    assert set(SPAWNING) <= set(tests), "a test this one skips no longer travels"
    env = dict(os.environ, PYTHONPATH=str(dest), COURSE_MODE="cpu", MPLBACKEND="Agg")
    # One run: SPAWNING's files collected with the others (an import that fails is a
    # collection error, which fails the run), their tests deselected by path.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *tests, *[f"--deselect={t}" for t in SPAWNING]], cwd=dest, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "passed" in run.stdout
    assert re.search(r"\b[1-9]\d* deselected", run.stdout), run.stdout[-3000:]


def test_the_real_release_holds_no_function_that_answers_a_graded_part(real_release):
    """No function of the answer formulas travels, by name or (strict) up to renaming: the
    grader modules judge by sealed keys. 06's reference merge is the known case."""
    import ast

    dest, result = real_release          # strict: no function equal to an answer travels
    assert result["warnings"] == []
    names = {fn.name for path in (REPO / "helpers" / "grading").rglob("keys_*.py")
             for fn in ast.walk(ast.parse(path.read_text())) if isinstance(fn, ast.FunctionDef)
             and not fn.name.startswith("_")} - {"answer_key", "reference_outputs"}
    names -= {"reference_copy_gbps"}   # a given: the probe record's bandwidth, 05's hint prints
    assert "merge_exact" in names
    texts = {p: p.read_text(errors="replace") for p in dest.rglob("*") if p.is_file()}
    found = [f"{p.relative_to(dest)}: def {n}" for p, text in texts.items() for n in names
             if re.search(rf"\bdef {n}\(", text)]
    assert found == []


def test_the_release_judges_merge_states_by_its_sealed_reference(real_release):
    """06's part 1 in a release: a sealed reference on the notebook's inputs, right and wrong
    merges told apart as the instructor's exact reference does; graded on another seed (a
    release grading itself), the run on the notebook's inputs is judged."""
    dest, _ = real_release
    out = _run_in(dest, """
        import json, math, torch
        from helpers.grading.assignments import attention, attention_merge as am

        def right(m_a, l_a, acc_a, m_b, l_b, acc_b):
            m = torch.maximum(m_a, m_b)
            a, b = (torch.exp(x - torch.where(m == -math.inf, 0.0, m)) for x in (m_a, m_b))
            return m, a * l_a + b * l_b, a[:, None] * acc_a + b[:, None] * acc_b

        def added(m_a, l_a, acc_a, m_b, l_b, acc_b):
            return torch.maximum(m_a, m_b), l_a + l_b, acc_a + acc_b

        def off(*states):
            m, l, acc = right(*states)
            return m, l, acc * (1 + 3e-4)

        rows = [type(am.reference()).__name__]
        for fn in (right, added, off):
            (fb,) = attention.check_merge({"merge_states": fn})
            raw = am.collect_merge({"merge_states": fn}, 12345)
            graded = attention.ASSIGNMENT.part("1").judge(dict(raw, __seed__=12345))
            rows.append([fb.passed, fb.message, graded.passed])
        print(json.dumps(rows))
    """)
    kind, right, added, off = json.loads(out.strip().splitlines()[-1])
    assert kind == "Sealed"
    assert right[0] and right[2], right
    assert not added[0] and not added[2] and "you add the two sums" in added[1], added
    assert not off[0] and not off[2] and "not the state of both" in off[1], off
