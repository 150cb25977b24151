"""The environment: environment.yml and pyproject.toml install the same pinned versions,
and ./course sets it up and starts JupyterLab as the README says (the first run)."""

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).replace('"', "'").lower()


def pyproject_pins() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {_norm(r) for r in data["project"]["dependencies"]}


def environment_pins() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pins = set()
    for line in lines[start + 1:]:
        item = line.strip()
        if not item.startswith("- "):
            break
        item = item[2:].strip()
        if not item.startswith("-e"):
            pins.add(_norm(item))
    return pins


def test_same_pins_in_both_files():
    only_py = pyproject_pins() - environment_pins()
    only_env = environment_pins() - pyproject_pins()
    assert not only_py and not only_env, (
        f"pyproject.toml and environment.yml disagree: only in pyproject {sorted(only_py)}, "
        f"only in environment.yml {sorted(only_env)}")


def test_every_dependency_is_pinned_exactly():
    for req in pyproject_pins():
        assert "==" in req, f"{req} is not pinned with =="


def test_torch_and_triton_are_a_pair_torch_accepts():
    # torch 2.13.0's CUDA wheels require triton==3.7.1 (their METADATA): a GPU user's
    # pip must be able to satisfy both pins at once.
    pins = pyproject_pins()
    assert "torch==2.13.0" in pins
    assert any(p.startswith("triton==3.7.1") for p in pins)


def test_conda_python_is_supported():
    text = (ROOT / "environment.yml").read_text()
    version = re.search(r"python=(\d+)\.(\d+)", text)
    assert version and (int(version[1]), int(version[2])) >= (3, 11)


# ---------------------------------------------------------------------------------------
# ./course: the first run as a learner meets it. Every test here runs in seconds: the
# environment decisions are checked with COURSE_DRY_RUN=1 or with fake interpreters (a
# script that answers like Python), never with a real install.
# ---------------------------------------------------------------------------------------

COURSE = ROOT / "course"
LESSON = "notebooks/00_start_here.ipynb"


def course_env(**overrides) -> dict[str, str]:
    """The environment for running ./course: no display, no PYTHON, no COURSE_* settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "PYTHON", "COURSE_VENV",
                        "COURSE_DRY_RUN", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"}}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run_course(*args, script=COURSE, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(script), *args], env=course_env(**env), capture_output=True,
                          text=True, timeout=60)


def would_run(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith("course: would run: "))
    return shlex.split(line.removeprefix("course: would run: "))


def on_wsl() -> bool:
    try:
        return "microsoft" in Path("/proc/version").read_text().lower()
    except OSError:
        return False


def fake_python(path: Path, version: str, prefix: str, log: Path) -> Path:
    """A script that answers ./course's questions like Python `version` at `prefix`.

    It prints the identity ./course asks for, says yes to "can you make a venv", makes a
    venv of itself for `-m venv [--clear] DIR`, and logs every other call (pip) to `log`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/usr/bin/env bash
if [ "$1" = -c ]; then
  case "$2" in
    *base_prefix*) echo "{version} {prefix}"; exit 0 ;;
    *ensurepip*) exit 0 ;;
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
    hex digits, and the Python version), so the tests below also check that an environment
    that is up to date is not reinstalled after an update of ./course."""
    fake_python(venv / "bin" / "python", version, prefix, log)
    (venv / "pyvenv.cfg").write_text(f"home = {prefix}/bin\n")
    (venv / ".course-stamp").write_text(f"{pyproject_hash()} {version}\n")
    return venv


# -- ./course lab: how to reach lesson 00 ------------------------------------------------

def test_lab_says_how_to_reach_lesson_00_without_a_display():
    r = run_course("lab", "--port", "9999", COURSE_DRY_RUN=1, COURSE_VENV="/nonexistent/venv",
                   PYTHON=sys.executable, SSH_CONNECTION="10.0.0.2 50000 10.0.0.1 22")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "would create /nonexistent/venv" in out           # the dry run installs nothing
    assert f"http://localhost:9999/lab/tree/{LESSON}?token=" in out
    assert "ssh -N -L 9999:localhost:9999 " in out           # port forwarding, on its port
    assert "--ip=0.0.0.0" in out and "--no-browser" in out
    assert "./course lab --port 9999 --no-browser" in out    # flags pass through
    argv = would_run(out)
    assert argv[0] == "/nonexistent/venv/bin/jupyter" and argv[1] == "lab"
    assert f"--LabApp.default_url=/lab/tree/{LESSON}" in argv
    assert "--ContentsManager.hide_globs=*.egg-info" in argv
    assert "--ContentsManager.hide_globs=__pycache__" in argv  # JupyterLab's own kept
    assert argv[-2:] == ["--port", "9999"]                    # the learner's flags last
    if not on_wsl():  # WSL may open the Windows browser; elsewhere, none to find
        assert "--no-browser" in argv and "No display here" in out


def test_lab_leaves_the_browser_alone_with_a_display_or_when_told():
    r = run_course("lab", COURSE_DRY_RUN=1, COURSE_VENV="/nonexistent/venv",
                   PYTHON=sys.executable, DISPLAY=":0")
    assert r.returncode == 0, r.stderr
    assert "--no-browser" not in would_run(r.stdout)
    assert "ssh -N -L 8888:localhost:8888 user@host" in r.stdout  # the remote recipe, still
    r = run_course("lab", "--browser=firefox", "--LabApp.default_url=/lab", COURSE_DRY_RUN=1,
                   COURSE_VENV="/nonexistent/venv", PYTHON=sys.executable)
    argv = would_run(r.stdout)
    assert "--no-browser" not in argv
    assert argv[-2:] == ["--browser=firefox", "--LabApp.default_url=/lab"]
    # JupyterLab refuses a one-value setting given twice: the learner's replaces the course's
    assert sum("default_url" in a for a in argv) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, str, str]:
    """(status, final URL, body) without following redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status, resp.geturl(), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location", ""), ""


