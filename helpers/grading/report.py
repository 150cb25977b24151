"""What the grader says about a submission: a table for people, JSON and CSV for files,
and a Markdown page of feedback for the learner (beside each JSON report).

A :class:`Report` holds one row per graded part (points, status, message) and one per
code cell that did not finish cleanly. Points count only parts that could be graded
here: a part that needs a GPU, graded in CPU mode, is listed as "needs a GPU" and left
out of both the score and the maximum. Flags (:mod:`.flags`: the solution handed in) and
notes are for the instructor: the JSON, the table and the gradebook show them, the
learner's page does not.

Every writer survives text that cannot be encoded (a lone surrogate in an exception's
message or a folder's name): :func:`clean` replaces it with ``?``.
"""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Part statuses, in the words the reports use.
PASSED, FAILED, NOT_IMPLEMENTED = "passed", "failed", "not implemented"
NEEDS_GPU, ERROR, TIMED_OUT, CRASHED = "needs a GPU", "error", "timed out", "crashed"
# This machine cannot grade the part (its Triton cannot watch a kernel, say): like a part
# that needs a GPU in CPU mode, it is left out of the score and the maximum, and says why.
UNCHECKED = "not checked here"


@dataclass
class PartResult:
    key: str
    title: str
    points: float
    max_points: float
    status: str
    message: str
    seconds: float = 0.0

    @property
    def counted(self) -> bool:
        return self.status not in (NEEDS_GPU, UNCHECKED)


@dataclass
class CellResult:
    """A code cell that raised, ran out of time or took the kernel down with it."""

    number: int            # 1-based among the notebook's code cells
    status: str            # "error", "timeout", "died"
    ename: str
    evalue: str
    first_line: str
    seconds: float = 0.0

    def what(self) -> str:
        if self.status == "error":
            return f"raised {self.ename}" + (f": {self.evalue}" if self.evalue else "")
        if self.status == "timeout":
            return f"was {self.evalue}" if self.evalue.startswith("stopped") else self.evalue
        if self.status == "died":
            return f"crashed the kernel ({self.evalue})"
        return self.status

    def describe(self) -> str:
        return f"code cell {self.number} ({self.first_line!r}) {self.what()}"


