"""The grader's end of the clean collection process (:mod:`.clean_run`).

The notebook has run in its own kernel (:mod:`.grader`), which tells the learner what each
cell did. What is judged comes from somewhere else: a fresh process, sandboxed and capped
like the kernel, that never ran the notebook. It imports the course and the collector
first, then only the notebook's definitions, then collects one unit at a time on a seed
drawn for that unit (:class:`CleanCollector`). Three pipes join it to the grader:

* its stdin: the notebook's cells, then one request a line;
* its stdout: the raw results, each framed with a token only this process and the grader
  know (the learner's prints are sent to /dev/null there; anything else on the pipe that
  is not a frame ends the collection);
* a pipe of course calls: every answer-bearing course function called with learner code
  on the stack writes its name there, between the collector's markers (statement by
  statement while the definitions run, then unit by unit). Only the grader reads it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import registry, sandbox, session

MAGIC = b"COURSE-RAW"       # the start of every frame (sent to the process in its header)
MAX_RESTARTS = 3
MAX_CALL_LINES = 10000      # distinct calls kept between two of the collector's markers


def python_source(source: str) -> str:
    """A cell's code with IPython's syntax (magics, ``!shell``) turned into Python, as the
    notebook's kernel would run it; the plain text when IPython cannot read it."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - a cell IPython cannot read: Python will say why
        return source


@dataclass
class Reply:
    """What one request gave: ``raw`` results, ``tampered`` names, or a failure."""

    kind: str                         # "raw", "tampered", "timeout", "died", "error"
    data: dict | None = None
    text: str = ""
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)


