"""Collect submissions from students' repositories into ``submissions/<student>/``.

GitHub Classroom gives each student a repository made from the template (the student
release); cloned together (for instance ``gh classroom clone student-repos``), they lie side
by side as ``<folder>/<assignment slug>-<login>/``, each a whole course with the lessons in it.
This command takes from each repository only the graded notebooks, named as the course names
them (``assignments/03_vector_add_intensity.ipynb``), and lays them out the way
``./course grade`` reads a class::

    python -m helpers.grading.collect ~/classroom/hw03-submissions --out submissions/
    ./course grade submissions/

The student is the repository's folder name without the slug all the folders share
(``hw03-alice`` -> ``alice``; ``--prefix`` to name it). Only regular files are copied: a
link or a special file in a student's repository is skipped and reported, never followed.
A notebook that is already collected and unchanged is left alone; a changed one replaces it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import registry, sandbox


def _common_prefix(names: list[str]) -> str:
    """The shared ``<slug>-`` of Classroom's repository names, if every name has one."""
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(names)
    cut = prefix.rfind("-")
    return prefix[:cut + 1] if cut > 0 else ""


def student_name(folder: str, prefix: str) -> str:
    name = folder[len(prefix):] if prefix and folder.startswith(prefix) else folder
    return name or folder


def collect(source: Path, out: Path, *, prefix: str | None = None,
            assignments=None, log=print) -> list[tuple[str, Path]]:
    """Copy each repository's graded notebooks from ``source`` to ``out/<student>/``.

    Returns ``(student, notebook)`` for every notebook written or already there."""
    source, out = Path(source), Path(out)
    names = sorted(assignments or registry.MODULES)
    repos = sorted(p for p in source.iterdir() if p.is_dir() and not p.is_symlink()
                   and not p.name.startswith("."))
    if prefix is None:
        prefix = _common_prefix([r.name for r in repos])
    found = []
    for repo in repos:
        student = student_name(repo.name, prefix)
        copied = 0
        folder = repo / "assignments"
        if folder.is_symlink():        # never followed out of the student's repository
            log(f"collect: {student}: skipped: assignments/ is a link")
            continue
        for name in names:
            path = folder / f"{name}.ipynb"
            if not (path.exists() or path.is_symlink()):
                continue
            try:
                data = sandbox.read_regular_file(path)
            except sandbox.Refused as err:
                log(f"collect: {student}: skipped {path.relative_to(source)}: {err}")
                continue
            dest = out / student / f"{name}.ipynb"
            if not dest.exists() or dest.read_bytes() != data:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
            found.append((student, dest))
            copied += 1
        if not copied:
            log(f"collect: {repo.name}: no graded notebook in assignments/ "
                f"(looked for {', '.join(n + '.ipynb' for n in names)})")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the folder of cloned student repositories")
    parser.add_argument("--out", type=Path, default=Path("submissions"),
                        help="where to lay out <student>/<assignment>.ipynb (default: "
                             "submissions/)")
    parser.add_argument("--prefix", help="the part of each folder name before the student's "
                        "login (default: what all the folders' names share, up to a '-')")
    parser.add_argument("--assignment", action="append", choices=sorted(registry.MODULES),
                        help="collect only this assignment (repeatable; default: every one)")
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        print(f"collect: {args.source} is not a folder", file=sys.stderr)
        return 2
    found = collect(args.source, args.out, prefix=args.prefix, assignments=args.assignment)
    students = sorted({s for s, _ in found})
    print(f"collect: {len(found)} notebook(s) of {len(students)} student(s) in {args.out}")
    return 0 if found else 2


if __name__ == "__main__":
    sys.exit(main())
