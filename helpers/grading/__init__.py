"""Assignments and grading: immediate feedback in the notebook, and a grader for instructors.

* :mod:`.registry`: parts and assignments (found in :mod:`.assignments`); collecting raw
  results where the learner's code is; judging them; the ``check_*`` calls.
* :mod:`.assignments`: one module per graded lesson topic (``vector_add`` grades 03): its
  parts and ``check_*`` functions; its answer formulas beside it in ``keys_<topic>``.
* :mod:`.harness`: one harness for every graded kernel: trials on seeded inputs, watched
  by :mod:`helpers.bounds`, and the standard verdicts.
* :mod:`.static`: what the grader reads in a notebook's source before trusting a run.
* :mod:`.answers`: answer keys, exact (instructor) or sealed (student release).
* :mod:`.grader` runs the cells (``./course grade PATH ...``), :mod:`.parts` collects and
  judges the parts; :mod:`.session`, :mod:`.kernel_launcher` and :mod:`.sandbox`: a fresh,
  capped, sandboxed kernel process per submission that survives hangs and crashes.
* :mod:`.clean` and :mod:`.clean_run`: the clean process that collects what is judged (the
  notebook's definitions only, the course imported first), guarded by :mod:`.policy`;
  :mod:`.gpu`: the GPU's turns, alone for a timing.
* :mod:`.reuse` and :mod:`.similarity`: the course's own code deciding a graded part
  (calls, device functions, kernels copied up to renaming): that part scores 0.
* :mod:`.report`: the table, the JSON report and the CSV gradebook.
* :mod:`.build`: ``./course build-assignments``; :mod:`.release`: ``./course release DIR``.
"""

from .. import fast_start  # noqa: F401 - before nbformat: skips a grammar nobody uses
