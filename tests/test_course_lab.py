"""./course lab: JupyterLab on lesson 00, and the one address to open printed last, real.

The dry runs check the command and the advice for each kind of machine; one test starts the
real JupyterLab through ./course on a busy port, reads the address it prints, opens it, and
stops JupyterLab with Ctrl+C (SIGINT), all within seconds.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from course_script import LESSON, ROOT, course_env, pyproject_hash, run_course, would_run


def on_wsl() -> bool:
    try:
        return "microsoft" in Path("/proc/version").read_text().lower()
    except OSError:
        return False


def test_lab_says_how_to_reach_lesson_00_without_a_display():
    r = run_course("lab", "--port", "9999", COURSE_DRY_RUN=1, COURSE_VENV="/nonexistent/venv",
                   PYTHON=sys.executable, SSH_CONNECTION="10.0.0.2 50000 10.0.0.1 22")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "would create /nonexistent/venv" in out           # the dry run installs nothing
    assert "ssh -N -L 9999:localhost:9999 " in out           # port forwarding, on its port
    assert "--ip=0.0.0.0" in out
    assert "flags after 'lab' go to it" in out
    # The address comes last, after the advice; the real one carries JupyterLab's token.
    assert out.splitlines()[-1] == (f"    http://localhost:9999/lab/tree/{LESSON}"
                                    "?token=<the token JupyterLab made>"), out
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


# -- the real start --------------------------------------------------------------------------

def http_get(url: str) -> tuple[int, str, str]:
    """(status, where it redirects, body), without following redirects or any proxy."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as resp:
            return resp.status, resp.geturl(), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location", ""), ""


def environment_of_this_python(folder: Path) -> Path:
    """A course environment, as ./course leaves one, that runs this test's own Python and
    JupyterLab (so that nothing is installed)."""
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists():
        pytest.skip(f"no jupyter beside {sys.executable}")
    (folder / "bin").mkdir(parents=True)
    for name, target in (("python", sys.executable), ("jupyter", jupyter)):
        (folder / "bin" / name).write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        (folder / "bin" / name).chmod(0o755)
    version = ".".join(map(str, sys.version_info[:3]))
    (folder / ".course-stamp").write_text(f"{pyproject_hash()} {version}\n")
    return folder


# Run a command with SIGINT as a terminal's foreground program gets it, in the same process
# (exec). A test run started in the background (``... &``, nohup) hands its children SIGINT
# ignored, and Python, then JupyterLab, would keep ignoring it.
CTRL_C_AS_IN_A_TERMINAL = [sys.executable, "-c", (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])")]


class Output:
    """A process's output, read line by line as it comes."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.reader.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, seconds: float, proc) -> re.Match:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for line in self.lines:
                if m := re.fullmatch(pattern, line):
                    return m
            assert proc.poll() is None, "./course lab ended:\n" + "\n".join(self.lines)
            time.sleep(0.1)
        pytest.fail(f"no line {pattern!r} within {seconds} s:\n" + "\n".join(self.lines))


def test_lab_prints_the_real_address_last_and_stops_on_ctrl_c(tmp_path):
    """On a busy port JupyterLab takes the next one: the address printed is the one it
    serves, with its token, after its own log; Ctrl+C stops it."""
    pytest.importorskip("jupyterlab")
    course = tmp_path / "course"           # a folder like the course's, with a build leftover
    (course / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / LESSON, course / LESSON)
    (course / "triton_course_helpers.egg-info").mkdir()
    (course / "helpers").mkdir()
    venv = environment_of_this_python(tmp_path / "venv")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        env = course_env(COURSE_VENV=venv, JUPYTER_RUNTIME_DIR=tmp_path / "runtime",
                         JUPYTER_CONFIG_DIR=tmp_path / "config")
        proc = subprocess.Popen(
            [*CTRL_C_AS_IN_A_TERMINAL, str(ROOT / "course"), "lab", f"--notebook-dir={course}",
             "--no-browser", f"--port={taken}"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        output = Output(proc)
        try:
            address = output.wait_for(r"    (http://localhost:(\d+)/lab/tree/(\S+)\?token=(\w+))",
                                      120, proc)
            time.sleep(1)                  # nothing after it: it is the last line
            assert output.lines[-1] == address[0], output.lines[-5:]
            url, port, lesson, token = address.groups()
            info = json.loads((tmp_path / "runtime" / f"jpserver-{proc.pid}.json").read_text())
            assert (int(port), token) == (info["port"], info["token"]) and int(port) != taken
            assert lesson == LESSON
            assert f"ssh -N -L {port}:localhost:{port}" in "\n".join(output.lines)  # its port
            status, _, page = http_get(url)
            assert status == 200 and "JupyterLab" in page
            base = f"http://localhost:{port}"
            status, where, _ = http_get(f"{base}/?token={token}")     # / leads to lesson 00
            assert status in (301, 302) and f"/lab/tree/{LESSON}" in where
            status, _, body = http_get(f"{base}/api/contents/?token={token}")
            names = {item["name"] for item in json.loads(body)["content"]}
            assert names == {"notebooks", "helpers"}, names    # no *.egg-info
            # Ctrl+C twice, as ./course says. Without a terminal the first one stops the
            # server at once; Python may then wait at exit for a worker thread that the
            # contents request left idle, which the second one ends.
            for _ in range(2):
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    pass
            assert proc.poll() is not None, (
                "Ctrl+C twice did not stop JupyterLab:\n" + "\n".join(output.lines[-8:]))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output.reader.join(5)

