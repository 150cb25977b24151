"""Each submission graded in its own sandbox: attacks that must gain nothing.

Every attack is a notebook planted in one class folder beside honest students (copies of
the solution), graded by one run of the grader's command line (tests/grading_class.py).
For each: the attacker gains nothing, the honest students' notebooks, scores and reports
are unchanged, the repository is unchanged, no process outlives the grading and the
grader's own memory stays under :data:`GRADER_MB`.

The sandbox is bubblewrap (helpers/grading/sandbox.py); without it these attacks succeed,
so they are skipped where it cannot run, and the last tests check that the grader then
says so.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import nbformat
import pytest

import helpers
from helpers.grading import grader, registry, sandbox
from helpers.grading.session import Session

from grading_class import ASSIGNMENT, REPO, SOLUTION, grade_class
from planting import edit

SPEC = registry.get("03_vector_add_intensity")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
LIMITS = ["--cell-timeout", "60", "--part-timeout", "60", "--memory-gb", "3", "--jobs", "2"]
# The grader's own peak resident memory while it grades the whole class below, 600 MB of
# printed output included (it was about 1.9 GB for that output alone before it stopped
# listening to outputs). Measured: 364 MB in CPU mode (bubblewrap 0.8.0, 2 jobs).
GRADER_MB = 700

needs_sandbox = pytest.mark.skipif(not sandbox.available(),
                                   reason=f"no sandbox here: {sandbox.status()}")
cpu_only = pytest.mark.skipif(helpers.is_gpu(), reason="expected scores are CPU mode's")

MARK = "# TAMPERED-BY-A-SUBMISSION"
BEGIN = "### BEGIN " + "SOLUTION"        # split: this file's own text must not match

# Looks everywhere for another notebook with solutions (the course's, another student's),
# runs it in its own namespace, and appends to every file it can find of the course, the
# other students and the grades folder.
COPY_AND_VANDALISE = f'''
import json, os, pathlib, time
_mark = "{MARK[:14]}" + "{MARK[14:]}"
_roots = ["/work", "/tmp", "/root", "/home", "/srv", "/mnt", "/opt", "/var",
          str(pathlib.Path.cwd().parent)]
for _pid in os.listdir("/proc"):
    try:
        _roots += [a for a in open(f"/proc/{{_pid}}/cmdline").read().split("\\0")
                   if a.startswith("/")]
        _roots.append(os.readlink(f"/proc/{{_pid}}/cwd"))
    except OSError:
        pass
_found, _t, _mine = [], time.time(), pathlib.Path.cwd()
for _root in dict.fromkeys(_roots):
    for _dir, _dirs, _files in os.walk(_root):
        _dirs[:] = [d for d in _dirs if d not in (".venv", ".pyenv", "site-packages", ".git",
                                                  "proc", "sys", "node_modules")]
        if time.time() - _t > 20:
            break
        for _f in _files:
            _p = pathlib.Path(_dir) / _f
            if _p.parent == _mine:
                continue
            if _f.endswith((".ipynb", ".json", ".csv", ".py")):
                try:
                    if _f.endswith(".ipynb") and {BEGIN!r} in _p.read_text():
                        _found.append(_p)
                    with open(_p, "a") as _w:
                        _w.write("\\n" + _mark + "\\n")
                except OSError:
                    pass
import helpers
for _p in pathlib.Path(helpers.__file__).parent.rglob("*.py"):
    try:
        with open(_p, "a") as _w:
            _w.write("\\n" + _mark + "\\n")
    except OSError:
        pass
for _p in _found[:1]:
    for _cell in json.loads(_p.read_text().replace("\\n" + _mark + "\\n", ""))["cells"]:
        if _cell["cell_type"] == "code":
            try:
                exec("".join(_cell["source"]), globals())
            except BaseException:
                pass
'''

# Kills whatever grading process it can see: the grader, sibling kernels, their sandboxes.
KILL_EVERYONE = '''
import os, signal
_victims = []
for _pid in os.listdir("/proc"):
    if not _pid.isdigit() or int(_pid) in (os.getpid(), 1):
        continue
    try:
        _cmd = open(f"/proc/{_pid}/cmdline").read()
    except OSError:
        continue
    if any(w in _cmd for w in ("grader", "kernel_launcher", "bwrap", "ipykernel")):
        _victims.append(int(_pid))
for _pid in _victims + [os.getppid()]:
    try:
        os.kill(_pid, signal.SIGKILL)
    except OSError:
        pass
'''

# Children that try to outlive the grading: a new session, a double fork, a shell's `&`.
LINGER = '''
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        time.sleep(60)
    os._exit(0)
os.wait()
os.system("setsid sleep 60 > /dev/null 2>&1 &")
'''

# Output and files: 300 MB printed, 300 MB written to fd 1, /dev/shm and /tmp filled.
FLOOD = [
    "for _ in range(3):\n    print('x' * 10**8)",
    "import os\nfor _ in range(3):\n    os.write(1, b'y' * 10**8)",
    "_chunk = b'z' * 2**26\nwith open('/dev/shm/fill', 'wb') as _f:\n"
    "    for _ in range(32):\n        _f.write(_chunk)",
    "_chunk = b'z' * 2**26\nwith open('/tmp/fill', 'wb') as _f:\n"
    "    for _ in range(32):\n        _f.write(_chunk)",
]

EXITS = ["exit()", "quit()", "import sys\nsys.exit()", "import os\nos._exit(0)"]


def _fifo(path: Path):
    os.mkfifo(path)


def _link_to(target):
    def make(path: Path):
        path.symlink_to(target)
    return make


def _huge(path: Path):
    with open(path, "wb") as f:
        f.truncate(10 * 2**30)          # sparse: 10 GiB that take no disk


def _folder(path: Path):
    path.mkdir()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    solution = nbformat.read(SOLUTION, as_version=4)
    blank = nbformat.read(ASSIGNMENT, as_version=4)
    tmp = tmp_path_factory.mktemp("isolation")
    alice = tmp / "class" / "alice" / SOLUTION.name
    students = {
        "alice": SOLUTION, "bob": SOLUTION,
        "copier": edit(append=[COPY_AND_VANDALISE])(blank),
        "killer": edit(append=[KILL_EVERYONE])(solution),
        "lingerer": edit(append=[LINGER])(solution),
        "flooder": edit(append=FLOOD)(solution),
        "quitter": edit(insert_after_first=EXITS)(solution),
        "fifo": _fifo, "link_to_zero": _link_to("/dev/zero"), "link_to_alice": _link_to(alice),
        "huge": _huge, "folder": _folder,
    }
    if os.geteuid() == 0:
        students["device"] = lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    return grade_class(tmp, students, *LIMITS)


HONEST = ["alice", "bob"]


@needs_sandbox
@cpu_only
def test_the_class_is_graded_and_honest_students_keep_their_marks(graded):
    assert graded.returncode == 0, graded.output[-3000:]
    assert "Isolation: each kernel in its own sandbox" in graded.output
    for name in HONEST:
        assert graded.reports[name]["isolation"].startswith("bubblewrap")
    graded.assert_honest_unchanged(HONEST, settle=2)
    graded.assert_repo_unchanged()
    graded.assert_no_leftovers()


@needs_sandbox
@cpu_only
def test_a_submission_reads_no_solution_and_writes_nothing_outside_its_folder(graded):
    """It sees a read-only copy of the course without solutions/, tests/, .git or other
    submissions: the solution it looks for is nowhere, the files it appends to are copies."""
    report = graded.reports["copier"]
    assert report["score"] == 0 and report["max_score"] == CPU_MAX, report
    # Its exec() of what it found also withholds its verdicts (helpers/grading/static.py).
    assert {p["status"] for p in report["parts"]} <= {"error", "needs a GPU"}, report
    assert any("exec" in note for note in report["notes"]), report["notes"]
    graded.assert_honest_unchanged(HONEST)
    graded.assert_repo_unchanged()
    for path in list(graded.folder.rglob("*")) + list(graded.out.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != "huge" \
                and path.stat().st_size < 2**27:
            assert MARK not in path.read_text(errors="replace"), path


@needs_sandbox
@cpu_only
def test_a_submission_cannot_signal_the_grader_or_other_kernels(graded):
    assert graded.returncode == 0
    assert graded.reports["killer"]["score"] == CPU_MAX     # it killed nobody, itself included
    graded.assert_honest_unchanged(HONEST)


@needs_sandbox
@cpu_only
def test_no_process_outlives_its_grading(graded):
    assert graded.reports["lingerer"]["score"] == CPU_MAX
    graded.assert_no_leftovers()


@needs_sandbox
@cpu_only
def test_output_and_files_are_capped_and_the_grader_stays_small(graded):
    print(f"\nthe grader's peak resident memory: {graded.peak_rss_mb:.0f} MB")
    assert graded.peak_rss_mb < GRADER_MB, f"the grader peaked at {graded.peak_rss_mb:.0f} MB"
    report = graded.reports["flooder"]
    assert report["score"] == CPU_MAX, report
    cells = {c["first_line"][:12]: c for c in report["cells"]}
    # /dev/shm and /tmp are size-capped: the writes fail, the kernel lives on.
    full = [c for c in report["cells"] if "No space left" in c["evalue"]
            or "too large" in c["evalue"].lower()]
    assert len(full) == 2, cells


@needs_sandbox
@cpu_only
def test_only_regular_files_are_collected(graded):
    reasons = {"fifo": "FIFO", "link_to_zero": "symbolic link", "link_to_alice": "symbolic link",
               "huge": "MiB", "folder": "a folder", "device": "device"}
    for name, words in reasons.items():
        if name not in graded.reports:
            continue
        report = graded.reports[name]
        assert report["error"].startswith("refused") and words in report["error"], report
        assert report["score"] == 0
        assert graded.rows[name]["notes"].startswith("refused"), graded.rows[name]


@needs_sandbox
@cpu_only
def test_exit_in_a_cell_costs_nothing_else(graded):
    report = graded.reports["quitter"]
    assert report["score"] == CPU_MAX, report
    by_line = {c["first_line"]: c for c in report["cells"]}
    assert by_line["exit()"]["status"] == "died" and "exit()" in by_line["exit()"]["evalue"]
    assert by_line["quit()"]["status"] == "died"
    assert by_line["import sys"]["ename"] == "SystemExit"     # IPython catches it
    assert by_line["import os"]["status"] == "died"
    assert len(report["cells"]) == 4


# --------------------------------------------------------------------------------------
# The sandbox from inside (one kernel, fast) and without it.
# --------------------------------------------------------------------------------------


@needs_sandbox
def test_inside_the_sandbox(tmp_path):
    fonts = sorted(os.listdir(sandbox.font_list()))
    assert fonts and all(name.startswith("fontlist-") for name in fonts), fonts
    checks = f"""