def test_lab_serves_lesson_00_headless_and_hides_egg_info(tmp_path):
    """Start JupyterLab exactly as ./course lab would, headless, and ask it over HTTP."""
    pytest.importorskip("jupyterlab")
    port = free_port()
    # A folder like the course's, with the egg-info that a pip build leaves behind.
    (tmp_path / "course" / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / LESSON, tmp_path / "course" / LESSON)
    (tmp_path / "course" / "triton_course_helpers.egg-info").mkdir()
    (tmp_path / "course" / "helpers").mkdir()
    r = run_course("lab", f"--notebook-dir={tmp_path / 'course'}", "--no-browser",
                   f"--port={port}", "--ServerApp.port_retries=0", COURSE_DRY_RUN=1,
                   COURSE_VENV="/nonexistent/venv", PYTHON=sys.executable)
    argv = would_run(r.stdout)
    assert sum(a.startswith("--notebook-dir") for a in argv) == 1  # the learner's, once
    assert f"ssh -N -L {port}:localhost:{port}" in r.stdout
    cmd = [sys.executable, "-m", "jupyter", *argv[1:]]
    token = "course-test-token"
    env = course_env(JUPYTER_TOKEN=token, JUPYTER_RUNTIME_DIR=tmp_path / "runtime",
                     JUPYTER_CONFIG_DIR=tmp_path / "config")
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "lab.log", "w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    status, _, _ = http_get(f"{base}/api/status?token={token}")
                    if status == 200:
                        break
                except OSError:
                    pass
                assert proc.poll() is None, f"JupyterLab exited:\n{Path(log.name).read_text()}"
                assert time.monotonic() < deadline, "JupyterLab did not answer within 60 s"
                time.sleep(0.2)
            status, _, page = http_get(f"{base}/lab/tree/{LESSON}?token={token}")
            assert status == 200 and "JupyterLab" in page
            status, where, _ = http_get(f"{base}/?token={token}")  # / leads to lesson 00
            assert status in (301, 302) and f"/lab/tree/{LESSON}" in where
            status, _, body = http_get(f"{base}/api/contents/?token={token}")
            names = {item["name"] for item in json.loads(body)["content"]}
            assert names == {"notebooks", "helpers"}, names  # no *.egg-info
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        printed = Path(log.name).read_text()
    assert f"http://localhost:{port}/lab/tree/{LESSON}?token=" in printed, printed


# -- ./course env: which Python, and when to rebuild --------------------------------------

def test_an_inactive_pyenv_shim_is_reported_as_such(tmp_path):
    shim = tmp_path / "shims" / "python3.12"
    shim.parent.mkdir()
    shim.write_text("""#!/usr/bin/env bash
echo "pyenv: python3.12: command not found" >&2
echo >&2
echo "The \\`python3.12' command exists in these Python versions:" >&2
echo "  3.12.1" >&2
echo >&2
echo "Note: See 'pyenv help global' for tips on allowing multiple" >&2
echo "      Python versions to be found at the same time." >&2
exit 127
""")
    shim.chmod(0o755)
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=shim, COURSE_VENV=tmp_path / "venv",
                   PYENV_ROOT=tmp_path / "pyenv")
    assert r.returncode == 2
    assert "too old" not in r.stderr
    assert "pyenv shim" in r.stderr and "pyenv: python3.12: command not found" in r.stderr
    assert f"PYTHON={tmp_path}/pyenv/versions/3.12.1/bin/python3.12 ./course env" in r.stderr
    assert "pyenv shell 3.12.1" in r.stderr
    assert not (tmp_path / "venv").exists()


