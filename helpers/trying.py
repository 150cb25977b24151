"""Trying a kernel before checking it: ``with helpers.guarded(): ...`` in a "try it" cell.

In CPU mode every kernel runs in Triton's interpreter, which reads and writes raw host
addresses. A kernel without a mask reads past the end of its tensors and, worse, *stores*
past them: the stray stores overwrite ``malloc``'s bookkeeping next to the tensor, and the
notebook's kernel process dies a little later ("The kernel appears to have died"), taking
every variable of the session with it. ``check_*`` calls never crash like that: they run the
learner's kernel under the bounds guard of :mod:`helpers.bounds`. A try cell gets the same
protection from :class:`guarded`::

    with helpers.guarded():
        c = vector_add(a, b)
    print("vector_add matches a + b:", torch.equal(c, a + b))

* **CPU mode**: every launch in the block is watched. A load or store outside the tensor
  its pointer came from is *not performed* (as if masked off), so nothing is corrupted and
  the session survives; when the block ends, :class:`OutOfBounds` says which kernel, which
  program, which tensor and which indices, and what the likely fix is (a missing mask).
  The cell stops there, before anything prints a result computed by a broken kernel.
* **GPU mode**: the block runs the kernels compiled, as they are, unwatched (a compiled
  kernel cannot be watched without running it again in the interpreter). An access out of
  bounds there reads junk or overwrites a neighbouring tensor without a word; the
  ``check_*`` calls watch the kernel in the interpreter and report it.

An exception raised in the block (a stub's ``NotImplementedError``, an error in the
kernel) goes through unchanged, with a note of any out-of-bounds access seen before it.
"""

from __future__ import annotations

import warnings
from collections import Counter

from . import bounds, runtime

MASK_HINT = (
    "Likely fix: a mask. The last block (or tile) hangs over the end of the tensor: compute "
    "`mask = offsets < n_elements` (for a 2-D tile, one condition per edge: rows < M & "
    "columns < N) and pass `mask=mask` to every tl.load (with `other=0.0`) and tl.store "
    "that can reach past it. An index before the start means an offset went negative.")

AFTERMATH = (
    "Nothing was overwritten: the guard skipped these accesses (as if masked off) and your "
    "variables are intact, but this launch's results are not to be trusted. Unguarded, such "
    "stores overwrite the memory beside the tensor and can kill the notebook's kernel "
    "process (CPU mode) or silently corrupt a neighbouring tensor (GPU).")

SHOWN = 6   # distinct bad accesses listed in full; the rest are counted


class OutOfBounds(RuntimeError):
    """A kernel launched in a :class:`guarded` block reached outside its tensors.

    ``launches`` holds the :class:`helpers.bounds.Launch` records of the launches that did,
    each with its :class:`helpers.bounds.Violation` list.
    """

    def __init__(self, message: str, launches: list):
        super().__init__(message)
        self.launches = launches

    @property
    def violations(self) -> list:
        return [v for launch in self.launches for v in launch.violations]


def describe(launches: list, hint: str | None = None) -> str:
    """What went wrong in ``launches`` (those with violations), for a learner to read."""
    kernels = list(dict.fromkeys(launch.name for launch in launches))
    violations = [(launch.name, v) for launch in launches for v in launch.violations]
    ops = sorted({"read" if v.op == "load" else "wrote" for _, v in violations})
    their = "its" if len(kernels) == 1 else "their"
    lines = [f"{' and '.join(kernels)} {' and '.join(ops)} outside {their} tensors "
             f"({len(violations)} out-of-bounds "
             f"{'access' if len(violations) == 1 else 'accesses'} stopped, in "
             f"{len(launches)} {'launch' if len(launches) == 1 else 'launches'}):"]
    # One line per (kernel, operation, tensor): the first such access, and how many more.
    groups = Counter((name, v.op, v.arg) for name, v in violations)
    first = {}
    for name, v in violations:
        first.setdefault((name, v.op, v.arg), v)
    for key, v in list(first.items())[:SHOWN]:
        more = groups[key] - 1
        prefix = f"{key[0]}: " if len(kernels) > 1 else ""
        lines.append(f"  * {prefix}{v.describe()}"
                     + (f" (and {more} more {'such access' if more == 1 else 'such accesses'})"
                        if more else ""))
    if len(first) > SHOWN:
        lines.append(f"  * ... and {len(first) - SHOWN} more tensors or operations")
    lines.append(hint or MASK_HINT)
    lines.append(AFTERMATH)
    return "\n".join(lines)


class guarded:
    """Watch the kernel launches of a ``with`` block (CPU mode); see the module's text.

    ``with helpers.guarded() as g:`` gives this object: ``g.watched`` says whether the
    launches were watched (CPU mode), ``g.launches`` lists them (kernel names in
    ``launch.name``). ``hint`` replaces the generic advice on masks.
    """

    def __init__(self, hint: str | None = None):
        self.hint = hint
        self.watched = False
        self._watch = None
        self._log = None

    @property
    def launches(self) -> list:
        return list(self._log.launches) if self._log is not None else []

    def __enter__(self) -> "guarded":
        if runtime.is_gpu():
            return self              # compiled kernels run as they are, unwatched
        if not bounds.guard_available():
            warnings.warn("this Triton's interpreter lacks the hooks of the bounds guard: "
                          "the launches in this block run unwatched", stacklevel=2)
        self._watch = bounds.watch(guard=True)
        self._log = self._watch.__enter__()
        self.watched = bounds.guard_available()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._watch is None:
            return False
        watch, self._watch = self._watch, None
        watch.__exit__(None, None, None)
        bad = [launch for launch in self._log.launches if launch.violations]
        if not bad:
            return False
        message = describe(bad, self.hint)
        if exc is not None:          # the block's own error comes first; the report with it
            exc.add_note("Before this error: " + message)
            return False
        raise OutOfBounds(message, bad) from None
