"""``./course release DIR``: write the student release, the course without its answers.

Students get the lessons, the assignments and the ``helpers`` package; instructors keep the
full course and grade with it. The release holds:

* ``README.md`` (without the instructor section), ``course``, ``pyproject.toml``,
  ``environment.yml``, ``.gitignore``, ``notebooks/``;
* ``assignments/``, rendered afresh from ``solutions/`` (``build.render``: every solution
  region replaced by a stub, outputs cleared), so a stale committed copy cannot leak;
* ``helpers/`` without the answer formulas (every ``keys_*.py`` under ``helpers/grading/``),
  without the tools that read solutions (``build.py``, ``leaks.py``, this module), and with
  a sealed answer key ``helpers/grading/keys/<assignment>.json`` per graded assignment (see
  :mod:`.answers`: digests of the acceptance windows under a fresh random salt, no value;
  and, where the keys module has ``reference_outputs()``, a reference function's outputs on
  the notebook's inputs, sealed by :mod:`.outputs`);
* ``tests/``: only the tests that touch neither grading nor solutions (the kernels', the
  lessons' helpers', the environment's) and the nbval sanitizer, so that ``./course test``
  still tells a student whether the kernels and lessons run on their machine. Grading
  tests are left out: they hold right answers, planted submissions and solution paths.

Never in it: ``solutions/``, ``.git``, ``grades/``, ``submissions/``, ``.venv``, caches,
links or special files. The answer values come from each assignment's ``answer_key()``
(in ``keys_<topic>.py`` beside the assignment module ``<topic>.py``, or, until it moves
there, in the assignment module itself: then the release says loudly that the formulas
travel with it). They are
read by a child process that imports the course being released, so any course folder can
be released (the tests release a small fake course).

The release refuses a non-empty DIR unless ``--force`` (which replaces only the entries
the release writes), and any DIR inside the course itself. ``./course release`` is strict
unless ``--no-strict``: it also refuses a release in which answer formulas would travel, or
a function that is, up to renaming, one of the answer formulas' or of the solutions' marked
regions (:func:`.leaks.answers_in`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import answers, build, leaks, outputs

REPO = Path(__file__).resolve().parents[2]
TOP = ("README.md", "VERSIONS.md", "course", "pyproject.toml", "environment.yml", ".gitignore",
       "notebooks", "assignments", "helpers", "tests")
CACHES = ("__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache")
INSTRUCTOR_ONLY = ("helpers/grading/build.py", "helpers/grading/release.py",
                   "helpers/grading/leaks.py")
TEST_WORDS = ("grading", "solution", "planting", "assignments", "submissions")
MARKERS = (build.BEGIN, build.END)


class ReleaseError(RuntimeError):
    """A release that cannot or must not be written; the message says why."""


# ------------------------------------------------------------------------------------
# Which files travel.
# ------------------------------------------------------------------------------------


def _listed(repo: Path) -> list[str]:
    """The course's files: git's tracked and not-ignored ones, or every file without git."""
    if (repo / ".git").exists():
        try:
            out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                  "--exclude-standard"], cwd=repo, capture_output=True,
                                 check=True)
            return sorted({p for p in out.stdout.decode().split("\0") if p})
        except (OSError, subprocess.CalledProcessError):
            pass                   # no git on this machine (a GPU box), or not a repository
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if not any(part in (".git", ".venv") for part in p.relative_to(repo).parts))


def _with_their_helpers(paths: list[str], repo: Path) -> list[str]:
    """``paths`` without the tests that import a module of ``tests/`` left behind (a test
    must run in the release, not fail to import)."""
    import ast

    local = {Path(p).stem for p in _listed(repo) if Path(p).parts[:1] == ("tests",)
             and p.endswith(".py")}
    kept = {Path(p).stem for p in paths if Path(p).parts[:1] == ("tests",)}
    out = []
    for path in paths:
        if Path(path).parts[:1] == ("tests",) and path.endswith(".py"):
            try:
                tree = ast.parse((repo / path).read_text())
            except SyntaxError:
                continue
            names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                     for a in n.names}
            names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                      if isinstance(n, ast.ImportFrom) and not n.level}
            if (names & local) - kept:
                continue
        out.append(path)
    return out


def _test_travels(path: str, text: str) -> bool:
    parts = Path(path).parts
    if len(parts) != 2:            # tests/gpu/...: the instructor's GPU runs
        return False
    if parts[1] == "nbval_sanitize.cfg":
        return True
    return parts[1].endswith(".py") and not any(w in text for w in TEST_WORDS)


def number_formats(x: float) -> set[str]:
    """The ways a number is commonly written: repr, plain, grouped, scientific."""
    x = float(x)
    out = {repr(x), f"{x:.6g}", f"{x:.5g}", f"{x:.4g}"}
    if x.is_integer():
        out |= {str(int(x)), f"{int(x):,}", f"{int(x):_}"}
    mantissa, exp = f"{x:.12e}".split("e")
    mantissa, e = mantissa.rstrip("0").rstrip("."), int(exp)
    for m in {mantissa, mantissa if "." in mantissa else mantissa + ".0"}:
        out |= {f"{m}e{e}", f"{m}e{e:+03d}", f"{m}E{e}", f"{m}E{e:+03d}", f"{m}e{e:+d}"}
    return out


def too_round(x: float) -> bool:
    """Numbers too round to tell from any other use of them (10^9 = N, 0.25, 120)."""
    digits = f"{abs(float(x)):.12e}".split("e")[0].replace(".", "").rstrip("0")
    return len(digits) <= 2 and abs(x) < 1e3 or digits == "1"


def mentions(text: str, values) -> list[str]:
    """The written forms of ``values`` (not too round) that occur as whole tokens in ``text``."""
    found = []
    for x in values:
        if isinstance(x, (str, list, tuple, set)) or too_round(x):   # choices are words
            continue
        found += [f for f in sorted(number_formats(x))    # `in` first: a release in 4 s, not 12
                  if f in text and re.search(r"(?<![\w.])" + re.escape(f) + r"(?![\w])", text)]
    return found


def travels(path: str, repo: Path, values=()) -> bool:
    """Whether the course file ``path`` (relative, POSIX) goes into the release; ``values``
    are the graded answers (a test that writes one out is left out)."""
    p = Path(path)
    parts = p.parts
    if not parts or parts[0] not in TOP:
        return False
    if any(part in CACHES or part.endswith(".egg-info") for part in parts) or p.suffix == ".pyc":
        return False
    full = repo / p
    if full.is_symlink() or not full.is_file():
        return False
    if parts[0] == "assignments" and p.suffix == ".ipynb":
        return False               # rendered afresh from solutions/
    if path in INSTRUCTOR_ONLY or path.startswith("helpers/grading/keys/"):
        return False
    if parts[:2] == ("helpers", "grading") and p.name.startswith("keys_") and p.suffix == ".py":
        return False               # answer formulas, wherever they sit under grading/
    if parts[0] == "tests":        # a test that spells out a graded answer stays home
        text = full.read_text(errors="replace")
        return _test_travels(path, text) and not mentions(text, values)
    return True


# ------------------------------------------------------------------------------------
# The answer values, from the course being released.
# ------------------------------------------------------------------------------------

_READ_KEYS = r"""
import importlib, json, sys
from helpers.grading import registry
def read_keys():
    out = {}
    for name, modname in registry.MODULES.items():
        topic = modname.rsplit(".", 1)[1]
        formulas = modname.rsplit(".", 1)[0] + ".keys_" + topic
        try:
            source, fn = formulas, importlib.import_module(formulas).answer_key
        except ModuleNotFoundError as err:
            if err.name != formulas:
                raise
            module = importlib.import_module(modname)
            source, fn = modname, getattr(module, "answer_key", None)
        values = fn() if fn else None
        sealed = getattr(sys.modules.get(source), "reference_outputs", None) if fn else None
        def plain(v):      # a number, or a choice: a word or a set of words
            return v if isinstance(v, str) else sorted(v) if isinstance(v, (set, frozenset)) \
                else float(v)
        if values is not None:
            values = {k: [plain(v), float(rel), [[float(w), str(d)] for w, d in m]]
                      for k, (v, rel, m) in values.items()}
        out[name] = {"module": modname, "formulas": formulas, "source": source if fn else None,
                     "values": values, "outputs": sealed() if sealed else None}

    return out
