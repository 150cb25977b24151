"""A class of students graded by the grader's command line, for attack tests.

One call builds a class folder, grades it once as an instructor would (``python -m
helpers.grading.grader FOLDER --out OUT``, in a subprocess) and returns what came out::

    from grading_class import grade_class, SOLUTION

    graded = grade_class(tmp_path, {"alice": SOLUTION, "bob": SOLUTION, "mallory": nb},
                         "--cell-timeout", "60")
    graded.reports["mallory"]["score"]    # parsed JSON reports, by student
    graded.rows["alice"]["notes"]         # gradebook rows (csv.DictReader), by student
    graded.peak_rss_mb                    # the grader process's own peak memory (VmHWM)
    graded.assert_honest_unchanged(["alice", "bob"])
    graded.assert_repo_unchanged()
    graded.assert_no_leftovers()

A student is a notebook (an ``nbformat`` node), a path to copy, or a function
``make(path)`` that creates the entry itself (a FIFO, a link, a huge file); each lies at
``<folder>/<student>/<assignment>.ipynb``. Reports of all assignments are read (the
``unidentified`` folder included).

Leftover processes are found without trusting anything a submission can change: this
test process becomes a *child subreaper* while grading, so every orphan that the grading
leaves (double-forked, in a new session) is re-parented to it, and whatever is still
below it after the grader exits outlived the grading (it is then killed and reaped).

``assert_repo_unchanged`` compares the repository's ``git status`` and the hashes of its
tracked and untracked files before and after; another process editing the working tree
at the same time makes it fail (run it on a quiet tree, as CI does).
"""

from __future__ import annotations

import csv
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "03_vector_add_intensity.ipynb"
ASSIGNMENT = REPO / "assignments" / "03_vector_add_intensity.ipynb"
PR_SET_CHILD_SUBREAPER = 36


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder: Path) -> dict:
    """Hashes of the regular files under ``folder`` (links and special files by kind)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[p] = "link:" + os.readlink(p)
        elif p.is_file():
            st = p.stat()       # a huge file (sparse, say) by size and time, not read
            out[p] = _sha(p) if st.st_size < 2**26 else f"{st.st_size}:{st.st_mtime_ns}"
        elif not p.is_dir():
            out[p] = "special"
    return out


def repo_snapshot() -> dict:
    """``git status`` and the hash of every tracked or untracked (not ignored) file."""
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                            text=True).stdout
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True).stdout.decode().split("\0")
    hashes = {p: _sha(REPO / p) for p in listed if p and (REPO / p).is_file()}
    return {"status": status, "files": hashes}


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


@dataclass
class GradedClass:
    folder: Path                     # the class folder (one sub-folder per student)
    out: Path                        # the grader's --out
    returncode: int
    output: str                      # the grader's stdout and stderr
    seconds: float
    peak_rss_mb: float               # the grader process's peak resident memory
    reports: dict = field(default_factory=dict)      # student -> report (dict)
    rows: dict = field(default_factory=dict)         # student -> gradebook row
    leftovers: list = field(default_factory=list)    # "pid cmdline" that outlived grading
    notebooks_before: dict = field(default_factory=dict)
    out_after: dict = field(default_factory=dict)    # hashes of --out when the grader ended
    repo_before: dict = field(default_factory=dict)
    repo_after: dict = field(default_factory=dict)

    def assert_honest_unchanged(self, honest, settle: float = 0.0) -> None:
        """The honest students' notebooks are untouched, each scored full marks with no
        failed cell, their reports agree with each other, and nothing under --out changed
        after the grader ended (waiting ``settle`` seconds first for late writers)."""
        time.sleep(settle)
        now = _files(self.folder)
        for name in honest:
            for path, digest in self.notebooks_before.items():
                if path.is_relative_to(self.folder / name):
                    assert now.get(path) == digest, f"{name}'s notebook {path} was changed"
            report = self.reports[name]
            assert not report["error"], (name, report["error"])
            assert report["score"] == report["max_score"] > 0, (name, report)
            assert report["cells"] == [], (name, report["cells"])
        parts = {name: [(p["key"], p["points"], p["status"]) for p in self.reports[name]["parts"]]
                 for name in honest}
        assert len({json.dumps(v) for v in parts.values()}) == 1, parts
        assert _files(self.out) == self.out_after, "reports or gradebook changed after grading"

    def assert_repo_unchanged(self) -> None:
        assert self.repo_after["status"] == self.repo_before["status"], (
            "git status changed:\n" + self.repo_after["status"])
        changed = sorted(p for p in set(self.repo_before["files"]) | set(self.repo_after["files"])
                         if self.repo_before["files"].get(p) != self.repo_after["files"].get(p))
        assert not changed, f"the repository changed: {changed}"

    def assert_no_leftovers(self) -> None:
        assert not self.leftovers, f"processes outlived the grading: {self.leftovers}"


def _write_student(folder: Path, name: str, what, filename: str) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    dest = folder / name / filename
    if callable(what):
        what(dest)
    elif isinstance(what, (str, Path)):
        dest.write_bytes(Path(what).read_bytes())
    else:
        nbformat.write(what, dest)


def grade_class(tmp_path: Path, students: dict, *grader_args: str,
                filename: str = SOLUTION.name, timeout: float = 900,
                check_repo: bool = True) -> GradedClass:
    """Build ``tmp_path/class`` from ``students``, grade it with the grader's CLI
    (``grader_args`` added), and return a :class:`GradedClass`."""
    folder, out = tmp_path / "class", tmp_path / "grades"
    folder.mkdir(parents=True)
    for name, what in students.items():
        _write_student(folder, name, what, filename)
    notebooks_before = _files(folder)
    repo_before = repo_snapshot() if check_repo else {}

    # Children this test process had before the grading (multiprocessing's resource
    # tracker, left by an earlier test that started ranks) are not the grading's.
    already = set(_descendants(os.getpid()))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    peak = [0]
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "helpers.grading.grader", str(folder),
                             "--out", str(out), *grader_args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def watch():
        while proc.poll() is None:
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]))
            except OSError:
                pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    seconds = time.monotonic() - start
    watcher.join(1)
    out_after = _files(out) if out.exists() else {}
    time.sleep(0.5)                      # a sandbox torn down a moment after its kernel
    _reap()                              # the dead (zombies re-parented to us) are not left
    outlived = [pid for pid in _descendants(os.getpid()) if pid not in already]
    leftovers = [f"{pid} {_cmdline(pid)}" for pid in outlived]
    for pid in outlived:                    # ours (re-parented to us): end them, reap them
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    time.sleep(0.2)
    _reap()

    graded = GradedClass(folder, out, proc.returncode, output.decode(errors="replace"),
                         seconds, peak[0] / 1024, leftovers=leftovers,
                         notebooks_before=notebooks_before, out_after=out_after,
                         repo_before=repo_before,
                         repo_after=repo_snapshot() if check_repo else {})
    for path in sorted(out.glob("*/*.json")):
        graded.reports[path.stem] = json.loads(path.read_text())
    for book in sorted(out.glob("*/gradebook.csv")):
        with book.open() as f:
            graded.rows.update({r["student"]: r for r in csv.DictReader(f)})
    return graded
