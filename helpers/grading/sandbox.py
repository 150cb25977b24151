"""Each submission's kernel in its own sandbox: bubblewrap (``bwrap``), not a home-made jail.

What a kernel started through :func:`wrap` sees and can do:

* a **read-only copy of the course** at the course's own path (:func:`course_copy`):
  ``helpers``, ``notebooks``, ``assignments`` and the top-level files, without
  ``solutions/``, ``tests/``, ``.git``, hidden grading data (:data:`HIDDEN`), anything
  else lying in the repository (a ``submissions/`` or ``grades/`` folder) or other
  submissions. ``helpers`` is imported from that copy, so nothing a notebook writes can
  reach the installed package;
* the Python environment read-only, the system (``/usr``, ``/etc``, ...) read-only;
* its own **scratch folder** (the working directory, writable; its size is capped by the
  session's watchdog and each file by ``RLIMIT_FSIZE``), and a private, size-capped
  ``/tmp`` and ``/dev/shm`` (tmpfs: they count against a cap and vanish with it);
* **new namespaces** for PIDs, IPC, network, UTS and (where the kernel allows) users: it
  cannot see the grader or other kernels in ``/proc``, signal them, or reach anything on
  the network; it talks to the grader over Unix sockets in a folder bound for that
  (jupyter's ``ipc`` transport);
* ``--die-with-parent`` and a PID namespace: when the kernel's session ends, every process
  it started ends too, double-forked or in a new session (the namespace is torn down
  whole).

In GPU mode the NVIDIA device files are bound in, ``/sys`` is read-only, and the GPU lock
file of :mod:`helpers.grading.gpu` is shared so that timed parts still take turns.

Needs: the ``bwrap`` program (Debian/Ubuntu package ``bubblewrap``) and either root or
unprivileged user namespaces (most distributions allow them; Ubuntu 24.04's AppArmor
restriction can forbid them for unconfined programs). :func:`status` says whether it works
here; when it does not, the grader still grades and says so loudly in each report.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# What of the course a submission's kernel gets (top-level names of the repository).
COURSE_ITEMS = ("helpers", "notebooks", "assignments", "README.md", "pyproject.toml",
                "environment.yml", "course")
# Never copied (glob patterns relative to the repository) when the copy cannot be the
# student release: the answer formulas (a notebook could import them and copy the answers).
# A release's sealed keys (helpers/grading/keys/*.json) are copied: students have them
# already, and without them a release grading itself could check no graded number.
HIDDEN: tuple[str, ...] = ("helpers/grading/**/keys_*.py", "helpers/grading/keys_*.py",
                           "helpers/grading/build.py", "helpers/grading/release.py")
MAX_NOTEBOOK_BYTES = 50 * 2**20   # a submitted file larger than this is refused unread

TMP_MB = 1024            # the sandbox's /tmp
SHM_MB = 256             # the sandbox's /dev/shm
INSTALL_HINT = "install bubblewrap: sudo apt-get install bubblewrap (or your system's package)"

_lock = threading.Lock()
_copy: Path | None = None
_fonts: Path | None = None
_fonts_tried = False
_status: str | None = None
FONTS_AT = "/run/course-fonts"   # in the sandbox: matplotlib's font list, read-only


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def _system_args() -> list[str]:
    """The system, read-only: /usr and friends (links kept as links), /etc."""
    args: list[str] = []
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt"):
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    return args


def _python_dirs() -> list[Path]:
    """The interpreter and its environment (a venv, its base install), read-only."""
    dirs = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
            Path(os.path.realpath(sys.executable)).parents[1]}
    system = ("/usr", "/bin", "/lib", "/opt", "/etc")
    out = []
    for d in sorted(dirs, key=lambda p: len(p.parts)):
        if str(d).startswith(system) or any(d.is_relative_to(o) for o in out):
            continue
        out.append(d)
    return out


def extra_paths() -> list[str]:
    """The grader's ``PYTHONPATH`` folders outside the course (packages an instructor
    provides that way): bound read-only, and kept on the kernel's path."""
    out = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        p = Path(entry) if entry else None
        if p is None or not p.is_absolute() or not p.is_dir():
            continue
        p = p.resolve()
        if p == REPO_ROOT or p.is_relative_to(REPO_ROOT) or p == Path("/"):
            continue
        out.append(str(p))
    return out


