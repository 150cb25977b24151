"""``./course leaderboard SUBMISSIONS``: the class's graded kernels, raced on one GPU.

    ./course leaderboard submissions/ --assignment 03_vector_add_intensity --rounds 7

For each submission of the assignment, a clean collection process (:mod:`.clean`: the
notebook's definitions only, the course imported first, sandboxed) is started and kept
for the race. Then:

1. **Re-checked on fresh inputs**: the graded function runs on the assignment's first
   trial and on the race's input (:meth:`~helpers.grading.harness.KernelTask.race`), made
   from a seed drawn now; the outputs are judged here as the grader judges them. A wrong
   answer, no kernel of the notebook's own, or the course's code doing the work (calls,
   a course device function, a course kernel pasted: :mod:`.reuse`) takes it off the
   board, with the reason.
2. **Timed in interleaved rounds**: each round times every remaining submission once, in
   a new order, with ``triton.testing.do_bench`` (its median over ~100 ms of calls), each
   timing alone on the GPU (:mod:`.gpu`). A submission's time is the median of its
   rounds; the spread (lowest to highest round) is shown beside it.
3. **Ranked** in ``<out>/<assignment>/leaderboard.md`` and ``leaderboard.html`` beside the
   gradebook: the GPU the times come from (named by the processes that ran them), the
   input, the rounds and the date. In CPU mode the times are Triton's interpreter's on a
   small input, and the page says so: a check of the plumbing, not a race.

At most :data:`AT_ONCE` processes are alive at a time: a larger class races in groups of
that size, each group's rounds interleaved (the page says how many groups there were).
"""

from __future__ import annotations

import argparse
import datetime
import html
import importlib
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import registry

AT_ONCE = 16


# --------------------------------------------------------------------------------------
# In the clean process (called by :mod:`.clean_run` for a "race" request).
# --------------------------------------------------------------------------------------


def task_of(name: str):
    """The assignment's graded kernel (its module's ``TASK``), or None."""
    return getattr(importlib.import_module(registry.modules()[name]), "TASK", None)


def serve(spec, request: dict, namespace: dict) -> dict:
    """A "check" (the first trial and the race input, as raw trials) or a "time" (one
    timing of the race input, in ms)."""
    import torch
    import triton.testing

    from .. import bounds, runtime
    from . import harness, policy

    task = task_of(spec.name)
    fn = namespace.get(task.function) if task is not None else None
    fn = task.entry(namespace) if callable(fn) else None
    if not callable(fn):
        return {"error": f"`{getattr(task, 'function', '?')}` is not defined"}
    seed, device = int(request["seed"]), runtime.device()
    race = task.race()
    if request["race"] == "check":
        cases = {c.label: c for c in (task.first(), race)}
        with bounds.watch(guard=False) as log:
            trials = [harness.run_trial(task, fn, namespace, c.seeded(seed), log,
                                        "cuda" if c.compiled else device)
                      for c in cases.values()]
        name = torch.cuda.get_device_name() if runtime.is_gpu() else "CPU (Triton's interpreter)"
        return {"trials": registry.encode(trials), "device": name,
                "kernels": policy.learner_kernels(namespace), "case": race.label}
    inputs = task.inputs(race.seeded(seed), "cuda" if race.compiled else device)
    try:
        fn(*inputs)                                   # compiled, warm
        if runtime.is_gpu():
            torch.cuda.synchronize()
            return {"ms": float(triton.testing.do_bench(lambda: fn(*inputs),
                                                        return_mode="median"))}
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - start) * 1e3)
        return {"ms": statistics.median(times)}
    except Exception as err:  # noqa: BLE001 - the learner's failure, reported
        return {"error": f"{type(err).__name__}: {str(err)[:200]}"}


# --------------------------------------------------------------------------------------
# In the grader's process.
# --------------------------------------------------------------------------------------


@dataclass
class Entry:
    student: str
    notebook: str
    problem: str = ""                       # why it is off the board, if it is
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("inf")


