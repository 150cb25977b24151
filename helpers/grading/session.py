"""A fresh kernel process for one submission: run code in it, with limits, and survive it.

:class:`Session` starts an IPython kernel through :mod:`helpers.grading.kernel_launcher`
(memory limit, no core dumps) in a scratch folder, runs code in it one piece at a time
with a time limit each, and reports what happened instead of raising:

* ``ok`` / ``error``: the code finished, or raised (name, message, traceback);
* ``timeout``: it ran past its limit. The kernel is interrupted (a KeyboardInterrupt
  stops a Python loop); if it does not answer within a grace period (a loop inside a C
  call ignores signals) the process is killed;
* ``died``: the process ended (a segfault, the memory cap, ``os._exit``).

After a kill or a death the kernel's state is gone; the grader starts another session
and replays what came before (:mod:`helpers.grading.grader`).
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER = Path(__file__).with_name("kernel_launcher.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Execution:
    status: str                      # "ok", "error", "timeout", "died"
    seconds: float
    ename: str = ""
    evalue: str = ""
    traceback: list = field(default_factory=list)
    killed: bool = False             # the kernel had to be killed (state lost)
    reason: str = ""                 # why it died or was killed, in words

    @property
    def alive(self) -> bool:
        return self.status in ("ok", "error") or (self.status == "timeout" and not self.killed)


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Session:
    def __init__(self, *, cwd: str, mode: str, memory_mb: int = 4096, threads: int = 1,
                 startup_timeout: float = 120.0, grace: float = 5.0):
        self.cwd, self.mode, self.memory_mb = cwd, mode, memory_mb
        self.threads, self.startup_timeout, self.grace = threads, startup_timeout, grace
        self.km = None
        self.kc = None
        self._watchdog = None
        self._stop = threading.Event()
        self.killed_for_memory = False

    # -- lifetime -----------------------------------------------------------------------

    def _env(self) -> dict:
        env = dict(os.environ)
        path = env.get("PYTHONPATH", "")
        env.update({
            "COURSE_MODE": self.mode,              # the grader's mode, not the kernel's guess
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": str(self.threads),  # several kernels share the cores
            "MKL_NUM_THREADS": str(self.threads),
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep + path if path else ''}",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "COURSE_GRADING": "1",
        })
        if self.mode == "gpu":
            env.pop("TRITON_INTERPRET", None)
        return env

    def start(self) -> None:
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpec

        km = KernelManager()
        km._kernel_spec = KernelSpec(
            argv=[sys.executable, str(LAUNCHER), "--memory-mb", str(self.memory_mb),
                  "-f", "{connection_file}"],
            display_name="course grader", language="python", env={}, metadata={})
        # The kernel's own stdout/stderr (not the learner's prints, which travel as
        # messages) go to a log: crash reports land there.
        self._log_path = Path(self.cwd) / f"kernel-{id(self)}-{time.monotonic_ns()}.log"
        self._log = open(self._log_path, "wb")
        km.start_kernel(cwd=self.cwd, env=self._env(), stdout=self._log, stderr=self._log)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=self.startup_timeout)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc
        self._stop.clear()
        self.killed_for_memory = False
        self._watchdog = threading.Thread(target=self._watch_memory, daemon=True)
        self._watchdog.start()

    @property
    def pid(self) -> int | None:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(process, "pid", None)

    def _watch_memory(self) -> None:
        # The backstop for the memory cap: resident memory, polled from outside.
        limit = self.memory_mb * 2**20 + (512 * 2**20 if self.mode == "cpu" else 0)
        while not self._stop.wait(0.25):
            pid = self.pid
            if pid and _rss_bytes(pid) > limit:
                self.killed_for_memory = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                return

    def alive(self) -> bool:
        return self.km is not None and self.km.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.km = self.kc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- running code ---------------------------------------------------------------------

    def _drain_iopub(self) -> None:
        # Outputs are not graded; read them so they do not pile up.
        while True:
            try:
                self.kc.get_iopub_msg(timeout=0)
            except (queue.Empty, ValueError):
                return

    def _await_reply(self, msg_id: str, deadline: float):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self.kc.get_shell_msg(timeout=min(left, 0.25))
            except queue.Empty:
                self._drain_iopub()
                if not self.alive():
                    return "died"
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    def _death(self, start: float) -> Execution:
        reason = (f"it used more than the memory cap of {self.memory_mb} MiB"
                  if self.killed_for_memory else self._exit_reason())
        return Execution("died", time.monotonic() - start, killed=True, reason=reason)

    def _exit_reason(self) -> str:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        code = process.poll() if process is not None else None
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = " (a crash, often a bad memory access)" if name == "SIGSEGV" else ""
            return f"the kernel process was killed by {name}{hint}{self._log_hint()}"
        return f"the kernel process exited (code {code}){self._log_hint()}"

    def _log_hint(self) -> str:
        """The kernel's last words, when it said something useful (a fatal error)."""
        try:
            lines = Path(self._log_path).read_text(errors="replace").splitlines()
        except (OSError, AttributeError):
            return ""
        for line in reversed(lines):
            if any(w in line for w in ("Fatal Python error", "malloc", "corrupted", "Aborted")):
                return f": {line.strip()[:120]}"
        return ""

    def run(self, code: str, timeout: float) -> Execution:
        start = time.monotonic()
        if not self.alive():
            return self._death(start)
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False,
                                 stop_on_error=False)
        reply = self._await_reply(msg_id, start + max(timeout, 0.01))
        if reply == "died":
            return self._death(start)
        if reply is None:                   # out of time: interrupt, then kill if need be
            try:
                self.km.interrupt_kernel()
            except Exception:  # noqa: BLE001
                pass
            late = self._await_reply(msg_id, time.monotonic() + self.grace)
            seconds = time.monotonic() - start
            if isinstance(late, dict):
                self._drain_iopub()
                return Execution("timeout", seconds, "TimeoutError",
                                 f"stopped after {timeout:g} s (the time limit)")
            self.stop()
            return Execution("timeout", seconds, "TimeoutError",
                             f"stopped after {timeout:g} s (the time limit); the kernel did "
                             "not respond to an interrupt and was killed", killed=True,
                             reason="killed at the time limit")
        self._drain_iopub()
        content = reply["content"]
        seconds = time.monotonic() - start
        if content.get("status") == "ok":
            return Execution("ok", seconds)
        return Execution("error", seconds, content.get("ename", ""), content.get("evalue", ""),
                         content.get("traceback", []))
