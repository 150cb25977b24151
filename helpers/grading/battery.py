"""A battery: every trial run of one learner function, shared by the parts that grade it.

Correctness, staying in bounds and speed are graded as separate parts, but each would
call the learner's launcher on the same inputs; the battery runs those calls once and
each part reads what it needs from it.
"""

from __future__ import annotations


class Battery:
    """``trials`` is a list of trial objects with ``problem``, ``violations``,
    ``not_implemented``, ``raised`` and ``own_launches``; ``compiled_problem`` is what went wrong when
    the kernel ran compiled (GPU mode) after passing interpreted."""

    def __init__(self, trials, compiled_problem=None):
        self.trials = trials
        self.compiled_problem = compiled_problem

    @property
    def failed(self):
        return [t for t in self.trials if t.problem]

    @property
    def violations(self):
        """Every out-of-bounds access, with the trial that made it."""
        return [(t, v) for t in self.trials for v in t.violations]

    @property
    def crashed(self):
        """Trials whose call raised: the loads and stores it would have made were not all seen."""
        return [t for t in self.trials if t.raised]

    @property
    def not_implemented(self) -> bool:
        return any(t.not_implemented for t in self.trials)

    @property
    def ran_own_kernel(self) -> bool:
        """Did the launcher launch a kernel of the notebook's own (not torch)?"""
        return any(t.own_launches for t in self.trials)