def _cells(path: Path) -> list[tuple[int, str]]:
    import nbformat

    from .sandbox import read_regular_file

    nb = nbformat.reads(read_regular_file(path).decode("utf-8", errors="replace"),
                        as_version=4)
    code = [c for c in nb.cells if c.get("cell_type") == "code"]
    return [(i + 1, c.get("source", "")) for i, c in enumerate(code)]


def _check(entry: Entry, collector, task, limits, seed: int) -> dict:
    """Fresh inputs, judged here; sets ``entry.problem`` when it fails. Returns the reply."""
    from .harness import Verdict
    from .reuse import problem

    reply = collector.ask({"race": "check", "seed": seed}, limits.part_timeout)
    data = reply.data if reply.kind == "race" else None
    if data is None or "error" in data or "tampered" in data:
        entry.problem = (reply.text or (data or {}).get("error")
                         or "the notebook changes the course's code")
        return {}
    raw = {"trials": registry.decode(data["trials"]), "unwatched": None}
    verdict = Verdict(task, raw)
    bad = next((t for t in verdict.trials if t.problem), None)
    if bad is not None:
        entry.problem = f"{bad.where}: {bad.problem}"
        return data
    part = registry.Part("race", "race", 0, lambda raw: None, (task.function,))
    reused = problem(part, {"raw": raw, "kernels": data.get("kernels")}, reply.calls,
                     collector.statement_calls, collector.assignment)
    entry.problem = reused or ""
    return data


def race(notebooks, assignment: str, *, rounds: int = 5, mode: str | None = None,
         limits=None, log=print) -> tuple[list[Entry], dict]:
    """Check, time and rank ``(path, student)`` pairs; the entries (ranked) and facts."""
    import tempfile

    from .. import runtime
    from . import gpu
    from .clean import CleanCollector
    from .grader import Limits, _remove

    mode, limits = mode or runtime.MODE, limits or Limits()
    task = task_of(assignment)
    if task is None:
        raise SystemExit(f"leaderboard: {assignment} has no graded kernel to race")
    spec = registry.get(assignment)
    seed = secrets.randbits(31)
    facts = {"device": "", "case": task.race().label, "rounds": rounds, "groups": 0,
             "mode": mode, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}
    entries = [Entry(student, str(path)) for path, student in notebooks]
    for group in range(0, len(entries), AT_ONCE):
        facts["groups"] += 1
        racing: list[tuple[Entry, CleanCollector, str]] = []
        try:
            for entry in entries[group:group + AT_ONCE]:
                tmp = tempfile.mkdtemp(prefix="course-race-")
                try:
                    cells = _cells(Path(entry.notebook))
                except Exception as err:  # noqa: BLE001 - that student's problem only
                    entry.problem = f"could not read the notebook ({type(err).__name__})"
                    _remove(tmp)
                    continue
                collector = CleanCollector(spec.name, cells, cwd=tmp, mode=mode,
                                           limits=limits)
                racing.append((entry, collector, tmp))
                started = collector.start()
                if started.kind != "defined":
                    entry.problem = f"could not start: {started.text}"
                    continue
                data = _check(entry, collector, task, limits, seed)
                facts["device"] = facts["device"] or data.get("device", "")
                log(f"leaderboard: {entry.student}: {entry.problem or 'correct'}")
            timed = [(e, c) for e, c, _ in racing if not e.problem]
            for r in range(rounds):
                order = timed[r % len(timed):] + timed[:r % len(timed)] if timed else []
                for entry, collector in order:
                    if entry.problem:
                        continue
                    with gpu.alone(limits.cell_timeout + limits.part_timeout) \
                            if mode == "gpu" else _nothing():
                        reply = collector.ask({"race": "time", "seed": seed},
                                              limits.part_timeout)
                    ms = (reply.data or {}).get("ms") if reply.kind == "race" else None
                    if isinstance(ms, float) and ms > 0:
                        entry.times.append(ms)
                    else:
                        entry.problem = (f"timing failed: {(reply.data or {}).get('error')}"
                                         if reply.kind == "race" else reply.text)
        finally:
            for _, collector, tmp in racing:
                collector.stop()
                _remove(tmp)
    entries.sort(key=lambda e: (bool(e.problem), e.median, e.student))
    return entries, facts


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def to_markdown(entries: list[Entry], facts: dict, assignment: str) -> str:
    ranked = [e for e in entries if not e.problem]
    best = ranked[0].median if ranked else None
    how = ("`triton.testing.do_bench` (its median)" if facts["mode"] == "gpu"
           else "three calls (their median)")
    lines = [f"# Leaderboard: {assignment}", "",
             f"Timed on **{facts['device'] or 'no device'}**, {facts['date']}: input "
             f"{facts['case']}, {facts['rounds']} interleaved rounds, each a timing by {how}, "
             f"{len(entries)} submissions"
             + (f" in {facts['groups']} groups" if facts["groups"] > 1 else "") + ".", ""]
    if facts["mode"] == "cpu":
        lines += ["**CPU mode**: these are the times of Triton's interpreter on a small input, "
                  "a check of the plumbing, not of the kernels' speed. Run it on a GPU.", ""]
    lines += ["| rank | student | median ms | lowest-highest ms | vs best |",
              "|---:|---|---:|---:|---:|"]
    for rank, e in enumerate(ranked, 1):
        lines.append(f"| {rank} | {e.student} | {e.median:.4g} | {min(e.times):.4g}-"
                     f"{max(e.times):.4g} | {e.median / best:.2f}x |")
    off = [e for e in entries if e.problem]
    if off:
        lines += ["", "Not ranked:", ""]
        lines += [f"- {e.student}: {e.problem}" for e in off]
    return "\n".join(lines) + "\n"