import os, pathlib, helpers
course = pathlib.Path(helpers.__file__).parents[1]
assert str(course) == {str(REPO)!r}, course
assert (course / "helpers").is_dir() and (course / "notebooks").is_dir()
for hidden in ("solutions", "tests", ".git"):
    assert not (course / hidden).exists(), hidden
try:
    open(helpers.__file__, "a")
    raise AssertionError("the course is writable")
except OSError:
    pass
pids = [p for p in os.listdir("/proc") if p.isdigit()]
assert len(pids) <= 3, pids                      # bwrap (1), this kernel, nothing else
assert not pathlib.Path({str(tmp_path / "secret.txt")!r}).exists()   # beside the scratch
assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize <= 2**30
assert "JPY_PARENT_PID" not in os.environ and os.environ["HOME"] == "/tmp"
open("scratch-is-writable", "w").write("yes")
# matplotlib's font list, made by the grader, copied in: the first plot builds none
import matplotlib
listed = sorted(os.listdir(matplotlib.get_cachedir()))
assert matplotlib.get_cachedir() == "/tmp/matplotlib" and listed == {fonts!r}, listed
assert not os.access({sandbox.FONTS_AT!r}, os.W_OK)
"""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "secret.txt").write_text("the grader's")
    mode = "gpu" if helpers.is_gpu() else "cpu"
    with Session(cwd=str(scratch), mode=mode, memory_mb=2048) as session:
        assert session.isolate
        ex = session.run(checks, 60)
        assert ex.status == "ok", (ex.ename, ex.evalue, "".join(ex.traceback)[-2000:])
    assert (scratch / "scratch-is-writable").read_text() == "yes"


def test_submitted_files_are_read_only_when_regular(tmp_path):
    (tmp_path / "ok.ipynb").write_text("{}")
    os.mkfifo(tmp_path / "pipe.ipynb")
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "ok.ipynb")
    with open(tmp_path / "big.ipynb", "wb") as f:
        f.truncate(sandbox.MAX_NOTEBOOK_BYTES + 1)
    assert sandbox.read_regular_file(tmp_path / "ok.ipynb") == b"{}"
    start = time.monotonic()
    for name, words in [("pipe", "FIFO"), ("link", "symbolic link"), ("big", "MiB")]:
        with pytest.raises(sandbox.Refused, match=words):
            sandbox.read_regular_file(tmp_path / f"{name}.ipynb")
    assert time.monotonic() - start < 5
    listed = {p.name for p, _ in grader.find_notebooks([tmp_path])}
    assert listed == {"ok.ipynb", "pipe.ipynb", "link.ipynb", "big.ipynb"}


def test_without_bwrap_the_status_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(sandbox, "_status", None)
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    try:
        assert sandbox.status() == f"none: bwrap not found ({sandbox.INSTALL_HINT})"
        assert not sandbox.available()
    finally:
        sandbox._status = None


@cpu_only
def test_without_isolation_the_grader_says_so_loudly(tmp_path):
    graded = grade_class(tmp_path, {"alice": SOLUTION}, *LIMITS, "--no-sandbox",
                         check_repo=False)
    assert graded.returncode == 0, graded.output[-3000:]
    assert "WARNING: submissions are NOT isolated" in graded.output
    report = graded.reports["alice"]
    assert report["isolation"].startswith("none: turned off") and report["score"] == CPU_MAX
    assert "NOT ISOLATED" in graded.rows["alice"]["notes"]
    assert graded.rows["alice"]["isolation"].startswith("none")
