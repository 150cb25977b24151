"""The course's performance report: every course kernel beside its baseline, one table per GPU.

Reference records -> Markdown. Each lesson's experiment (:mod:`helpers.experiments`)
times the course's kernels beside their baselines in one process, and ``./course record``
keeps the results with their provenance in ``helpers/records/``. This package reads those
records, and nothing else:

* :mod:`~helpers.performance.extractors`: one extractor per experiment, a record -> its
  representative rows (kernel, shape, ours, baseline, ratio, fraction of peak, verdicts);
* :mod:`~helpers.performance.targets`: the course's goals for those comparisons, each with
  where the course states it;
* :mod:`~helpers.performance.rows`: the rows, and the reader that names a missing field;
* here: the Markdown (one table per GPU, the GPU and each record's provenance in its
  heading) and README.md's section between :data:`BEGIN` and :data:`END`.

``python -m helpers.performance`` prints the report, ``--write`` rewrites the README's
section, ``--check`` exits 1 when that section is not what the committed records give.
``./course report`` runs ``./course record`` first on a GPU machine. (The name
``helpers.report`` is taken: ``helpers.report()`` prints the environment in every notebook.)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .. import hardware, records, syllabus
from .extractors import EXTRACTORS, NOT_REPORTED, TOPIC_OF, extract
from .rows import Fields, RecordFieldError, Row
from .targets import TARGETS, number

__all__ = ["BEGIN", "END", "EXTRACTORS", "NOT_REPORTED", "README", "RecordFieldError", "TARGETS",
           "extract", "load", "markdown", "replaced", "section", "main"]

README = syllabus.ROOT / "README.md"
BEGIN = ("<!-- performance report: generated from helpers/records/ by ./course report "
         "(helpers/performance/); do not edit by hand -->")
END = "<!-- end of the performance report -->"

INTRO = """\
Each course kernel beside its baseline on the lessons' shapes, read from the reference
records in `helpers/records/`. Each lesson's experiment (`helpers/experiments/`) checks
every version against a reference, then times ours and the baseline one after the other in
the same process, on the same inputs: each time is the median of `triton.testing.do_bench`'s
repeats, with the L2 cache flushed before each one (`helpers.bench.time_ms`). Lesson 04's
ladder keeps the faster of three such medians, taken in turn with cuBLAS. Where a record
keeps several rounds taken in turn (`helpers.bench.time_rounds`), a value is their median,
followed by their range in brackets; the other records keep one median per timing, not its
spread.

* **ours** and **baseline** are in the same unit. GB/s counts the bytes our kernel must move,
  for both columns; TFLOP/s counts the op's FLOPs.
* **ratio**: the baseline's time over ours. Above 1, ours is faster.
* **of peak**: ours as a fraction of the GPU's datasheet peak in `helpers.hardware` (HBM
  bandwidth, or the dense TFLOP/s of the dtype).
* **target**: the course's goal for that comparison, met or **missed** (sources below).

The rows are each lesson's representative shapes, geometric means where a goal covers a whole
sweep, and every row that misses a goal. Each GPU has its own table."""


def load(directory: Path = records.RECORDS_DIR) -> list[records.Record]:
    """Every record in ``directory``."""
    return [records.read(p) for p in sorted(Path(directory).glob("*__*.json"))]


def lesson_of(kind: str) -> str:
    """The number of the lesson whose notebook carries the topic of the record ``kind``."""
    topic = TOPIC_OF.get(kind, kind)
    return next((lesson.number for lesson in syllabus.LESSONS if topic in lesson.file), "--")


def _provenance(rec) -> Fields:
    return Fields(rec.provenance, f"the {rec.name} record", "provenance")


def by_gpu(recs) -> dict[str, list]:
    """Records grouped by GPU, the course's reference GPU first; each group in lesson order."""
    groups: dict[str, list] = {}
    for rec in recs:
        groups.setdefault(_provenance(rec)["gpu_key"], []).append(rec)
    rank = {g: i for i, g in enumerate(records.PREFERRED_GPUS)}
    return {g: sorted(groups[g], key=lambda r: (lesson_of(r.name), r.name in TOPIC_OF, r.name))
            for g in sorted(groups, key=lambda g: (rank.get(g, len(rank)), g))}


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _commit(p: Fields) -> str:
    commit = str(p["git_commit"])
    if re.fullmatch(r"[0-9a-f]{13,40}", commit):
        commit = commit[:12]
    dirty = "git_dirty" in p and p["git_dirty"] and "uncommitted" not in commit
    return f"`{commit}`" + (" with uncommitted changes" if dirty else "")


def _provenance_table(recs) -> list[str]:
    out = ["| record | lesson | date | commit | driver | CUDA | torch | triton |",
           "|---|---|---|---|---|---|---|---|"]
    for rec in recs:
        p = _provenance(rec)
        out.append(f"| `{rec.name}` | {lesson_of(rec.name)} | {p['date']} | {_commit(p)} | "
                   f"{p['driver']} | {p['cuda']} | {p['torch']} | {p['triton']} |")
    return out