@dataclass
class Report:
    notebook: str
    student: str
    assignment: str
    mode: str
    parts: list[PartResult] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""                       # the notebook could not be graded at all
    limits: dict = field(default_factory=dict)
    # How the submission's kernel was isolated: "bubblewrap 0.8.0", or "none: <why>".
    isolation: str = ""
    notes: list = field(default_factory=list)   # for the instructor; they cost no points
    flags: list = field(default_factory=list)   # short, for the gradebook (:mod:`.flags`)

    @property
    def isolated(self) -> bool:
        return bool(self.isolation) and not self.isolation.startswith("none")

    @property
    def score(self) -> float:
        return sum(p.points for p in self.parts if p.counted)

    @property
    def max_score(self) -> float:
        return sum(p.max_points for p in self.parts if p.counted)

    @property
    def pending_gpu_points(self) -> float:
        return sum(p.max_points for p in self.parts if not p.counted)

    @property
    def percent(self) -> float:
        return 100.0 * self.score / self.max_score if self.max_score else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(score=self.score, max_score=self.max_score, percent=round(self.percent, 1),
                   pending_gpu_points=self.pending_gpu_points)
        return _cleaned(out)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A report back from :meth:`to_dict` (the derived totals are recomputed)."""
        return cls(data["notebook"], data["student"], data["assignment"], data["mode"],
                   parts=[PartResult(**p) for p in data.get("parts", [])],
                   cells=[CellResult(**c) for c in data.get("cells", [])],
                   seconds=data.get("seconds", 0.0), error=data.get("error", ""),
                   limits=data.get("limits", {}), isolation=data.get("isolation", ""),
                   notes=list(data.get("notes", [])), flags=list(data.get("flags", [])))

    def write_json(self, path: Path) -> Path:
        return _write(path, self.to_json() + "\n")

    def summary_line(self) -> str:
        pending = (f", {_n(self.pending_gpu_points)} more on a GPU"
                   if self.pending_gpu_points else "")
        flagged = f"  [FLAGGED: {'; '.join(self.flags)}]" if self.flags else ""
        if self.error:
            return clean(f"{self.student}: not graded: {self.error}{flagged}")
        return clean(f"{self.student}: {_n(self.score)} / {_n(self.max_score)} points "
                     f"({self.percent:.0f}%{pending}){flagged}")

    def to_text(self, width: int = 100) -> str:
        head = [f"{self.assignment}: {self.notebook}",
                f"{self.summary_line()}  [{self.mode.upper()} mode, {self.seconds:.0f} s]"]
        if self.isolation and not self.isolated:
            head.append(f"WARNING: graded WITHOUT isolation ({self.isolation})")
        if self.flags:
            head.append(f"FLAGGED for the instructor: {'; '.join(self.flags)}")
        if self.error:
            return clean("\n".join(head))
        key_w = max(4, *(len(p.key) for p in self.parts))
        title_w = max(5, *(len(p.title) for p in self.parts))
        status_w = max(6, *(len(p.status) for p in self.parts))
        left = key_w + title_w + 9 + status_w + 6
        lines = head + ["", f"{'part':<{key_w}}  {'title':<{title_w}}  {'points':>7}  "
                        f"{'status':<{status_w}}  message"]
        lines.append("-" * min(width, left + 40))
        for p in self.parts:
            pts = f"{_n(p.points)}/{_n(p.max_points)}"
            wrapped = textwrap.wrap(p.message, max(30, width - left)) or [""]
            lines.append(f"{p.key:<{key_w}}  {p.title:<{title_w}}  {pts:>7}  "
                         f"{p.status:<{status_w}}  {wrapped[0]}")
            lines += [" " * left + w for w in wrapped[1:]]
        lines.append("-" * min(width, left + 40))
        lines.append(f"{'total':<{key_w + title_w + 2}}  "
                     f"{_n(self.score) + '/' + _n(self.max_score):>7}")
        if self.notes:
            lines += ["", "Notes for the instructor:"]
            lines += ["  " + textwrap.shorten(n, width - 2) for n in self.notes]
        if self.cells:
            lines += ["", "Cells that did not finish:"]
            lines += ["  " + textwrap.shorten(c.describe(), width - 2) for c in self.cells]
        return clean("\n".join(lines))

    __str__ = to_text

    def to_markdown(self) -> str:
        """The learner's feedback as Markdown: the score, a table of the parts, what each
        part said, and the cells that did not finish. The instructor's notes (copy and
        tampering flags, isolation) stay out of it: they are in the JSON and the gradebook."""
        title = f"# {_md(self.assignment)}: feedback for {_md(self.student)}"
        if self.error:
            return clean(f"{title}\n\nThis notebook could not be graded: {_md(self.error)}."
                         "\n\nAsk your instructor; no points could be given.\n")
        pending = (f" {_n(self.pending_gpu_points)} more points are graded on a GPU."
                   if self.pending_gpu_points else "")
        lines = [title, "", f"**{_n(self.score)} / {_n(self.max_score)} points** "
                 f"({self.percent:.0f}%), graded in {self.mode.upper()} mode.{pending}", "",
                 "| part | what | points | result |", "|---|---|---:|---|"]
        for p in self.parts:
            pts = f"{_n(p.points)} / {_n(p.max_points)}" if p.counted else "-"
            lines.append(f"| {_md(p.key)} | {_md(p.title)} | {pts} | {_md(p.status)} |")
        lines += [f"| **total** | | **{_n(self.score)} / {_n(self.max_score)}** | |", "",
                  "## What each part says", ""]
        for p in self.parts:
            mark = "✅" if p.status == PASSED else "⏳" if not p.counted else "❌"
            said = _md(p.message) or "no message"
            status = "" if said.startswith(p.status) else f" ({_md(p.status)})"
            lines.append(f"- {mark} **{_md(p.key)} {_md(p.title)}**{status}: {said}")
        if self.cells:
            lines += ["", "## Cells that did not finish", ""]
            lines += [f"- {_md(c.describe())}" for c in self.cells]
        return clean("\n".join(lines) + "\n")

    def write_markdown(self, path: Path) -> Path:
        return _write(path, self.to_markdown())


def clean(text) -> str:
    """``text`` as UTF-8 can write it: a lone surrogate (``"\\udcff"`` in an exception's
    message, a folder name the file system could not decode) becomes ``?``."""
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _cleaned(obj):
    """Every string in ``obj`` (dicts, lists) :func:`clean`."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {_cleaned(k): _cleaned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_cleaned(v) for v in obj]
    return obj