def to_html(markdown: str) -> str:
    """The Markdown page as a plain HTML page (a table and lists, nothing else)."""
    body, rows = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue
            tag = "th" if not rows else "td"
            rows.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if rows:
            body.append("<table>" + "".join(rows) + "</table>")
            rows = []
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line:
            body.append(f"<p>{html.escape(line).replace('**', '')}</p>")
    if rows:
        body.append("<table>" + "".join(rows) + "</table>")
    return ("<!doctype html><meta charset='utf-8'><title>Leaderboard</title><style>"
            "td,th{padding:2px 8px;text-align:right}</style>" + "\n".join(body) + "\n")


def main(argv: list[str] | None = None) -> int:
    from .grader import DEFAULT_OUT, find_notebooks

    parser = argparse.ArgumentParser(prog="./course leaderboard",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of them")
    parser.add_argument("--assignment", required=True, choices=sorted(registry.MODULES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the page goes to <out>/<assignment>/leaderboard.md and .html")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    notebooks = find_notebooks(args.paths)
    if not notebooks:
        print("leaderboard: no notebooks found", file=sys.stderr)
        return 2
    entries, facts = race(notebooks, args.assignment, rounds=args.rounds)
    page = write_page(entries, facts, args.assignment, args.out)
    print(page.read_text(encoding="utf-8"))
    print(f"leaderboard: wrote {page} and leaderboard.html")
    return 0


def write_page(entries, facts, assignment: str, out: Path) -> Path:
    """``<out>/<assignment>/leaderboard.md`` and ``.html``, beside the gradebook."""
    folder = Path(out) / assignment
    folder.mkdir(parents=True, exist_ok=True)
    page = to_markdown(entries, facts, assignment)
    (folder / "leaderboard.md").write_text(page, encoding="utf-8", errors="replace")
    (folder / "leaderboard.html").write_text(to_html(page), encoding="utf-8", errors="replace")
    return folder / "leaderboard.md"


if __name__ == "__main__":
    sys.exit(main())