def _ratio(r: Row) -> str:
    return "—" if r.ratio is None else f"{r.ratio:.2f}x"


def _peak(r: Row) -> str:
    if r.peak is None:
        return "—"
    return f"{100 * r.peak:.0f}%" if r.peak >= 0.01 else f"{100 * r.peak:.1f}%"


def _results_table(rows: list[tuple[str, Row]]) -> list[str]:
    out = ["| lesson | kernel | shape | ours | baseline | ratio | of peak | target |",
           "|---|---|---|--:|---|--:|--:|---|"]
    for lesson, r in rows:
        base = r.baseline if r.base is None else f"{r.baseline}: {r.base}"
        cells = (lesson, r.kernel, r.shape, "—" if r.ours is None else r.ours, base, _ratio(r),
                 _peak(r), "; ".join(map(str, r.verdicts)))
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def _peaks(gpu: str, rows: list[tuple[str, Row]]) -> str:
    spec = hardware.GPUS.get(gpu)
    if spec is None:
        return f"No fraction of peak: `{gpu}` is not in `helpers.hardware`'s table."
    dtypes = sorted({r.peak_of for _, r in rows} - {"", "HBM"})
    tflops = "".join(f", {number(spec.peak(d))} TFLOP/s {d}" for d in dtypes)
    return (f"Peaks: the {spec.name} of `helpers.hardware`, "
            f"{number(spec.hbm_bandwidth_gbs)} GB/s{tflops} (dense).")


def gpu_section(gpu: str, recs) -> str:
    """One GPU's heading, the provenance of its records, its peaks and its table; empty
    when none of its records has rows."""
    shown, rows = [], []
    for rec in recs:
        mine = extract(rec)
        if mine:
            shown.append(rec)
            rows += [(lesson_of(rec.name), r) for r in mine]
    if not rows:
        return ""
    names = " / ".join(sorted({_provenance(rec)["gpu"] for rec in shown}))
    return "\n".join([f"### {names} (`{gpu}`)", "", *_provenance_table(shown), "",
                      _peaks(gpu, rows), "", *_results_table(rows)])


def _legend(recs, used: set[str]) -> str:
    out = ["**Targets** judged above, and where the course states each:", ""]
    for key, t in TARGETS.items():
        if key in used:
            only = f" (judged on {', '.join(t.gpus)} only)" if t.gpus else ""
            out.append(f"* {t.described}{only}. Source: {t.source}.")
    kinds: dict[str, list[str]] = {}
    for rec in recs:
        if rec.name in NOT_REPORTED:
            kinds.setdefault(rec.name, []).append(_provenance(rec)["gpu_key"])
    if kinds:
        out += ["", "**Records not in the tables**, which time no course kernel beside a "
                "baseline:", ""]
        out += [f"* `{k}` ({', '.join(g)}): {NOT_REPORTED[k]}." for k, g in sorted(kinds.items())]
    return "\n".join(out)


def markdown(recs) -> str:
    """The whole report for ``recs``: the introduction, one section per GPU, the targets."""
    sections = [gpu_section(gpu, group) for gpu, group in by_gpu(recs).items()]
    sections = [s for s in sections if s] or ["No reference record has a course kernel "
                                              "beside a baseline yet."]
    used = {v.target for rec in recs for row in extract(rec) for v in row.verdicts}
    return "\n\n".join([INTRO, *sections, _legend(recs, used)])


def section(readme: str) -> str:
    """What ``readme`` holds between the two markers."""
    once = readme.count(BEGIN) == 1 and readme.count(END) == 1
    if not once or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"README.md must hold the line {BEGIN!r} once, and after it the line "
                         f"{END!r} once: the performance report goes between them")
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def replaced(readme: str, body: str) -> str:
    """``readme`` with ``body`` between the markers, the rest untouched."""
    section(readme)
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.performance",
                                     description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true",
                      help="rewrite the performance section of README.md")
    what.add_argument("--check", action="store_true",
                      help="exit 1 if README.md's performance section is out of date")
    args = parser.parse_args(argv)
    try:
        recs = load()
        body = markdown(recs)
    except RecordFieldError as err:
        print(f"performance report: {err}", file=sys.stderr)
        return 2
    readme = README.read_text()
    if args.check:
        if section(readme) != body:
            print("README.md's performance section is not what helpers/records/ gives: run "
                  "./course report --no-record and commit README.md", file=sys.stderr)
            return 1
        print("README.md's performance section is up to date")
    elif args.write:
        new = replaced(readme, body)
        if new != readme:
            README.write_text(new)
        print(f"README.md: performance section {'rewritten' if new != readme else 'unchanged'}"
              f", from {len(recs)} records in helpers/records/")
    else:
        print(body)
    return 0
