"""Flags for the instructor: a submission that is the solution, whatever its score.

* **markers**: a cell still holds a solution marker (:data:`MARKERS`, those of
  :mod:`.build`: the solution notebook handed in, or pasted from);
* **match**: the notebook's code holds at least :data:`MATCH` of the solution's answer lines
  (the code lines inside the marked regions of ``solutions/<assignment>.ipynb``), in order,
  once each line is normalised: comments, blank lines and spacing aside. The blank
  assignment holds none of them, and a learner's own code rarely more than a few.

A flag takes no point: it is a note in the JSON report, a column of the gradebook and a
line of the table. The solutions exist in the instructor's course only; a student release
grading itself looks for the markers alone.
"""

from __future__ import annotations

import difflib
import functools
import io
import re
import tokenize
from pathlib import Path

# :mod:`.build`'s BEGIN and END (which stays home), not spelled out: a release holds neither.
MARKERS = tuple(f"### {word} SOLUTION" for word in ("BEGIN", "END"))
MATCH = 0.9
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def normalised(source: str) -> dict[int, str]:
    """``{line number: the line without comments, its spacing collapsed}`` of ``source``,
    blank lines and IPython's magics and shell lines left out."""
    lines = source.splitlines()
    try:       # comments by the tokenizer (a '#' in a string stays); else by a plain cut
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, SyntaxError, ValueError, IndexError, RecursionError):
        lines = [re.sub(r"#.*", "", line) for line in source.splitlines()]
    out = {}
    for number, line in enumerate(lines, 1):
        text = " ".join(line.split())
        if text and not text.startswith(("%", "!")):
            out[number] = text
    return out


@functools.lru_cache(maxsize=16)
def _answer_lines(path: str, mtime: float) -> tuple[str, ...]:
    """The normalised code lines inside the solution regions of the notebook at ``path``."""
    import nbformat

    from . import build           # instructor's side only, as the solutions are

    out = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.get("cell_type") == "code":
            inside = build.solution_lines(cell.source)
            out += [text for number, text in normalised(cell.source).items() if number in inside]
    return tuple(out)


def solution_flags(nb, assignment: str, solutions: Path = SOLUTIONS) -> tuple[list, list]:
    """``(flags, notes)`` of the notebook ``nb`` (an nbformat node) of ``assignment``: short
    flags for the gradebook and the table, and a note each for the report."""
    flags, notes = [], []
    cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    sources = [c.get("source") if isinstance(c.get("source"), str) else "" for c in cells]
    if any(m in text for text in sources for m in MARKERS):
        flags.append("solution markers")
        notes.append(f"the notebook still holds the solution markers ({' / '.join(MARKERS)}): "
                     "it is the solution notebook, or pasted from it (a flag for the "
                     "instructor; no points were taken)")
    path = Path(solutions) / f"{assignment}.ipynb"
    if not path.is_file():
        return flags, notes
    answer = _answer_lines(str(path), path.stat().st_mtime)
    code = [text for c, source in zip(cells, sources) if c.get("cell_type") == "code"
            for text in normalised(source).values()]
    if not answer or not code:
        return flags, notes
    blocks = difflib.SequenceMatcher(None, answer, code, autojunk=False).get_matching_blocks()
    share = sum(b.size for b in blocks) / len(answer)
    if share >= MATCH:
        flags.append(f"matches the solution ({share:.0%})")
        notes.append(f"its code holds {share:.0%} of the answer lines of "
                     f"solutions/{path.name}, comments and spacing aside: a copy of the "
                     "solution? (a flag for the instructor; no points were taken)")
    return flags, notes
