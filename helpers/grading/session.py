"""A fresh kernel process for one submission: run code in it, with limits, and survive it.

:class:`Session` starts an IPython kernel through :mod:`helpers.grading.kernel_launcher`
(memory limit, file-size limit, no core dumps), inside a bubblewrap sandbox where the
machine allows one (:mod:`helpers.grading.sandbox`: a read-only copy of the course, its
own scratch folder, private size-capped /tmp and /dev/shm, no view of the grader or other
kernels, nothing that outlives it), runs code in it one piece at a time with a time limit
each, and reports what happened instead of raising:

* ``ok`` / ``error``: the code finished, or raised (name, message, traceback);
* ``timeout``: it ran past its limit. The kernel is interrupted (a KeyboardInterrupt
  stops a Python loop); if it does not answer within a grace period (a loop inside a C
  call ignores signals) the process is killed;
* ``died``: the process ended (a segfault, the memory cap, ``os._exit``, ``exit()``).

After a kill or a death the kernel's state is gone; the grader starts another session
and replays what came before (:mod:`helpers.grading.grader`).

The grader only reads replies to what it sends: after start-up it does not listen to the
kernel's outputs at all (a cell printing gigabytes costs the grader nothing), and a reply
is capped in size (:data:`MAX_MESSAGE_BYTES`) and its error text cut short.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox

LAUNCHER = Path(__file__).with_name("kernel_launcher.py")
REPO_ROOT = Path(__file__).resolve().parents[2]

MAX_MESSAGE_BYTES = 32 * 2**20   # a reply larger than this is dropped (a timeout, then a kill)
MAX_TEXT = 4000                  # characters kept of an error's message, per traceback line
SCRATCH_MB = 1024                # the scratch folder, all files together
FILE_MB = 512                    # any one file the kernel writes (RLIMIT_FSIZE)
MAX_FILES = 20000                # files in the scratch folder


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


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` (of any of its threads), from ``/proc/PID/task/*/children``;
    None where the kernel does not offer those files (CONFIG_PROC_CHILDREN)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []                            # gone
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += map(int, f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue                     # the thread ended meanwhile
            return None                      # no such files on this kernel
        except (OSError, ValueError):
            continue
    return out


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (a sandbox's processes, whatever they forked).

    Walked down from ``pid`` through each process's list of children, which costs a few
    reads a process of the sandbox; where the kernel keeps no such lists, the parent of
    every process on the machine is read instead (a few ms a pass on a busy machine)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = _children(p)
        if kids is None:
            return _tree_by_scan(pid)
        out.append(p)
        todo += kids
    return out


def _tree_by_scan(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _folder_bytes(path: str, limit_files: int) -> tuple[int, int]:
    """Bytes on disk and number of entries under ``path`` (counting stops past the limit)."""
    total, count, todo = 0, 0, [path]
    while todo and count <= limit_files:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    count += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
        except OSError:
            continue
    return total, count


def _cut(text: str) -> str:
    text = str(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f" ... ({len(text)} characters)"


class Session:
    def __init__(self, *, cwd: str, mode: str, memory_mb: int = 4096, threads: int = 1,
                 startup_timeout: float = 120.0, grace: float = 5.0,
                 isolate: bool | None = None):
        self.cwd, self.mode, self.memory_mb = cwd, mode, memory_mb
        self.threads, self.startup_timeout, self.grace = threads, startup_timeout, grace
        self.isolate = sandbox.available() if isolate is None else isolate
        self.km = None
        self.kc = None
        self._watchdog = None
        self._stop = threading.Event()
        self._dir = None
        self._log = None
        self.killed_for_memory = False
        self.killed_for = ""

    # -- lifetime -----------------------------------------------------------------------

    def _env(self) -> dict:
        if self.isolate:
            # Only what a kernel needs: no paths, tokens or folders of the grader's shell.
            keep = ("PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH")
            prefixes = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "PYTORCH_")
            env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(prefixes)}
            env.pop("TRITON_CACHE_DIR", None)
            env.update(HOME="/tmp", TMPDIR="/tmp", PYTHONNOUSERSITE="1", COURSE_SANDBOX="1",
                       MPLCONFIGDIR="/tmp/matplotlib", COURSE_FONTS=sandbox.FONTS_AT,
                       PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                            f"{env.get('PATH', '/usr/bin:/bin')}")
        else:
            env = dict(os.environ)
        path = (env.get("PYTHONPATH", "") if not self.isolate
                else os.pathsep.join(sandbox.extra_paths()))
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
        import zmq
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpec

        # A private folder, outside the scratch folder: the kernel's log (which the
        # notebook cannot read or forge) and, in a sandbox, the folder of its sockets.
        self._dir = Path(tempfile.mkdtemp(prefix="course-kernel-"))
        sockets = self._dir / "s"
        sockets.mkdir()
        argv = [sys.executable, str(LAUNCHER), "--memory-mb", str(self.memory_mb),
                "--file-mb", str(FILE_MB), "-f", "{connection_file}"]
        if self.isolate:
            # No network in the sandbox: the kernel listens on Unix sockets in `sockets`.
            km = KernelManager(transport="ipc", ip=str(sockets / "k"),
                               connection_file=str(sockets / "kernel.json"))
            argv = sandbox.wrap(argv, scratch=self.cwd, sockets=str(sockets),
                                gpu=self.mode == "gpu")
        else:
            km = KernelManager(connection_file=str(sockets / "kernel.json"))
        # Every socket of this kernel's manager and client refuses oversized messages.
        km.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        km._kernel_spec = KernelSpec(
            argv=argv, display_name="course grader", language="python", env={},
            # a sandboxed kernel is interrupted by a message (the grader cannot signal it)
            interrupt_mode="message" if self.isolate else "signal", metadata={})
        # The kernel's own stdout/stderr (not the learner's prints, which travel as
        # messages) go to a log: crash reports land there.
        self._log_path = self._dir / "kernel.log"
        self._log = open(self._log_path, "wb")
        km.start_kernel(cwd=self.cwd, env=self._env(), stdout=self._log, stderr=self._log)
        self.km = km
        self._stop.clear()
        self.killed_for_memory, self.killed_for = False, ""
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=self.startup_timeout)
        except RuntimeError:
            kc.stop_channels()
            self.kc = None
            self.stop()
            raise
        # Outputs are not graded: stop listening to them, so that whatever a cell prints
        # is dropped by the kernel's side, never queued in the grader.
        kc.iopub_channel.stop()
        self.kc = kc

    @property
    def pid(self) -> int | None:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(process, "pid", None)

    def _kill(self, why: str) -> None:
        self.killed_for = why
        pid = self.pid
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)   # a sandbox goes down whole with it
            except OSError:
                pass

    def _watch(self) -> None:
        # The backstops for the caps, polled from outside: resident memory of the kernel
        # and everything it started, and the size of its scratch folder.
        limit = self.memory_mb * 2**20 + (512 * 2**20 if self.mode == "cpu" else 0)
        tick = 0
        while not self._stop.wait(0.25):
            pid = self.pid
            if not pid:
                continue
            rss = sum(map(_rss_bytes, _tree(pid))) if self.isolate else _rss_bytes(pid)
            if rss > limit:
                self.killed_for_memory = True
                self._kill(f"it used more than the memory cap of {self.memory_mb} MiB")
                return
            tick += 1
            if tick % 4 == 0:
                size, files = _folder_bytes(self.cwd, MAX_FILES)
                if size > SCRATCH_MB * 2**20 or files > MAX_FILES:
                    self._kill(f"it wrote more than {SCRATCH_MB} MiB or {MAX_FILES} files "
                               "to its folder (the cap)")
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
            try:
                self.km.cleanup_resources()
            except Exception:  # noqa: BLE001
                pass
        self.km = self.kc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            if not os.environ.get("COURSE_KEEP_KERNEL_DIR"):
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- running code ---------------------------------------------------------------------

    def _await_reply(self, msg_id: str, deadline: float):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self.kc.get_shell_msg(timeout=min(left, 0.25))
            except queue.Empty:
                if not self.alive():
                    return "died"
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    def _death(self, start: float) -> Execution:
        reason = ("it used more than the memory cap of "
                  f"{self.memory_mb} MiB" if self.killed_for_memory else
                  self.killed_for or self._exit_reason())
        return Execution("died", time.monotonic() - start, killed=True, reason=reason)

    def _exit_reason(self) -> str:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        code = process.poll() if process is not None else None
        if code is not None and self.isolate and code > 128:
            code = 128 - code       # bwrap passes a signal on as 128 + its number
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
            with open(self._log_path, "rb") as f:      # only its end: the log may be large
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                lines = f.read().decode(errors="replace").splitlines()
        except (OSError, AttributeError, TypeError):
            return ""
        for line in reversed(lines):
            if any(w in line for w in ("Fatal Python error", "malloc", "corrupted", "Aborted")):
                return f": {line.strip()[:120]}"
        return ""

    def _ended(self, start: float, why: str) -> Execution:
        """The kernel ended itself after replying (``exit()``): make sure it is gone."""
        self.stop()
        return Execution("died", time.monotonic() - start, killed=True, reason=why)

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
                return Execution("timeout", seconds, "TimeoutError",
                                 f"stopped after {timeout:g} s (the time limit)")
            self.stop()
            return Execution("timeout", seconds, "TimeoutError",
                             f"stopped after {timeout:g} s (the time limit); the kernel did "
                             "not respond to an interrupt and was killed", killed=True,
                             reason="killed at the time limit")
        content = reply["content"]
        seconds = time.monotonic() - start
        if any(p.get("source") == "ask_exit" and not p.get("keepkernel")
               for p in content.get("payload") or ()):
            return self._ended(start, "it called exit() or quit(), which stops the kernel")
        if content.get("status") == "ok":
            return Execution("ok", seconds)
        return Execution("error", seconds, _cut(content.get("ename", "")),
                         _cut(content.get("evalue", "")),
                         [_cut(line) for line in content.get("traceback", [])[-30:]])
