"""Collect, in the learner's process: each trial run under the bounds watcher and its raw
results recorded (the kernels launched, accesses out of bounds, stores, outputs). It
decides nothing: the verdict is made from these results where the notebook cannot reach
(:mod:`.judge`)."""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import torch

from ... import bounds, runtime
from ..registry import answer, is_not_implemented
from .task import Case, KernelTask


def _kernel_source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN inputs included, which ``torch.equal`` calls unequal)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def run_trial(task: KernelTask, fn, namespace, case: Case, log, device) -> dict:
    """Call the learner's function once and record what it did."""
    inputs = task.inputs(case, device)
    before = [t.clone() for t in inputs]
    start = len(log.launches)
    rec = {"label": case.label, "params": case.params, "seed": case.seed,
           "compiled": case.compiled, "error": None, "not_implemented": False}
    result = None
    try:
        # Extreme inputs overflow on purpose: the interpreter's NumPy need not warn of it.
        with np.errstate(over="ignore", invalid="ignore"):
            result = fn(*inputs, **task.keywords(case))
        if any(t.is_cuda for t in inputs):
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the learner's error, reported
        detail = str(err).strip().splitlines()
        rec["error"] = f"{type(err).__name__}" + (f": {detail[-1][:300]}" if detail else "")
        rec["not_implemented"] = is_not_implemented(err)
    new = log.launches[start:]
    own = [launch for launch in new if launch.defined_in(namespace)]
    rec["own_launches"] = len(own)
    rec["other_kernels"] = sorted({f"{launch.module}.{launch.name}" for launch in new
                                   if not launch.defined_in(namespace)})
    rec["violations"] = [v.describe() for launch in own for v in launch.violations]
    rec["blocks"] = dict(own[0].constexprs) if own else {}
    rec["traced"] = any(launch.traced for launch in own)
    rec["inputs_changed"] = not all(_same_bits(a, b) for a, b in zip(inputs, before))
    traced = [launch for launch in own if launch.traced]
    # Which inputs a load of the notebook's kernels read (None: not watched here).
    rec["inputs_read"] = [bounds.read_by(traced, t) for t in inputs] if traced else None
    rec["sources"] = {launch.name: _kernel_source(launch.fn) for launch in own}
    rec["outputs"], rec["form"], rec["written"] = None, None, []
    rec["input_device"], rec["output_devices"] = str(inputs[0].device), []
    if rec["error"] is None:
        outs = task.unpack(result)
        if isinstance(outs, str):
            rec["form"] = outs
        else:
            kept = []
            for name, out in zip(task.outputs, outs):
                if not isinstance(out, torch.Tensor):
                    rec["form"] = f"{name} is {type(out).__name__} {out!r:.40}, not a torch.Tensor"
                    break
                kept.append(out.detach().cpu().clone())
                rec["output_devices"].append(str(out.device))
                if rec["traced"]:
                    given, unwritten, changed = bounds.written_by(
                        [launch for launch in own if launch.traced], out)
                    rec["written"].append({"given": given, "unwritten": unwritten,
                                           "changed": changed})
            else:
                rec["outputs"] = kept
    return rec


def collect(task: KernelTask, namespace: dict, seed: int) -> dict:
    """Every trial of the notebook's function, as raw results (no verdict)."""
    fn = answer(namespace, task.function)
    if not callable(fn):
        return {"not_callable": f"{type(fn).__name__} {fn!r:.60}"}
    fn = task.entry(namespace)
    raw = {"trials": [], "unwatched": task.unwatchable()}
    watching = contextlib.ExitStack()
    if raw["unwatched"]:
        log = watching.enter_context(bounds.watch(guard=False))
    else:
        watching.enter_context(bounds.interpreted(namespace))
        log = watching.enter_context(bounds.watch(guard=True))
    device = runtime.device()
    with watching:
        first = run_trial(task, fn, namespace, task.first().seeded(seed), log, device)
        raw["trials"].append(first)
        blocks = first["blocks"]
        if not first["not_implemented"]:
            for case in task.cases(blocks):
                if case.label != first["label"]:
                    raw["trials"].append(run_trial(task, fn, namespace, case.seeded(seed), log,
                                                device))
    if runtime.is_gpu() and not any(t["error"] for t in raw["trials"]):
        with bounds.watch(guard=False) as log:
            for case in task.compiled_cases(blocks):
                raw["trials"].append(run_trial(task, fn, namespace, case.seeded(seed), log,
                                            "cuda"))
    return raw
