"""The judge in a process of its own, with the part's time limit and a memory cap.

The raw results a clean process sends back are plain data, read with
``torch.load(weights_only=True)``, and the judge pairs them with the grader's own cases
(:mod:`.harness.judge`), so a record cannot ask for more work than the grader's case list
allows. That bounds the work by construction; this module bounds it in fact. Each
submission's verdicts are made in a child process (one per submission, restarted after a
verdict it had to stop), forked from a fork server that has the course imported already, so
a judge starts in milliseconds rather than the seconds an import of torch takes. Here, the
grader waits for each verdict with the part's time limit and watches the child's resident
memory; past either, the child is killed, that part reads "not graded", and the class goes
on. Hidden checks (:mod:`.extra`) are judged the same way: the child rebuilds them from
their source (:func:`.extra.merged_spec`).

The fork server is ``python -m helpers.grading.judging`` (one per grader process, started
on first use, gone when the grader's pipe to it closes): it imports the course, then forks a
child for each connection on a Unix socket that only this user can open, with a key only the
grader holds. It never touches the GPU (a process that has initialised CUDA cannot be forked
safely), and the judges do their arithmetic on the CPU.
"""

from __future__ import annotations

import atexit
import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Self

from ..feedback import Feedback
from . import answers, registry, session

BASE_MB = 1024          # what the child holds before it judges: torch, the course
POLL_S = 0.05           # how often the memory is read while a verdict is awaited
START_S = 300.0         # the longest the fork server may take to import the course

_server: tuple | None = None     # (process, address, key) of this process's fork server
_server_lock = threading.Lock()


def _fork_server() -> tuple:
    """This process's fork server (started on first use): ``python -m helpers.grading.judging``
    with the course imported, listening on a socket only this user can reach."""
    global _server
    with _server_lock:
        if _server is not None and _server[0].poll() is None:
            return _server
        folder = tempfile.mkdtemp(prefix="course-judge-")
        address, key = str(Path(folder) / "judge.sock"), secrets.token_bytes(32)
        root = str(Path(__file__).resolve().parents[2])
        # One thread for torch and NumPy, as each kernel gets (session.Kernel): judges run
        # beside kernels and other judges, and OpenMP threads waiting at a barrier for a
        # partner without a core spin. Lesson 06's ten plants, graded two at a time on 2
        # cores: 3-6 CPU-seconds a judge with the default threads, under 1 with one.
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                       [root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        proc = subprocess.Popen([sys.executable, "-m", "helpers.grading.judging", address],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        proc.stdin.write(key.hex().encode() + b"\n")
        proc.stdin.flush()
        ready: list[bytes] = []
        reader = threading.Thread(target=lambda: ready.append(proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(START_S)
        if not ready or ready[0].strip() != b"ready":
            proc.kill()
            shutil.rmtree(folder, True)
            raise RuntimeError("the judge's fork server did not start")
        atexit.register(shutil.rmtree, folder, True)     # runs after the kill below
        atexit.register(proc.kill)
        _server = (proc, address, key)
        return _server


def _serve_forks(address: str) -> None:
    """The fork server: the course imported once, then a child forked for each judge."""
    key = bytes.fromhex(sys.stdin.readline().strip())
    for module in registry.modules().values():
        __import__(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # children are reaped by the kernel

    def leave_with_the_grader():                       # stdin closes when the grader exits
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=leave_with_the_grader, daemon=True).start()
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        os.chmod(address, 0o600)
        print("ready", flush=True)
        while True:
            try:
                conn = listener.accept()
                name = conn.recv() if conn.poll(10) else ""   # the assignment it judges
            except (OSError, EOFError, ValueError):
                continue               # a client that failed the key: not one of ours
            answers.load_lazy_keys(str(name).split(" + ")[0])   # here once, not per child
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    conn.send(os.getpid())
                    _serve(conn)
                finally:
                    os._exit(0)
            conn.close()


def _serve(conn) -> None:
    """In the child: one verdict per message, until the grader closes the pipe."""
    specs: dict = {}
    while True:
        try:
            name, build, key = conn.recv()
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            if name not in specs:
                specs[name] = build()
            part = specs[name].part(key)
            data = registry.read_bytes(payload)
            answer = registry.judge(part, data["raw"])
        except Exception as err:  # noqa: BLE001 - said to the grader, never a silent death
            answer = (Feedback(f"{key}", False, f"could not be checked: {type(err).__name__}: "
                               f"{err}"[:2000], status="error"), [])
        conn.send(answer)


def _not_graded(part: registry.Part, why: str) -> tuple[Feedback, list[str]]:
    return Feedback(part.label, False, f"not graded: {why}; your instructor will look at it",
                    status="error"), []


class Judge:
    """One submission's judge process for the assignment ``name``; ``build``, a function the
    child can import by name (a ``functools.partial`` of one), makes the assignment there
    when it is not a registered one as it stands (hidden checks: :func:`.extra.merged_spec`).

    Use it as a context manager, or call :meth:`stop` when the submission is graded.
    """

    def __init__(self, name: str, limits, build=None):
        self.limits = limits
        self.name = name if build is None else f"{name} + {secrets.token_hex(4)}"
        self.build = build or partial(registry.get, name)
        self.conn, self.pid = None, 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        _, address, key = _fork_server()
        self.conn = Client(address, family="AF_UNIX", authkey=key)
        self.conn.send(self.name)
        if not self.conn.poll(START_S):
            raise RuntimeError("the judge's fork server did not answer")
        self.pid = self.conn.recv()

    def alive(self) -> bool:
        if self.conn is None:
            return False
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.conn = None

    def verdict(self, part: registry.Part, raw) -> tuple[Feedback, list[str]]:
        """What :func:`registry.judge` says of ``raw``, said by the child within the limits."""
        buffer = io.BytesIO()
        import torch

        torch.save({"ok": True, "raw": registry.encode(raw)}, buffer)
        try:
            if not self.alive():
                self.stop()
                self._start()
            self.conn.send((self.name, self.build, part.key))
            self.conn.send_bytes(buffer.getvalue())
        except (OSError, EOFError, ValueError, RuntimeError) as err:
            self.stop()
            print(f"note: the judge process could not start ({type(err).__name__}: {err}); "
                  "judging in the grader's own process", file=sys.stderr)
            return registry.judge(part, raw)
        return self._wait(part)

    def _wait(self, part: registry.Part) -> tuple[Feedback, list[str]]:
        limit_s = self.limits.part_timeout
        cap = (self.limits.memory_mb + BASE_MB) * 2**20
        deadline = time.monotonic() + limit_s
        while True:
            try:
                if self.conn.poll(POLL_S):
                    return self.conn.recv()
            except (EOFError, OSError):
                self.stop()
                return _not_graded(part, "judging it crashed the judge's process")
            if not self.alive():
                self.stop()
                return _not_graded(part, "judging it ended the judge's process")
            if time.monotonic() > deadline:
                self.stop()
                return _not_graded(part, f"judging its results took longer than {limit_s:g} s "
                                         "(the time limit)")
            if session._rss_bytes(self.pid) > cap:
                self.stop()
                return _not_graded(part, f"judging its results took more than "
                                         f"{cap >> 20} MiB of memory (the cap)")


if __name__ == "__main__":
    _serve_forks(sys.argv[1])
