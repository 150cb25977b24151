"""The profiler's kernel tables (lessons 01 and 05), read from the ``profiles`` record.

Each op of the record is one call as ``torch.profiler`` saw it: the kernels it launched,
each with its device time per call, its share of the op's time, the bytes it must move by
the napkin math and the bandwidth that gives.
"""

from __future__ import annotations


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
    """A fixed-width table of the kernels one call of ``op_name`` launched: kernel, launches
    per call, µs per launch, share of the call's device time, GB/s (``-`` where the bytes
    are unknown), then the call's total."""
    ops = results_of(record)["ops"]
    if op_name not in ops:
        raise KeyError(f"the profiles record has no op {op_name!r}; it has: {', '.join(ops)}")
    op = ops[op_name]
    kernels = op["kernels"]
    width = max([len("kernel"), *(len(k["name"]) for k in kernels)])
    lines = [f"{op_name}: {op['description']}",
             f"shape {'x'.join(map(str, op['shape']))} {op['dtype']}, "
             f"{op['calls_profiled']} calls profiled",
             f"{'kernel':<{width}}  {'calls':>5}  {'µs/launch':>10}  {'share':>6}  {'GB/s':>7}",
             "-" * (width + 38)]
    for k in kernels:
        lines.append(f"{k['name']:<{width}}  {k['calls_per_op']:>5g}  {k['us_per_call']:>10.1f}  "
                     f"{100 * k['share']:>5.1f}%  {_cell(k.get('gbps'), ',.0f'):>7}")
    lines.append(f"{'total per call':<{width}}  {sum(k['calls_per_op'] for k in kernels):>5g}  "
                 f"{op['total_us']:>10.1f}  {100.0:>5.1f}%")
    if _label(record):
        lines.append(f"source: {_label(record)}")
    return "\n".join(lines)


def print_kernel_table(record, op_name: str) -> None:
    print(kernel_table(record, op_name))