class CleanCollector:
    """One submission's clean collection process, restarted after a hang or a crash."""

    def __init__(self, assignment: str, cells, *, cwd: str, mode: str, limits,
                 isolate: bool | None = None):
        self.assignment, self.cwd, self.mode, self.limits = assignment, cwd, mode, limits
        self.cells = [(number, python_source(source)) for number, source in cells]
        self.isolate = sandbox.available() if isolate is None else isolate
        self.proc = None
        self.restarts = -1
        self.defined: dict | None = None       # the first start's account of the definitions
        self.statement_calls: dict[str, list[str]] = {}   # graded name -> course calls

    # -- the process ----------------------------------------------------------------------

    def _start(self) -> Reply:
        self.stop()
        self.restarts += 1
        self._dir = tempfile.mkdtemp(prefix="course-collect-")
        self._token = secrets.token_hex(16)
        marks_r, marks_w = os.pipe()
        launcher = session.LAUNCHER
        argv = [sys.executable, str(launcher), "--collect", "--memory-mb",
                str(self.limits.memory_mb), "--file-mb", str(session.FILE_MB)]
        if self.isolate:
            argv = sandbox.wrap(argv, scratch=self.cwd, sockets=self._dir,
                                gpu=self.mode == "gpu")
        env = session.Session(cwd=self.cwd, mode=self.mode, memory_mb=self.limits.memory_mb,
                              threads=self.limits.threads, isolate=self.isolate)._env()
        self._log = open(Path(self._dir) / "collect.log", "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, cwd=self.cwd, env=env,
                                     pass_fds=(marks_w,), start_new_session=True)
        os.close(marks_w)
        self._frames: list = []
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read_frames, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._read_calls, args=(marks_r,), daemon=True).start()
        self._watchdog_stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()
        header = {"token": self._token, "assignment": self.assignment, "cells": self.cells,
                  "marks_fd": marks_w, "magic": MAGIC.decode()}
        self._send(header)
        return self._wait(self.limits.total_timeout)

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass                                  # gone: the wait says why

    def _read_frames(self, pipe) -> None:
        head = MAGIC + self._token.encode()
        try:
            while True:
                start = pipe.read(len(head) + 16)
                if len(start) < len(head) + 16:
                    break
                if start[:len(head)] != head:
                    self._put(("error", "the collection's output was not the grader's (the "
                                        "notebook wrote to it)"))
                    break
                kind = start[len(head):len(head) + 8].decode().strip()
                size = int.from_bytes(start[len(head) + 8:], "big")
                if size > registry.MAX_RAW_BYTES:
                    self._put(("error", f"the results are larger than "
                                        f"{registry.MAX_RAW_BYTES >> 20} MiB"))
                    break
                self._put((kind, pipe.read(size)))
        except (OSError, ValueError):
            pass
        self._put(("eof", b""))

    def _read_calls(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            seen: set[str] = set()          # the calls since the last marker
            suffix = " " + self._token
            for line in pipe:
                text = line.decode(errors="replace").rstrip("\n")
                with self._cond:
                    if text.startswith("#") and text.endswith(suffix):
                        self._lines.append(text)   # a marker is always kept
                        seen.clear()
                    elif text not in seen and len(seen) < MAX_CALL_LINES:
                        self._lines.append(text)   # a call, once between two markers
                        seen.add(text)
                    self._cond.notify_all()

    def _put(self, frame) -> None:
        with self._cond:
            self._frames.append(frame)
            self._cond.notify_all()

    def _watch(self) -> None:
        limit = self.limits.memory_mb * 2**20 + (512 * 2**20 if self.mode == "cpu" else 0)
        while not self._watchdog_stop.wait(0.25):
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            if sum(map(session._rss_bytes, session._tree(proc.pid))) > limit:
                self._why = f"it used more than the memory cap of {self.limits.memory_mb} MiB"
                self._kill()
                return

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (OSError, AttributeError):
            pass

    def _wait(self, timeout: float) -> Reply:
        start = time.monotonic()
        self._why = ""
        with self._cond:
            self._cond.wait_for(lambda: self._frames, timeout=max(timeout, 0.01))
            frame = self._frames.pop(0) if self._frames else None
        seconds = round(time.monotonic() - start, 2)
        if frame is None:
            self._kill()
            return Reply("timeout", text=f"stopped after {timeout:g} s (the time limit)",
                         seconds=seconds)
        kind, payload = frame
        if kind == "eof":
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            why = self._why or (f"the process was killed by {signal.Signals(-code).name}"
                                if code is not None and code < 0 else
                                f"the process exited (code {code})")
            return Reply("died", text=why, seconds=seconds)
        if kind in ("error", "failed"):
            self._kill()
            text = payload if isinstance(payload, str) else payload.decode(errors="replace")
            return Reply("error", text=text, seconds=seconds)
        if kind in ("defined", "tampered"):
            text = payload.decode(errors="replace")
            return Reply(kind, json.loads(text) if kind == "defined" else None, text,
                         seconds)
        if kind == "race":
            try:
                return Reply("race", registry.read_data(payload), seconds=seconds)
            except registry.UnreadableResults as err:
                return Reply("error", text=str(err), seconds=seconds)
        try:
            return Reply("raw", registry.read_bytes(payload), seconds=seconds)
        except registry.UnreadableResults as err:
            return Reply("error", text=f"the check's results could not be read: {err}",
                         seconds=seconds)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            self._watchdog_stop.set()
            self._kill()
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._log.close()
            if not os.environ.get("COURSE_KEEP_KERNEL_DIR"):
                shutil.rmtree(self._dir, ignore_errors=True)
            self.proc = None

    # -- markers and calls ----------------------------------------------------------------

    def _calls_since(self, first: int) -> list[tuple[str, list[str]]]:
        """``(marker, course calls after it)`` for the pipe's lines from ``first`` on; a
        marker without the token (written by the learner's code) is not one."""
        with self._cond:
            lines = self._lines[first:]
        out: list[tuple[str, list[str]]] = [("", [])]
        suffix = " " + self._token
        for line in lines:
            if line.startswith("#") and line.endswith(suffix):
                out.append((line[1:-len(suffix)], []))
            elif not line.startswith("#"):
                out[-1][1].append(line)
        return out

    def _wait_for_marker(self, text: str, first: int = 0) -> None:
        """Wait until the calls' pipe has brought the collector's marker ``text``: the
        process writes it before its reply, but another thread reads that pipe."""
        marker = f"#{text} {self._token}"
        with self._cond:
            self._cond.wait_for(lambda: marker in self._lines[first:], timeout=10.0)

    def _note_statements(self) -> None:
        for marker, calls in self._calls_since(0):
            words = marker.split(" ")
            if words[0] == "statement" and len(words) >= 3 and calls:
                names = words[3].split(",") if len(words) > 3 else []
                for name in names:
                    known = self.statement_calls.setdefault(name, [])
                    known[:] = list(dict.fromkeys(known + calls))

    # -- what the grader calls ------------------------------------------------------------

    def start(self) -> Reply:
        """Start the process; the reply says what the definitions did."""
        reply = self._start()
        if reply.kind == "defined":
            # The calls' pipe is read by another thread: wait for the definitions' last
            # marker before reading which statements called the course.
            self._wait_for_marker("defined")
            if self.defined is None:
                self.defined = reply.data
                self._note_statements()
        return reply

    def ask(self, request: dict, timeout: float) -> Reply:
        """A request (a collection, a leaderboard's check or timing), answered by one frame
        and the course calls made meanwhile (restarting a process that is gone)."""
        if not self.alive():
            if self.restarts >= MAX_RESTARTS:
                return Reply("died", text="the collection process kept crashing")
            started = self.start()
            if started.kind != "defined":
                return started
        with self._cond:
            first = len(self._lines)
        self._send(request)
        reply = self._wait(timeout)
        unit = request.get("unit", "race")
        if reply.kind in ("raw", "race"):   # the calls' pipe is read by another thread
            self._wait_for_marker(f"end {unit}", first)
        for marker, calls in self._calls_since(first):
            if marker.startswith("unit "):
                reply.calls += [c for c in calls if c not in reply.calls]
        if reply.kind in ("timeout", "died", "error"):
            self.stop()
        return reply

    def collect(self, unit: str, seed: int, checks: dict | None = None) -> Reply:
        """The raw results of ``unit`` on ``seed`` (restarting a process that is gone)."""
        return self.ask({"unit": unit, "seed": seed, **(checks or {})},
                        self.limits.part_timeout)