def _gpu_args() -> list[str]:
    args: list[str] = []
    for dev in sorted(Path("/dev").glob("nvidia*")):
        args += ["--dev-bind", str(dev), str(dev)]
    for extra in ("/dev/dri", "/run/nvidia-persistenced"):
        if Path(extra).exists():
            args += ["--dev-bind" if extra.startswith("/dev") else "--ro-bind", extra, extra]
    # helpers/grading/gpu.py: one machine-wide lock file, shared with the host's /tmp.
    lock = Path(tempfile.gettempdir()) / "course-grading-gpu.lock"
    try:
        lock.touch(exist_ok=True)
        args += ["--bind", str(lock), "/tmp/course-grading-gpu.lock"]
    except OSError:
        pass
    return args


def course_copy() -> Path:
    """The read-only copy of the course that every sandbox of this process shares: the
    student release (:mod:`helpers.grading.release`: no solutions, answer formulas
    replaced by sealed keys, so the notebook's ``check_*`` calls still answer), without
    its tests. If the release cannot be written, a plain copy of :data:`COURSE_ITEMS`
    without :data:`HIDDEN` (``check_*`` calls of graded numbers then fail in the kernel)."""
    global _copy
    with _lock:
        if _copy is not None and _copy.is_dir():
            return _copy
        root = Path(tempfile.mkdtemp(prefix="course-copy-"))
        try:
            from . import release

            release.release(root / "c", repo=REPO_ROOT, log=lambda *a, **k: None)
            (root / "c").rename(root / "r")
            shutil.rmtree(root / "r" / "tests", ignore_errors=True)
            root = root / "r"
        except Exception as err:  # noqa: BLE001 - a plain copy, and say so
            shutil.rmtree(root, ignore_errors=True)
            root = Path(tempfile.mkdtemp(prefix="course-copy-"))
            print(f"grader: the sandbox gets a plain copy of the course without answer "
                  f"formulas (the student release failed: {type(err).__name__}: "
                  f"{str(err)[:300]})", file=sys.stderr, flush=True)
            for name in COURSE_ITEMS:
                src = REPO_ROOT / name
                if src.is_dir():
                    shutil.copytree(src, root / name, symlinks=True, ignore=_ignore(src))
                elif src.is_file():
                    shutil.copy2(src, root / name)
        import compileall   # read-only in the sandbox: compile once here, not in every kernel

        compileall.compile_dir(root / "helpers", quiet=2, workers=1)
        for venv in _python_dirs():               # mount points for a venv inside the repo
            if venv.is_relative_to(REPO_ROOT) and venv != REPO_ROOT:
                (root / venv.relative_to(REPO_ROOT)).mkdir(parents=True, exist_ok=True)
        for p in [root, *root.rglob("*")]:        # read-only for owner too (belt and braces)
            if not p.is_symlink():
                p.chmod(p.stat().st_mode & ~0o222)
        _copy = root
        atexit.register(_remove_copy, root if root.name != "r" else root.parent)
        return root


def _ignore(src: Path):
    hidden = {p for pattern in HIDDEN for p in REPO_ROOT.glob(pattern)}

    def ignore(folder, names):
        out = {n for n in names if n in (".ipynb_checkpoints", ".git", "__pycache__")
               or n.endswith(".egg-info")}
        out |= {n for n in names if Path(folder) / n in hidden}
        return out

    return ignore