"""


def instructor_keys(repo: Path = REPO) -> dict:
    """``{assignment: {"module", "formulas", "source", "values"}}`` of the course at ``repo``.

    The course this module belongs to is read here, in this process (its modules are the
    ones imported already); another course in a child process that imports that course's
    own ``helpers``. Either way the values pass through JSON: what a release sees is what
    the file would hold."""
    if Path(repo).resolve() == REPO.resolve():
        space: dict = {}
        exec(compile(_READ_KEYS, "<the course's answer keys>", "exec"), space)
        return json.loads(json.dumps(space["read_keys"]()))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "keys.json"
        # The mode is the machine's: the keys run no kernel, and a GPU machine's Triton may
        # be one whose interpreter CPU mode refuses.
        path = os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = dict(os.environ, PYTHONPATH=path, MPLBACKEND="Agg")
        script = _READ_KEYS + 'json.dump(read_keys(), open(sys.argv[1], "w"))\n'
        run = subprocess.run([sys.executable, "-c", script, str(out)], cwd=repo, env=env,
                             capture_output=True, text=True, timeout=600)
        if run.returncode:
            raise ReleaseError(f"could not read the answer keys of {repo}:\n{run.stderr[-3000:]}")
        return json.loads(out.read_text())


# ------------------------------------------------------------------------------------
# Writing it.
# ------------------------------------------------------------------------------------


def _student_readme(text: str) -> str:
    """The README without its instructor section; the layout names no solutions."""
    text = text.split("\n## For instructors", 1)[0].rstrip() + "\n"
    lines = []
    for line in text.split("\n"):
        if line.startswith("solutions/"):
            continue
        if line.startswith("assignments/"):
            line = "assignments/       the graded notebooks: work in these, hand them in"
        lines.append(line)
    return "\n".join(lines) + (
        "\n## This copy\n\n"
        "This is the student release of the course: the lessons, the graded assignments "
        "(`assignments/`) and the `helpers` package, without solutions. The `check_*` cells "
        "of an assignment tell you at once whether an answer is right and name common "
        "mistakes, without giving the answer away. Hand in your notebooks as your "
        "instructor asks; they are graded with the full course.\n")


ASSIGNMENTS_README = """# Assignments

