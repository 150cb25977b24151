"""``./course grade PATH ...``: grade submitted notebooks, one or a folder of them.

For each notebook:

1. Read it (a regular file only: links, FIFOs, devices and huge files are refused with a
   reason) and copy it into a scratch folder. The learner's file is only ever read.
2. Start a fresh kernel process there (:class:`~helpers.grading.session.Session`), in its
   own sandbox where the machine allows (:mod:`helpers.grading.sandbox`: it sees a
   read-only student copy of the course and its scratch folder, nothing of the grader,
   other submissions or the grades); memory capped, ``COURSE_MODE`` set to the grader's
   mode, in CPU mode with every interpreted kernel bounds-guarded (:func:`helpers.bounds.install`).
3. Run its code cells in order, each with a time limit, the whole under a total limit.
   A cell that raises does not stop the run, as in "Run All" with errors allowed; a cell
   that hangs is interrupted; one that kills the kernel is skipped and the cells before
   it are replayed in a new kernel.
4. Grade the parts (:mod:`.parts`): collect raw results in that kernel, on inputs made
   from a seed drawn after the cells ran, and judge them here, where the notebook cannot
   reach, each collection under its own time limit.
5. Hidden checks (:mod:`.extra`, ``--extra-checks FILE``): an instructor's parts kept
   outside the course, graded after the assignment's own in the same kernel.
6. Report: a table of parts, points and messages; JSON and the learner's Markdown feedback
   in <out>/<assignment>/, and that folder's CSV gradebook rebuilt from all its reports.
   A notebook that holds the solution (its markers, or most of its answer lines) is flagged
   for the instructor (:mod:`.flags`), with no point taken. Folders are graded in parallel,
   one kernel process per core. ``--classroom`` (:mod:`.classroom`) also reports the points
   as GitHub Classroom's autograding reads them.

No submission stops the grading of the others: an exception anywhere in reading, running,
judging or writing one notebook's report becomes that report, every part "not graded: the
grader could not grade this notebook (<the exception>); see the instructor" and a note
that names it (:func:`not_graded`). The command exits 0 with every student in the
gradebook (but ``--classroom``, whose exit says full marks or not).

    ./course grade submissions/alice/03_vector_add_intensity.ipynb
    ./course grade submissions/ --out ~/grades --extra-checks ~/hidden/hidden_03.py
    ./course grade --classroom assignments/03_vector_add_intensity.ipynb
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import classroom, extra, flags, gpu, parts, registry, sandbox
from .report import (ERROR, NEEDS_GPU, CellResult, PartResult, Report, clean,
                     rebuild_gradebook, report_path, say)

DEFAULT_OUT = Path("grades")
MAX_RESTARTS = 3

# Runs before the learner's first cell: decide the mode, guard interpreted kernels, and
# draw no figure: nobody reads a graded kernel's outputs. The inline backend renders each
# figure a cell leaves open to PNG, and pyplot's post-cell hook (interactive mode, which
# %matplotlib inline turns on) draws each stale one with Agg first (0.2-0.4 s of CPU each);
# a hook registered first marks them drawn. A figure still reaches the learner's code.
SETUP = """\
import helpers
from helpers import bounds as _course_bounds
if helpers.is_cpu():
    _course_bounds.install()
del _course_bounds
for _course_format in ("image/png", "image/jpeg", "image/svg+xml", "application/pdf"):
    get_ipython().display_formatter.formatters[_course_format].enabled = False
del _course_format
def _course_undrawn(modules=__import__("sys").modules):
    gcf = getattr(modules.get("matplotlib._pylab_helpers"), "Gcf", None)
    [setattr(m.canvas.figure, "stale", False) for m in (gcf.get_all_fig_managers() if gcf else ())]
