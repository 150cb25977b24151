"""The profiler's kernel tables (lessons 01 and 05), read from the ``profiles`` record.

Each op of the record is one call as ``torch.profiler`` saw it: the kernels it launched,
each with its device time per call, its share of the op's time, the bytes it must move by
the napkin math and the bandwidth that gives.
"""

from __future__ import annotations

from ..experiments.profiles import short_name


def results_of(record) -> dict:
    """The results of a :class:`~helpers.records.Record`, or of a dict that is one or holds one."""
    if hasattr(record, "results"):
        return record.results
    return record.get("results", record)


def _label(record) -> str:
    return getattr(record, "label", "") or ""


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def kernel_table(record, op_name: str) -> str:
    """A fixed-width table of the kernels one call of ``op_name`` launched: kernel, what it
    computes (its aten op, where the record says), launches per call, µs per launch, share of
    the call's device time, GB/s (``-`` where the bytes are unknown), then the call's total."""
    ops = results_of(record)["ops"]
    if op_name not in ops:
        raise KeyError(f"the profiles record has no op {op_name!r}; it has: {', '.join(ops)}")
    op = ops[op_name]
    kernels = op["kernels"]
    names: list[str] = []
    for k in kernels:       # without PyTorch's namespaces (records before they were dropped)
        names.append(short_name(k["name"], names))
    does = [k.get("op") or "-" for k in kernels]
    width = max([len("kernel"), *(len(n) for n in names)])
    ow = max([len("op"), *(len(d) for d in does)]) if any(k.get("op") for k in kernels) else 0
    op_col = (lambda text: f"{text:<{ow}}  ") if ow else (lambda text: "")  # noqa: E731
    head = (f"{'kernel':<{width}}  {op_col('op')}{'calls':>5}  {'µs/launch':>10}  "
            f"{'share':>6}  {'GB/s':>7}")
    lines = [f"{op_name}: {op['description']}",
             f"shape {'x'.join(map(str, op['shape']))} {op['dtype']}, "
             f"{op['calls_profiled']} calls profiled", head, "-" * len(head)]
    for name, what, k in zip(names, does, kernels):
        lines.append(f"{name:<{width}}  {op_col(what)}{k['calls_per_op']:>5g}  "
                     f"{k['us_per_call']:>10.1f}  {100 * k['share']:>5.1f}%  "
                     f"{_cell(k.get('gbps'), ',.0f'):>7}")
    lines.append(f"{'total per call':<{width}}  {op_col('')}"
                 f"{sum(k['calls_per_op'] for k in kernels):>5g}  {op['total_us']:>10.1f}  "
                 f"{100.0:>5.1f}%")
    if _label(record):
        lines.append(f"source: {_label(record)}")
    return "\n".join(lines)


def print_kernel_table(record, op_name: str) -> None:
    print(kernel_table(record, op_name))
