"""Running ./course in tests: a clean environment, its dry-run answers, and fake interpreters.

(pytest puts ``tests/`` on the import path: ``from course_script import run_course``.)
Every helper here runs in seconds: the environment decisions are checked with
COURSE_DRY_RUN=1 or with fake interpreters (a script that answers like Python), never with a
real install.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
LESSON = "notebooks/00_start_here.ipynb"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# What the learner's shell may set that changes what ./course does.
_SETTINGS = {"DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "PYTHON", "COURSE_VENV", "COURSE_DRY_RUN",
             "COURSE_TORCH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "SSH_CONNECTION",
             "SSH_CLIENT", "SSH_TTY"}


def course_env(**overrides) -> dict[str, str]:
    """The environment for running ./course: none of the settings above unless given."""
    env = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run_course(*args, script=COURSE, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(script), *args], env=course_env(**env), capture_output=True,
                          check=False, text=True, timeout=60)


def would_run(out: str) -> list[str]:
    """The command a dry run says it would run, as argv."""
    line = next(ln for ln in out.splitlines() if ln.startswith("course: would run: "))
    return shlex.split(line.removeprefix("course: would run: "))


def nvidia_driver_here() -> bool:
    """What ./course's own test for an NVIDIA driver would find on this machine."""
    return (Path("/proc/driver/nvidia/version").exists()
            or Path("/usr/lib/wsl/lib/nvidia-smi").exists()
            or any((Path(d) / "nvidia-smi").exists()
                   for d in os.environ.get("PATH", "").split(os.pathsep) if d))


def fake_nvidia_smi(folder: Path) -> str:
    """A PATH whose first folder holds an ``nvidia-smi``: a machine with a driver."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI 580.00'\n")
    tool.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def fake_python(path: Path, version: str, prefix: str, log: Path,
                offline: bool = False) -> Path:
    """A script that answers ./course's questions like Python `version` at `prefix`.

    It prints the identity ./course asks for, says yes to "can you make a venv", names
    `prefix`/site-packages as its packages' folder, makes a venv of itself for `-m venv
    [--clear] DIR`, and logs every other call (pip, compileall) to `log`.
    Asked whether PyTorch's CPU index answers, it says yes, or, if `offline`, that the name
    does not resolve (as on a machine without a network).
    """
    answer = 'echo "[Errno -2] Name or service not known"; exit 1' if offline else "exit 0"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/usr/bin/env bash
if [ "$1" = -c ]; then
  case "$2" in
    *base_prefix*) echo "{version} {prefix}"; exit 0 ;;
    *ensurepip*) exit 0 ;;
    *urllib*) echo "{version} -c <is the index there?> $3" >> "{log}"
              {answer} ;;
    *sysconfig*) echo "{prefix}/site-packages"; exit 0 ;;
  esac
fi
echo "{version} $*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then
  dir="${{@: -1}}"
  [ "$3" = --clear ] && rm -rf "$dir"
  mkdir -p "$dir/bin"
  echo "home = {prefix}/bin" > "$dir/pyvenv.cfg"
  cp "$0" "$dir/bin/python"
fi
exit 0
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def pyproject_hash(root: Path = ROOT) -> str:
    return hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]


def old_venv(venv: Path, log: Path, version="3.11.7", prefix="/opt/py311") -> Path:
    """A finished environment made with Python `version`, as ./course leaves it. The stamp
    is written the way earlier versions of ./course wrote it (sha256 of pyproject.toml, 16
    hex digits, and the Python version), so the tests also check that an environment that
    is up to date is not reinstalled after an update of ./course."""
    fake_python(venv / "bin" / "python", version, prefix, log)
    (venv / "pyvenv.cfg").write_text(f"home = {prefix}/bin\n")
    (venv / ".course-stamp").write_text(f"{pyproject_hash()} {version}\n")
    return venv