The graded notebooks. Work in them top to bottom: each `check_*` cell tells you at once
whether your answers are right, and if not, what went wrong. Hand in the notebook itself
(`NN_topic.ipynb`), keeping its name.
"""


def _check_dest(dest: Path, repo: Path, force: bool) -> None:
    dest, repo = dest.resolve(), repo.resolve()
    if dest == repo or repo in dest.parents:
        raise ReleaseError(f"{dest} is inside the course itself: write the release elsewhere")
    if dest in repo.parents:
        raise ReleaseError(f"{dest} holds the course itself: write the release elsewhere")
    if dest.exists() and not dest.is_dir():
        raise ReleaseError(f"{dest} exists and is not a folder")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise ReleaseError(f"{dest} is not empty: pick an empty folder, or pass --force to "
                           f"replace the release's entries in it ({', '.join(TOP)})")


def _scan(dest: Path) -> list[str]:
    """Problems left in a written release: solution markers, solutions, formulas."""
    problems = []
    for p in sorted(dest.rglob("*")):
        rel = p.relative_to(dest).as_posix()
        if rel.split("/")[0] in ("solutions", ".git", "grades", "submissions"):
            problems.append(f"{rel} should not be in a release")
        if p.name.startswith("keys_") and p.suffix == ".py":
            problems.append(f"{rel}: an answer formulas module")
        if p.is_file():
            text = p.read_text(errors="replace")
            problems += [f"{rel} holds {m!r}" for m in MARKERS if m in text]
    return problems


def release(dest: Path, *, repo: Path = REPO, force: bool = False, strict: bool = False,
            salt: str | None = None, log=print) -> dict:
    """Write the student release of the course at ``repo`` into ``dest``.

    Returns ``{"files": [...], "keys": {assignment: source or None}, "warnings": [...],
    "values": {assignment: the instructor's values or None}}`` (the values never go to disk).
    ``strict`` turns warnings (answer formulas that travel) into a :class:`ReleaseError`, and
    refuses a function that answers a graded part (:func:`.leaks.answers_in`).
    """
    repo, dest = Path(repo).resolve(), Path(dest).resolve()
    _check_dest(dest, repo, force)
    keys = instructor_keys(repo)
    warnings = []
    for name, info in keys.items():
        if info["source"] is None:
            warnings.append(f"{name}: no answer_key() (in {info['formulas']} or "
                            f"{info['module']}): its checks carry whatever values "
                            f"{info['module']} computes")
        elif info["source"] == info["module"]:
            warnings.append(f"{name}: answer_key() lives in {info['module']}, which travels: "
                            f"move the formulas to {info['formulas']}")
    if strict and warnings:
        raise ReleaseError("refusing a release whose answers would travel:\n  "
                           + "\n  ".join(warnings))

    dest.mkdir(parents=True, exist_ok=True)
    for top in TOP:                                 # --force: replace what we write
        target = dest / top
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()

    answers_ = [v[0] for info in keys.values() if info["values"]
                for v in info["values"].values()]
    answers_ += [w for info in keys.values() if info["values"]
                 for v in info["values"].values() for w, _ in v[2]]
    chosen = [path for path in _listed(repo) if travels(path, repo, answers_)]
    chosen = _with_their_helpers(chosen, repo)
    written = []
    for path in chosen:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / path, target)
        written.append(path)

    readme = dest / "README.md"
    if readme.exists():
        readme.write_text(_student_readme(readme.read_text()))
    pyproject = dest / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        new = re.sub(r'(\nhelpers = \[)([^\]]*)\]',
                     lambda m: f'{m[1]}{m[2]}, "grading/keys/*.json"]', text, count=1)
        pyproject.write_text(new)

    solutions = repo / "solutions"
    out = dest / "assignments"
    out.mkdir(exist_ok=True)
    (out / "README.md").write_text(ASSIGNMENTS_README)
    for sol in sorted(solutions.glob("*.ipynb")):
        (out / sol.name).write_text(build.render(sol))
        written.append(f"assignments/{sol.name}")

    keys_dir = dest / "helpers" / "grading" / "keys"
    for name, info in keys.items():
        if info["values"] is None:
            continue
        keys_dir.mkdir(parents=True, exist_ok=True)
        sealed = answers.seal(info["values"], salt or answers.new_salt(), name)
        if info.get("outputs"):     # a reference function's outputs: digests, no value
            sealed["outputs"] = {part: outputs.seal(entry, f"{sealed['salt']}:{part}:outputs")
                                 for part, entry in info["outputs"].items()}
        path = answers.key_path(name, keys_dir)
        path.write_text(json.dumps(sealed, indent=1) + "\n")
        written.append(path.relative_to(dest).as_posix())

    problems = _scan(dest)
    if strict:
        problems += leaks.answers_in(dest, repo)
    if problems:
        raise ReleaseError(f"the release in {dest} is not clean:\n  " + "\n  ".join(problems))
    for w in warnings:
        log(f"release: warning: {w}")
    log(f"release: wrote {len(written)} files to {dest} "
        f"({sum(info['values'] is not None for info in keys.values())} sealed answer keys)")
    return {"files": sorted(written), "warnings": warnings,
            "keys": {name: info["source"] for name, info in keys.items()},
            "values": {name: info["values"] for name, info in keys.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./course release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="where to write the release (outside the course)")
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty folder, replacing the release's entries")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                        help="refuse a release that would carry answers: an assignment's "
                             "answer formulas outside its keys_<topic>.py, or a function equal "
                             "to an answer (the default; --no-strict writes it anyway, with a "
                             "warning for formulas that travel, and looks for no function)")
    args = parser.parse_args(argv)
    try:
        release(args.dir, force=args.force, strict=args.strict)
    except (ReleaseError, build.MarkerError) as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
