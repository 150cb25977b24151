"""Assignments and grading: immediate feedback in the notebook, and a grader for instructors.

* :mod:`.registry`: each assignment's graded parts (points, the names they read, the check).
* one module per graded assignment (:mod:`.vector_add` for 03, ...): its parts and the
  ``check_*`` functions its notebook calls.
* :mod:`.bounds`: watching kernels run: which kernels a call launched, and a bounds guard
  for interpreted kernels (a missing mask shows up as a named out-of-bounds access).
* :mod:`.session`, :mod:`.kernel_launcher`: a fresh, memory-capped kernel process per
  submission, with time limits, that survives hangs and crashes.
* :mod:`.grader`: ``./course grade PATH ...`` (one notebook, or a folder in parallel).
* :mod:`.report`: the table, the JSON report and the CSV gradebook.
* :mod:`.build`: ``./course build-assignments``, assignments/ from solutions/.
"""
