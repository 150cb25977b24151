"""Start an IPython kernel for a submission, with limits set before any of its code runs.

The grader runs this file as the kernel's command (``python kernel_launcher.py
--memory-mb N --file-mb N -f CONNECTION_FILE``; with ``--collect`` first, the clean
collection process of :mod:`.clean_run` instead of a kernel), inside the sandbox when there is one
(:mod:`helpers.grading.sandbox`), by path, so that nothing of the course is imported
before the limits hold. Limits set here bind the kernel process and everything it runs:

* ``RLIMIT_DATA`` caps the heap (malloc, mmap'd anonymous memory) in CPU mode. An
  allocation past it fails cleanly: torch raises "DefaultCPUAllocator: can't allocate
  memory", NumPy a MemoryError, and the learner's cell reports it. Not in GPU mode: the
  CUDA driver maps large regions of its own and would refuse to start.
* ``RLIMIT_FSIZE`` caps any one file the kernel (or what it starts) writes, its own log
  included: a write past it fails with "File too large" (Python ignores ``SIGXFSZ``).
* No core dumps: a crashing submission must not leave gigabytes behind; a fatal error
  prints its Python traceback to the kernel's log instead (``faulthandler``).

In a sandbox it also copies matplotlib's font list, which the grader made once, into the
kernel's own (empty, writable) matplotlib folder, so no kernel builds it again.

The grader also watches the process's resident memory from outside (both modes) and
kills it past the cap, the backstop for whatever the limit does not catch.
"""

import os
import resource
import sys


def main(argv: list[str]) -> None:
    memory_mb = file_mb = None
    collect = argv[:1] == ["--collect"]      # the clean collection process, not a kernel
    argv = argv[1:] if collect else argv
    while argv[:1] in (["--memory-mb"], ["--file-mb"]):
        if argv[0] == "--memory-mb":
            memory_mb = int(argv[1])
        else:
            file_mb = int(argv[1])
        argv = argv[2:]
    if file_mb:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2**20, file_mb * 2**20))
    if memory_mb and os.environ.get("COURSE_MODE") == "cpu":
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.environ.pop("COURSE_SANDBOX", None):
        # In the sandbox's PID namespace the grader's PID means nothing (ipykernel would
        # think its parent gone, since its parent is PID 1); bwrap --die-with-parent does
        # that job instead.
        os.environ.pop("JPY_PARENT_PID", None)
    fonts = os.environ.pop("COURSE_FONTS", None)
    if fonts and os.path.isdir(fonts) and os.environ.get("MPLCONFIGDIR"):
        # matplotlib's list of the machine's fonts, made by the grader: without it the
        # kernel's first plot looks at every font on the machine again (0.3 s a kernel).
        import shutil

        os.makedirs(os.environ["MPLCONFIGDIR"], exist_ok=True)
        for name in os.listdir(fonts):
            shutil.copy(os.path.join(fonts, name), os.environ["MPLCONFIGDIR"])
    import faulthandler

    faulthandler.enable()  # a segfault prints "Fatal Python error" and a traceback to the log
    if collect:
        from helpers.grading import clean_run

        clean_run.main()
        return
    from ipykernel.kernelapp import launch_new_instance

    # No input history: nobody reads it back, and the kernel skips making its database.
    sys.argv = [sys.argv[0], *argv, "--HistoryManager.enabled=False"]
    launch_new_instance()


if __name__ == "__main__":
    main(sys.argv[1:])
