"""What an assignment says about its graded function: :class:`KernelTask`, its trials
(:class:`Case`), and whether this machine can watch a kernel's loads and stores."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
import triton

from ... import runtime


@dataclass(frozen=True)
class Case:
    """One trial: a label for messages, the parameters of its inputs and their seed."""

    label: str
    params: dict
    seed: int = 0
    compiled: bool = False     # GPU mode: run compiled, after the watched trials

    def seeded(self, seed: int) -> Case:
        """This case with its seed drawn from ``seed`` (the grader's, unknown in advance)."""
        mixed = zlib.crc32(f"{seed}/{self.label}/{self.compiled}".encode()) & 0x7FFFFFFF
        return Case(self.label, self.params, mixed, self.compiled)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def loops_unwatchable() -> str | None:
    """Why this GPU machine cannot watch a kernel with a loop, or None: the watch runs it
    interpreted, and Triton < 3.7's interpreter stops on loops under NumPy >= 2.4."""
    v = runtime._version_tuple
    if runtime.is_gpu() and v(triton.__version__) < (3, 7) and v(np.__version__) >= (2, 4):
        return (f"this machine's Triton {triton.__version__} interpreter cannot run kernels "
                f"with loops under NumPy {np.__version__}, so loads and stores could "
                "not be watched here (the other parts ran compiled). Grade with the "
                "course's environment (./course env: Triton 3.7.1) or in CPU mode")
    return None


class KernelTask:
    """What an assignment says about its graded function. Subclass and fill in."""

    function = ""                 # the name the notebook defines, e.g. "vector_add"
    call = ""                     # how it is called, for messages: "vector_add(a, b)"
    outputs: tuple[str, ...] = ("C",)
    inputs_named: tuple[str, ...] = ()   # the inputs' names, for messages: ("A", "B")
    mask_hint = ""                # what to do about an out-of-bounds access
    loops = False                 # the kernel loops (over K, over key blocks): see unwatchable
    # Inputs the kernels need not read themselves: a launcher may reduce them with torch
    # first (06's backward: D = rowsum(dO * O)).
    optional_reads: tuple[str, ...] = ()

    @property
    def tensors(self) -> str:
        """The kernel's tensors, for messages: "A, B and C", the inputs then the outputs. A
        task whose kernel reads more (a table of counts, a saved lse) names them all."""
        *first, last = (*self.inputs_named, *self.outputs)
        return f"{', '.join(first)} and {last}" if first else last

    def entry(self, namespace: dict):
        """What each trial calls with its inputs: the notebook's :attr:`function`, or a
        task's chain of the learner's functions (08: its layout, then its kernel)."""
        return namespace.get(self.function)

    def keywords(self, case: Case) -> dict:
        """Keyword arguments of the call on ``case``, beside its tensors (06's backward:
        ``causal``, ``window``, ``softcap``)."""
        return {}

    def first(self) -> Case:
        """A small trial run first: it tells the learner's block sizes."""
        raise NotImplementedError

    def cases(self, blocks: dict) -> list[Case]:
        """The watched trials, chosen around the learner's ``blocks`` (constexprs)."""
        raise NotImplementedError

    def compiled_cases(self, blocks: dict) -> list[Case]:
        """GPU mode: larger trials with the kernel compiled (the interpreter is lenient)."""
        return []

    def inputs(self, case: Case, device) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def reference(self, case: Case, inputs) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def compare(self, case: Case, got: tuple, want: tuple, inputs, blocks: dict) -> str | None:
        """What is wrong with ``got`` (outputs of the right shape, dtype and device)."""
        raise NotImplementedError

    def race(self) -> Case:
        """The one input the class leaderboard times every submission on
        (:mod:`helpers.grading.leaderboard`): on a GPU the largest compiled trial, in CPU
        mode the first, small trial (the interpreter's time, a check of the plumbing)."""
        compiled = self.compiled_cases({}) if runtime.is_gpu() else []
        return compiled[-1] if compiled else self.first()

    def unpack(self, result) -> tuple | str:
        """The outputs in ``result``, or what is wrong with its form."""
        if len(self.outputs) == 1:
            return (result,)
        if not isinstance(result, (tuple, list)) or len(result) != len(self.outputs):
            return (f"{self.function} returned {type(result).__name__} {result!r:.40}; "
                    f"expected the {len(self.outputs)} outputs ({', '.join(self.outputs)})")
        return tuple(result)

    def unwatchable(self) -> str | None:
        """Why this machine cannot watch the kernel's loads and stores, or None
        (:func:`loops_unwatchable` for a kernel that :attr:`loops`)."""
        return loops_unwatchable() if self.loops else None

    def summary(self, cases) -> str:
        """The trials, in a few words, for a passing message."""
        return ", ".join(c.label for c in cases)