def _write(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(clean(text), encoding="utf-8", errors="replace")
    return path


def _n(x: float) -> str:
    return f"{x:g}"


def _md(text) -> str:
    """``text`` safe inside a Markdown table cell or list item: one line, no HTML, no cell
    breaks (messages quote the learner's code and errors)."""
    text = " ".join(str(text).split())
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|")):
        text = text.replace(a, b)
    return text


def read_json(path: Path) -> Report:
    return Report.from_dict(json.loads(Path(path).read_text(encoding="utf-8", errors="replace")))


def write_gradebook(reports: list[Report], path: Path) -> Path:
    """One row per submission: totals, points per part, flags, and what went wrong."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(p.key for r in reports for p in r.parts))
    with path.open("w", newline="", encoding="utf-8", errors="replace") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "assignment", "mode", "score", "max_score",
                    "percent", *[f"part {k}" for k in keys], "flags", "notes", "isolation"])
        for r in sorted(reports, key=lambda r: r.student):
            by_key = {p.key: p for p in r.parts}
            cells = [p for p in keys if p in by_key]
            notes = [r.error] if r.error else []
            if r.isolation and not r.isolated:
                notes.append(f"NOT ISOLATED ({r.isolation})")
            notes += [c.describe() for c in r.cells]
            notes += r.notes
            graded = bool(r.parts)     # an unreadable, unidentified notebook has no parts
            w.writerow(_cleaned([
                r.student, r.notebook, r.assignment, r.mode,
                *((_n(r.score), _n(r.max_score), f"{r.percent:.1f}") if graded
                  else ("", "", "")),
                *[(_n(by_key[k].points) if by_key[k].counted else
                   "GPU" if by_key[k].status == NEEDS_GPU else "n/a")
                  if k in cells else "" for k in keys],
                "; ".join(r.flags), "; ".join(notes), r.isolation]))
    return path


def report_path(out: Path, report: Report, taken: dict) -> Path:
    """``<out>/<assignment>/<student>.json``; a second notebook of the same student and
    assignment in this run gets ``<student>__2.json``."""
    folder = out / (report.assignment if report.assignment != "?" else "unidentified")
    path, n = folder / f"{report.student}.json", 1
    while path in taken and taken[path] != Path(report.notebook):
        n += 1
        path = folder / f"{report.student}__{n}.json"
    return path


def rebuild_gradebook(folder: Path) -> None:
    """``folder/gradebook.csv`` from every report in ``folder``: earlier runs' too (a late
    submission graded alone joins the class; a re-graded one replaces its old row). A file
    that is not a report is left out, and said; so is a gradebook that cannot be written."""
    reports = []
    for path in sorted(folder.glob("*.json")):
        try:
            reports.append(read_json(path))
        except Exception as err:  # noqa: BLE001 - not a report of ours
            say(f"course grade: {path} is left out of the gradebook: not a report "
                f"({type(err).__name__})", sys.stderr)
    try:
        say(f"Gradebook: {write_gradebook(reports, folder / 'gradebook.csv')}")
    except Exception as err:  # noqa: BLE001 - said; the reports are written
        say(f"course grade: could not write the gradebook of {folder}: "
            f"{type(err).__name__}: {err}", sys.stderr)


def say(text: str, stream=None) -> None:
    """Print ``text``, whatever the stream cannot encode replaced."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream, flush=True)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        print(text.encode(encoding, "replace").decode(encoding), file=stream, flush=True)