def _remove_copy(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            try:
                p.chmod(p.stat().st_mode | 0o200)
            except OSError:
                pass
    shutil.rmtree(root, ignore_errors=True)


_FONT_LIST = """
import os, matplotlib
from matplotlib import font_manager     # makes the list if there is none
print(os.path.join(matplotlib.get_cachedir(),
                   f"fontlist-v{font_manager.FontManager.__version__}.json"))
"""


def font_list() -> Path | None:
    """A folder holding matplotlib's list of this machine's fonts, made once per process.

    A kernel starts with an empty home folder, where matplotlib would first look at every
    font on the machine to build that list (a third of a second, every kernel); the
    launcher copies this one in instead (:mod:`helpers.grading.kernel_launcher`). None if
    matplotlib keeps its list elsewhere than it says (the kernel then builds its own)."""
    global _fonts, _fonts_tried
    with _lock:
        if _fonts is not None and _fonts.is_dir():
            return _fonts
        if not _fonts_tried:
            _fonts_tried = True
            try:
                # Asked in a child process: the grader itself imports nothing that draws.
                made = Path(subprocess.run(
                    [sys.executable, "-c", _FONT_LIST], capture_output=True, text=True,
                    timeout=120, check=True).stdout.strip())
                if made.is_file():
                    folder = Path(tempfile.mkdtemp(prefix="course-fonts-"))
                    shutil.copy2(made, folder / made.name)
                    atexit.register(shutil.rmtree, folder, True)
                    _fonts = folder
            except (OSError, subprocess.SubprocessError):
                pass
        return _fonts if _fonts is not None and _fonts.is_dir() else None


def wrap(argv: list[str], *, scratch: str, sockets: str, gpu: bool) -> list[str]:
    """``argv`` run inside a new sandbox, with ``scratch`` (its working directory) and
    ``sockets`` (the folder of its connection file and sockets) writable at their own paths."""
    copy = course_copy()
    args = [_bwrap() or "bwrap", "--unshare-all",
            "--die-with-parent", "--new-session", "--hostname", "grading",
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(SHM_MB * 2**20), "--tmpfs", "/dev/shm",
            "--size", str(TMP_MB * 2**20), "--tmpfs", "/tmp",
            "--ro-bind-try", "/sys", "/sys", *_system_args()]
    for d in _python_dirs():
        if not d.is_relative_to(REPO_ROOT):
            args += ["--ro-bind", str(d), str(d)]
    for d in extra_paths():
        args += ["--ro-bind", d, d]
    # The course copy at the course's path: `helpers` (editable install, PYTHONPATH)
    # resolves into it; the venv, if it lives in the repository, stays bound above it.
    args += ["--ro-bind", str(copy), str(REPO_ROOT)]
    for d in _python_dirs():
        if d.is_relative_to(REPO_ROOT):
            args += ["--ro-bind", str(d), str(d)]
    if gpu:
        args += _gpu_args()
    fonts = font_list()
    if fonts is not None:
        args += ["--ro-bind", str(fonts), FONTS_AT]
    args += ["--bind", scratch, scratch, "--bind", sockets, sockets, "--chdir", scratch,
             "--"]
    return args + list(argv)


def status(refresh: bool = False) -> str:
    """``"bwrap"`` and its version when sandboxes work here, else ``"none: <why>"``."""
    global _status
    if _status is not None and not refresh:
        return _status
    if os.environ.get("COURSE_NO_SANDBOX"):
        _status = "none: turned off (--no-sandbox)"
        return _status
    exe = _bwrap()
    if exe is None:
        _status = f"none: bwrap not found ({INSTALL_HINT})"
        return _status
    with tempfile.TemporaryDirectory(prefix="course-probe-") as d:
        try:
            probe = subprocess.run(wrap(["/bin/sh", "-c", "test -d /proc/1 && echo ok"],
                                        scratch=d, sockets=d, gpu=False),
                                   capture_output=True, text=True, timeout=30)
            ok = probe.returncode == 0 and probe.stdout.strip() == "ok"
            why = (probe.stderr.strip() or f"exit code {probe.returncode}").splitlines()[-1]
        except (OSError, subprocess.SubprocessError) as err:
            ok, why = False, str(err)
    if ok:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        _status = version.strip() or "bubblewrap"
    else:
        _status = (f"none: bwrap cannot make a sandbox here ({why[:200]}); it needs root or "
                   "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                   "or on Ubuntu 24.04 kernel.apparmor_restrict_unprivileged_userns=0)")
    return _status


def available() -> bool:
    return not status().startswith("none")


class Refused(Exception):
    """A submitted file that is not read: not a regular file, or too large."""


def read_regular_file(path, max_bytes: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes``, else
    :class:`Refused` with the reason. A link is never followed, a FIFO or device never
    waited on (``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` before reading)."""
    import stat

    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if Path(path).is_symlink():
            raise Refused("it is a symbolic link, not a file (only regular files are "
                          "graded)") from None
        raise Refused(f"it cannot be opened ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)"
                    if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                    else "not a regular file")
            raise Refused(f"it is {kind}, not a file (only regular files are graded)")
        if st.st_size > max_bytes:
            raise Refused(f"it is {st.st_size / 2**20:.0f} MiB, more than the "
                          f"{max_bytes / 2**20:.0f} MiB a submission may be")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise Refused(f"it grew past the {max_bytes / 2**20:.0f} MiB a submission may be")
        return data
    finally:
        os.close(fd)