get_ipython().events.register("post_execute", _course_undrawn); del _course_undrawn
"""


@dataclass(frozen=True)
class Limits:
    cell_timeout: float = 120.0     # seconds for one code cell
    part_timeout: float = 300.0     # seconds for one graded part's check
    total_timeout: float = 1200.0   # seconds for all the notebook's cells together
    memory_mb: int = 4096           # the kernel process's memory cap
    threads: int = 1                # CPU threads per kernel (grading in parallel)


def detect_assignment(nb, path: Path) -> str | None:
    """The assignment a notebook belongs to: its metadata, else its file name."""
    meta = nb.get("metadata") if isinstance(nb, dict) else None
    meta = meta.get("course") if isinstance(meta, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("assignment"), str) \
            and meta["assignment"] in registry.MODULES:
        return meta["assignment"]
    for name in registry.MODULES:
        if name in path.name or path.name.startswith(name.split("_", 1)[0] + "_"):
            return name
    return None


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()[:60]
    return source.strip()[:60]


class _Run:
    """One notebook in one (or, after crashes, several successive) kernel sessions."""

    def __init__(self, cells, tmp: str, mode: str, limits: Limits):
        self.cells, self.tmp, self.mode, self.limits = cells, tmp, mode, limits
        self.session = None
        self.skip: set[int] = set()          # cells that hung or crashed: never replayed
        self.late_deaths: list[int] = []     # cells after which the kernel was found dead
        self.restarts = 0

    def boot(self, upto: int) -> bool:
        """A fresh kernel with the setup and the cells before index ``upto`` replayed."""
        from .session import Session

        if self.session is not None:
            self.session.stop()
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                return False
        self.session = Session(cwd=self.tmp, mode=self.mode, memory_mb=self.limits.memory_mb,
                               threads=self.limits.threads)
        self.session.start()
        ex = self.session.run(SETUP, self.limits.cell_timeout)
        if ex.status != "ok":   # the grader's fault or its limits', never the learner's
            raise RuntimeError(f"the grader's own setup failed in a fresh kernel ("
                               f"{ex.reason or f'{ex.ename}: {ex.evalue}'}); is --memory-gb "
                               f"({self.limits.memory_mb} MiB) too low?")
        for number, source in self.cells[:upto]:
            if number not in self.skip:
                ex = self.session.run(source, self.limits.cell_timeout)
                if not ex.alive:
                    self.skip.add(number)
                    return self.boot(upto)
        return True

    def ensure_alive(self, last: int | None) -> bool:
        """Before cell index ``last + 1``: a kernel that died after answering cell ``last``
        (``exit()`` in a thread, a child killing its parent) is blamed on that cell, which
        is left out of the replay. False when the kernel keeps dying."""
        if self.session is None or self.session.alive():
            return True
        if last is not None:
            self.skip.add(self.cells[last][0])
            self.late_deaths.append(self.cells[last][0])
        return self.boot(len(self.cells) if last is None else last + 1)

    def revive(self) -> bool:
        """A live kernel with every cell replayed, unless it kept crashing (False)."""
        if self.session is not None and self.session.alive():
            return True
        return self.restarts <= MAX_RESTARTS and self.boot(len(self.cells))

    def stop(self):
        if self.session is not None:
            self.session.stop()


def grade_notebook(path, *, assignment: str | None = None, limits: Limits = Limits(),
                   mode: str | None = None, student: str | None = None,
                   checks: tuple[extra.Checks, ...] = ()) -> Report:
    """Grade one submitted notebook; never raises (an exception in the grading becomes the
    report's verdict: :func:`not_graded`).

    ``checks``: hidden checks (:func:`extra.load`); those that extend this notebook's
    assignment add their parts after its own."""
    from .. import runtime

    path = Path(path)
    mode = mode or runtime.MODE
    start = time.monotonic()
    report = Report(notebook=str(path), student=student or path.stem,
                    assignment=assignment or "?", mode=mode, limits=asdict(limits))
    try:
        _grade(report, path, assignment, limits, mode, checks)
    except Exception as err:  # noqa: BLE001 - the grader's own failure: this report says it
        not_graded(report, err, checks)
    report.seconds = round(time.monotonic() - start, 1)
    return report


def not_graded(report: Report, err: BaseException, checks=()) -> Report:
    """``report`` of a notebook the grader could not grade, because of ``err``: every part
    (the hidden checks' too) not graded, 0 points, and a note for the instructor."""
    what = type(err).__name__
    try:
        detail = clean(str(err))[:300]
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        detail = "?"
    report.notes.append(f"the grader could not grade this notebook: {what}"
                        + (f": {detail}" if detail else "") + " (the grader's failure, not a "
                        "verdict: grade it by hand)")
    message = (f"not graded: the grader could not grade this notebook ({what}); see the "
               "instructor")
    try:
        spec = registry.get(report.assignment)
    except Exception:  # noqa: BLE001 - an unknown assignment: no parts to list
        report.error = report.error or message.removeprefix("not graded: ")
        return report
    hidden = tuple(p for c in checks if c.extends == spec.name for p in c.parts)
    report.parts = [PartResult(p.key, p.title, 0, p.points,
                               NEEDS_GPU if p.gpu and report.mode == "cpu" else ERROR, message)
                    for p in spec.parts + hidden]
    return report


def _grade(report: Report, path: Path, assignment, limits: Limits, mode: str, checks) -> None:
    """Grade the notebook at ``path`` into ``report``; may raise (the grader's failure)."""
    import nbformat

    report.isolation = sandbox.status()
    data = b""
    try:    # only a regular file, never a link, FIFO or device, and not a huge one
        data = sandbox.read_regular_file(path)
        nb = nbformat.reads(data.decode("utf-8", errors="replace"), as_version=4)
    except sandbox.Refused as err:
        nb = None
        report.error = f"refused: {path.name}: {err}"
    except Exception as err:  # noqa: BLE001 - unreadable: a score of zero and why
        nb = None
        report.error = f"could not read the notebook ({type(err).__name__}: {err})"
    name = assignment or detect_assignment(nb, path)
    if name is None:
        report.error = report.error or (f"cannot tell which assignment this is; pass "
                                        f"--assignment (one of {sorted(registry.MODULES)})")
        return
    report.assignment = name
    spec = registry.get(name)
    hidden = [c for c in checks if c.extends == name]
    if nb is None:
        report.parts = [PartResult(p.key, p.title, 0, p.points,
                                   NEEDS_GPU if p.gpu and mode == "cpu" else ERROR,
                                   report.error)
                        for p in spec.parts + tuple(p for c in hidden for p in c.parts)]
        return

    cells, number = [], 0
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            number += 1
            source = cell.get("source", "")
            cells.append((number, source if isinstance(source, str) else ""))
    report.flags, report.notes = flags.solution_flags(nb, name)
    tmp = tempfile.mkdtemp(prefix="course-grade-")
    run = _Run(cells, tmp, mode, limits)
    cell_results: dict[int, CellResult] = {}
    try:
        (Path(tmp) / path.name).write_bytes(data)    # the bytes read, not the path again
        run.boot(0)
        deadline = time.monotonic() + limits.total_timeout
        last = None                      # index of the last cell run
        for i, (number, source) in enumerate(cells):
            if not run.ensure_alive(last):
                break
            last = i
            left = deadline - time.monotonic()
            if left <= 0:
                cell_results[number] = CellResult(number, "timeout", "TimeoutError",
                                                  f"not run: the notebook used up its total "
                                                  f"limit of {limits.total_timeout:g} s",
                                                  _first_line(source))
                continue
            with gpu.cell_turn(mode, limits):        # a timing elsewhere has the GPU alone
                ex = run.session.run(source, min(limits.cell_timeout, left))
            if ex.status != "ok":
                evalue = ex.evalue if ex.status != "died" else ex.reason
                # "(3412986.py, line 2)": IPython's scratch file name says nothing to a learner
                evalue = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1)", evalue)
                cell_results[number] = CellResult(number, ex.status, ex.ename, evalue,
                                                  _first_line(source), round(ex.seconds, 2))
            if ex.status == "timeout" or not ex.alive:
                run.skip.add(number)     # a replay after a later crash leaves it out
            if not ex.alive and not run.boot(i + 1):
                break
        if cells:
            run.ensure_alive(last)
        for number in run.late_deaths:
            source = dict(cells)[number]
            cell_results[number] = CellResult(
                number, "died", "", "the kernel stopped after this cell ran (exit() or a "
                "process it started killing it?); left out of the replay",
                _first_line(source))
        report.cells = [cell_results[k] for k in sorted(cell_results)]

        report.parts, notes = parts.grade_parts(spec, run, cells, cell_results, tmp, mode,
                                                 limits)
        report.notes = notes + report.notes
        for c in hidden:
            report.parts += extra.grade_parts(c, spec, run, cells, cell_results, tmp, mode,
                                              limits, report.parts)
    finally:
        run.stop()
        _remove(tmp)


# --------------------------------------------------------------------------------------
# Many notebooks: names, parallel workers, the gradebook.
# --------------------------------------------------------------------------------------


def _remove(folder: str) -> None:
    """Remove a scratch folder, whatever modes the submission left on its files."""
    def unlock(func, path, _exc):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    shutil.rmtree(folder, onerror=unlock)


def find_notebooks(paths) -> list[tuple[Path, str]]:
    """``(notebook, student)`` for every notebook under ``paths`` (files or folders).

    Every entry named ``*.ipynb`` is listed, links and special files included: reading
    it (:func:`helpers.grading.sandbox.read_regular_file`) refuses what is not a regular
    file, with the reason in that student's report. Linked folders are not entered.

    The student is the notebook's folder below the given one (submissions/alice/any name
    .ipynb -> alice), or the notebook's name when it lies in the given folder itself
    (submissions/alice.ipynb -> alice). A single file given by name is its folder's
    student if its name is an assignment's, else its own name."""
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            for nb in sorted(_walk(p)):
                if ".ipynb_checkpoints" in nb.parts:
                    continue
                rel = nb.relative_to(p)
                parts = rel.parts[:-1] if len(rel.parts) > 1 else (rel.stem,)
                found.append((nb, "__".join(parts)))
        elif p.is_file():
            student = p.parent.name if p.stem in registry.MODULES and p.parent.name else p.stem
            found.append((p, student))
        elif p.exists() or p.is_symlink():     # a link, a FIFO: refused, with a report
            student = p.parent.name if p.stem in registry.MODULES and p.parent.name else p.stem
            found.append((p, student))
        else:
            raise FileNotFoundError(f"{p} does not exist (relative paths start from "
                                    f"{Path.cwd()})")
    return found


def _walk(folder: Path):
    """Entries named ``*.ipynb`` below ``folder``, without following linked folders."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            if name.endswith(".ipynb"):
                yield Path(top) / name


def _grade_one(args) -> Report:
    path, student, assignment, limits, mode, checks = args
    try:
        return grade_notebook(path, assignment=assignment, limits=limits, mode=mode,
                              student=student, checks=checks)
    except Exception as err:  # noqa: BLE001 - one bad notebook never stops the others
        return not_graded(Report(str(path), student, assignment or "?", mode), err, checks)


def grade_many(notebooks, *, assignment=None, limits: Limits = Limits(), mode=None,
               jobs: int | None = None, on_result=None, checks=()) -> list[Report]:
    """Grade ``(path, student)`` pairs, ``jobs`` at a time (default: one per core)."""
    from .. import runtime

    mode = mode or runtime.MODE
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(notebooks) or 1))
    work = [(p, s, assignment, limits, mode, tuple(checks)) for p, s in notebooks]
    if jobs == 1:
        reports = []
        for w in work:
            reports.append(_grade_one(w))
            if on_result:
                on_result(reports[-1])
        return reports
    # Threads are enough: each notebook runs in its own kernel *process*, and a grading
    # thread only sends it code and waits for replies.
    reports = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_grade_one, w) for w in work]
        for fut in cf.as_completed(futures):
            reports.append(fut.result())
            if on_result:
                on_result(reports[-1])
    order = {str(p): i for i, (p, _) in enumerate(notebooks)}
    return sorted(reports, key=lambda r: order.get(r.notebook, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./course grade", description="Grade submitted notebooks into a table, JSON "
        "reports and (for several) a CSV gradebook.")
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of them")
    parser.add_argument("--assignment", choices=sorted(registry.MODULES),
                        help="which assignment (default: from the notebook's metadata or name)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="folder for the reports: <out>/<assignment>/<student>.json and "
                             "<out>/<assignment>/gradebook.csv (default: grades/)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="notebooks graded at once (default: one per CPU core)")
    d = Limits()
    parser.add_argument("--cell-timeout", type=float, default=d.cell_timeout,
                        help=f"seconds per code cell (default {d.cell_timeout:g})")
    parser.add_argument("--part-timeout", type=float, default=d.part_timeout,
                        help=f"seconds per graded part's check (default {d.part_timeout:g})")
    parser.add_argument("--total-timeout", type=float, default=d.total_timeout,
                        help=f"seconds for all of a notebook's cells (default {d.total_timeout:g})")
    parser.add_argument("--memory-gb", type=float, default=d.memory_mb / 1024,
                        help=f"memory cap per kernel process, GiB (default {d.memory_mb / 1024:g})")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels without isolation (not for real submissions: a "
                             "notebook could then read or change anything this user can)")
    parser.add_argument("--extra-checks", action="append", default=[], metavar="FILE",
                        help="hidden checks kept outside the course: a module naming the "
                             "assignment it EXTENDS and its PARTS (repeatable)")
    parser.add_argument("--classroom", action="store_true",
                        help="for GitHub Classroom's autograding: print 'Points X/Y', write "
                             "the step's result output ($GITHUB_OUTPUT), exit 1 below full "
                             "marks")
    args = parser.parse_args(argv)
    try:
        checks = tuple(extra.load(path) for path in args.extra_checks)
    except extra.ChecksError as err:
        print(f"course grade: {err}", file=sys.stderr)
        return 2

    from .. import runtime

    if args.no_sandbox:
        os.environ["COURSE_NO_SANDBOX"] = "1"
        sandbox.status(refresh=True)
    isolation = sandbox.status()
    if sandbox.available():
        print(f"Isolation: each kernel in its own sandbox ({isolation})", flush=True)
    else:
        print("=" * 78 + "\nWARNING: submissions are NOT isolated: a notebook can read other "
              "students' work\nand the solutions, change files, and signal this grader.\n"
              f"Isolation {isolation}\n" + "=" * 78, file=sys.stderr, flush=True)

    try:
        notebooks = find_notebooks(args.paths)
    except FileNotFoundError as err:
        print(f"course grade: {err}", file=sys.stderr)
        return 2
    if not notebooks:
        print(f"course grade: no notebooks under {', '.join(args.paths)}", file=sys.stderr)
        return 2
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(notebooks)))
    limits = Limits(args.cell_timeout, args.part_timeout, args.total_timeout,
                    int(args.memory_gb * 1024), max(1, (os.cpu_count() or 1) // jobs))
    single = len(notebooks) == 1
    written: dict[Path, Path] = {}        # report file -> the notebook it grades
    print(f"Grading {len(notebooks)} notebook(s) in {runtime.MODE.upper()} mode, {jobs} at a "
          f"time (limits: {limits.cell_timeout:g} s per cell, {limits.total_timeout:g} s per "
          f"notebook, {limits.part_timeout:g} s per check, {limits.memory_mb} MiB)", flush=True)

    def show(report: Report):      # written and shown; failing that, as not graded
        path = report_path(args.out, report, written)
        written[path] = Path(report.notebook)
        for attempt in range(2):
            try:
                report.write_json(path)
                report.write_markdown(path.with_suffix(".md"))
                say(report.to_text() if single else report.summary_line())
                say(f"  report: {path} (feedback: {path.with_suffix('.md').name})")
                return
            except Exception as err:  # noqa: BLE001 - one report never stops the others
                if attempt:
                    say(f"course grade: could not write {path}: {type(err).__name__}", sys.stderr)
                else:
                    not_graded(report, err, checks)

    reports = grade_many(notebooks, assignment=args.assignment, limits=limits, jobs=jobs,
                         on_result=show, checks=checks)
    for folder in sorted({path.parent for path in written}):
        rebuild_gradebook(folder)
    if args.classroom:
        print(classroom.points_line(reports), flush=True)
        classroom.write_output(reports)
        return classroom.exit_code(reports)
    failed = [r.student for r in reports if any(n.startswith("the grader could not grade")
                                                for n in r.notes)]
    if failed:
        say(f"course grade: the grader could not grade {len(failed)} notebook(s), each "
            f"reported as not graded (see its notes): {', '.join(failed)}", sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
