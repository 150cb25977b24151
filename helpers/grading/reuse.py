"""The course's own code used for a graded part: the part scores 0, with a note.

The clean collection process (:mod:`.clean_run`) reports three kinds of reuse, however the
course's code was reached (an alias, a default argument, an attribute, a copy):

* calls into an answer-bearing course function (the op families, the grader's own rules,
  the intensity models, ...) made with the notebook's code on the stack while a unit was
  collected, or while the statement that binds a graded name ran;
* a ``@triton.jit`` function of the notebook that calls one of the course's jitted
  functions (a device function counts as much as the launched kernel);
* a jitted function of the notebook, launched or called from the launched kernel, that is
  one of the course's up to renaming (:func:`helpers.grading.similarity.course_copy`).

A notebook may import the course and call it anywhere else (to plot, to compare, to time);
only what decides a graded part is read.
"""

from __future__ import annotations

# Course functions an assignment hands out (its text tells the learner to call them): a
# call to one is part of the exercise, not reuse.
HANDED_OUT = {
    "06_flash_attention": ("helpers.kernels.attention.forward_config",),
    # Triton's interpreter converts fp32 to fp8 wrongly: its kernels round first with this.
    # Part 3c measures the course's scaled matmul against its float64 spec: the part is
    # choosing the promotion from what they give, not the matmul.
    "09_fp8": ("helpers.kernels.fp8.quantize.round_to_format",
               "helpers.kernels.fp8.matmul.scaled_matmul",
               "helpers.kernels.fp8.matmul.scaled_matmul_reference"),
}


def _launched(raw) -> list[str]:
    names = []
    for trial in (raw.get("trials") or []) if isinstance(raw, dict) else []:
        if isinstance(trial, dict) and isinstance(trial.get("sources"), dict):
            names += [str(k) for k in trial["sources"]]
    return list(dict.fromkeys(names))


def problem(part, data: dict | None, calls, statement_calls: dict,
            assignment: str = "") -> str | None:
    """What of the course's code decided ``part``, in words for the learner, or None."""
    from .similarity import course_copy

    allowed = HANDED_OUT.get(assignment, ())
    used = [c for c in dict.fromkeys(calls) if c not in allowed]
    for name in part.names:
        used += [c for c in statement_calls.get(name, ()) if c not in used and c not in allowed]
    if used:
        return (f"uses the course's own {used[0]}"
                + (f" (and {len(used) - 1} more)" if len(used) > 1 else "")
                + ": a graded part must be your own work, not the course's code")
    kernels = (data or {}).get("kernels")
    if not isinstance(kernels, dict):
        return None
    for name in _launched((data or {}).get("raw")):
        info = kernels.get(name)
        if not isinstance(info, dict):
            continue
        course = [str(c) for c in info.get("course") or [] if str(c) not in allowed]
        if course:
            return (f"your kernel {name} calls the course's {course[0]}: write the device "
                    "code yourself")
        for fn, source in sorted((info.get("sources") or {}).items()):
            copied = course_copy(source) if isinstance(source, str) else None
            if copied:
                return (f"your kernel function {fn} is the course's {copied} up to renaming: "
                        "write your own")
    return None
