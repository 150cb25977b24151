"""One harness for every graded kernel: run the learner's function, record, judge.

An assignment describes its graded function as a :class:`KernelTask`: how to make the
inputs of one trial from a seed, which trials to run (sizes around the learner's own
block sizes, and the edge inputs every kernel must meet), the reference, and how to
compare with hints that name the usual mistakes. The harness does the rest, once for
all assignments:

* :func:`collect` runs in the learner's process. Each trial calls the learner's function
  under :mod:`helpers.bounds`: it records which Triton kernels the call launched (the
  notebook's own, the course's, none), every load or store outside a tensor, which
  elements of each output the notebook's kernel stored and whether the launcher changed
  them afterwards, an exception, and the outputs themselves. On a GPU the kernels run in
  the interpreter for this (where every access can be watched), then compiled on larger
  shapes. It decides nothing.
* :class:`Verdict` is made from those raw results wherever the judge runs: it remakes
  each trial's inputs from the seed, computes the reference and names the first problem.
  The standard messages (raised, not implemented, no kernel of yours, not written by your
  kernel, out of bounds, compiled run) live here; an assignment adds only its hints.

The package keeps the two sides of that line apart: :mod:`.task` (what an assignment
describes), :mod:`.collect` (run in the learner's process) and :mod:`.judge` (run in
the grader's).
"""

from __future__ import annotations

from .collect import collect, run_trial  # noqa: F401
from .judge import Trial, Verdict, close_hint, finite_or_nan, number_part, verdict_of  # noqa: F401
from .task import Case, KernelTask, dtype_name, generator, loops_unwatchable  # noqa: F401