def test_a_python_that_does_not_run_is_not_called_too_old(tmp_path):
    broken = tmp_path / "python3"
    broken.write_text("#!/usr/bin/env bash\necho 'error while loading shared libraries' >&2\n"
                      "exit 127\n")
    broken.chmod(0o755)
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=broken, COURSE_VENV=tmp_path / "venv")
    assert r.returncode == 2 and "too old" not in r.stderr
    assert "could not run" in r.stderr and "error while loading shared libraries" in r.stderr


def test_an_old_python_is_called_too_old(tmp_path):
    old = fake_python(tmp_path / "python3.10", "3.10.14", "/opt/py310", tmp_path / "log")
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=old, COURSE_VENV=tmp_path / "venv")
    assert r.returncode == 2 and "Python 3.10.14, too old" in r.stderr


def test_python_names_the_interpreter_of_the_environment(tmp_path):
    log = tmp_path / "log"
    venv = old_venv(tmp_path / "venv", log)
    py311 = fake_python(tmp_path / "bin311" / "python3.11", "3.11.7", "/opt/py311", log)
    py312 = fake_python(tmp_path / "bin312" / "python3.12", "3.12.4", "/opt/py312", log)

    def plan(**env):
        r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=venv, **env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "is up to date (Python 3.11.7" in plan()              # no PYTHON: keep it
    assert "is up to date (Python 3.11.7" in plan(PYTHON=py311)   # the same interpreter
    out = plan(PYTHON=py312)
    assert "would rebuild" in out and "with Python 3.12.4 from /opt/py312" in out
    assert "made with Python 3.11.7 from /opt/py311" in out
    (venv / ".course-stamp").write_text("0123456789abcdef 3.11.7\n")   # pyproject changed
    assert "would update" in plan()
    assert not log.exists()  # a dry run runs neither venv nor pip


def test_an_environment_whose_python_is_gone_is_rebuilt(tmp_path):
    venv = tmp_path / "venv"
    old_venv(venv, tmp_path / "log")
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 127\n")   # its Python was removed
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=venv, PYTHON=sys.executable)
    assert r.returncode == 0, r.stderr
    assert "would rebuild" in r.stdout and "does not run any more" in r.stdout


def test_python_rebuilds_the_environment_with_that_interpreter(tmp_path):
    """The real ./course env, with fake interpreters standing in for Python and pip."""
    root = tmp_path / "course"   # a copy of ./course, so that nothing here is touched
    root.mkdir()
    shutil.copy(COURSE, root / "course")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "triton_course_helpers.egg-info").mkdir()   # a build leftover
    log = tmp_path / "log"
    venv = old_venv(tmp_path / "venv", log)
    (venv / "made-with-3.11").write_text("")
    py312 = fake_python(tmp_path / "bin" / "python3.12", "3.12.4", "/opt/py312", log)

    r = run_course("env", script=root / "course", COURSE_VENV=venv, PYTHON=py312)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"3.12.4 -m venv --clear {venv}", calls      # made anew, with 3.12
    assert calls[-1] == f"3.12.4 -m pip install -e {root}", calls   # by the new venv's pip
    assert not (venv / "made-with-3.11").exists()
    assert (venv / ".course-stamp").read_text().split() == [pyproject_hash(root), "3.12.4"]
    assert (venv / ".course-python").read_text().strip() == "3.12.4 /opt/py312"
    assert not (root / "triton_course_helpers.egg-info").exists()
    assert "rebuilding" in r.stdout and "[3/3] installing" in r.stdout

    # Run again with the same PYTHON, then without: nothing to do either time.
    log.unlink()
    for env in ({"PYTHON": py312}, {}):
        r = run_course("env", script=root / "course", COURSE_VENV=venv, **env)
        assert r.returncode == 0 and not log.exists(), (r.stdout, r.stderr)


def test_a_folder_that_is_not_a_venv_is_left_alone(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("mine")
    r = run_course("env", COURSE_VENV=tmp_path / "stuff", PYTHON=sys.executable)
    assert r.returncode == 2 and "is not a virtual environment" in r.stderr
    assert (tmp_path / "stuff" / "notes.txt").read_text() == "mine"
