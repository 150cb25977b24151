"""What a PyTorch call launches: the aten ops eager mode dispatches, and the kernels
``torch.compile`` generates.

Each op of eager PyTorch is (at least) one kernel that reads its inputs from DRAM and
writes its outputs back, so :func:`trace` counts the traffic of an unfused version the way
the napkin math does (:mod:`helpers.intensity`), and tests and lessons check the two
against each other. :func:`inductor_code` shows what the compiler made of the same ops.
Lesson 05 uses both; its experiment records them from a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .dtypes import dtype_key

# --------------------------------------------------------------------------------------
# Counting what eager PyTorch launches: every aten op, the bytes it reads and writes.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCall:
    """One aten op that launches a kernel: what it reads and writes, in bytes."""

    op: str
    read: int
    written: int
    inputs: str
    outputs: str

    def as_dict(self) -> dict:
        return {"op": self.op, "read": self.read, "written": self.written,
                "inputs": self.inputs, "outputs": self.outputs}


class Trace(list):
    """The kernels one call launched, in order (a list of :class:`KernelCall`)."""

    result = None

    @property
    def bytes(self) -> int:
        return sum(k.read + k.written for k in self)

    def table(self) -> str:
        rows = [(f"{i + 1}", k.op, f"{k.read:,}", f"{k.written:,}", f"{k.inputs} -> {k.outputs}")
                for i, k in enumerate(self)]
        head = ("#", "aten op", "bytes read", "bytes written", "tensors")
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(head)]
        fmt = lambda r: "  ".join(v.rjust(w) if i in (2, 3) else v.ljust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(r, widths))).rstrip()
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
        lines.append(f"{len(self)} kernels, {self.bytes:,} bytes in all")
        return "\n".join(lines)

    __repr__ = table

    def as_list(self) -> list[dict]:
        return [k.as_dict() for k in self]

    @classmethod
    def from_list(cls, rows: list[dict]) -> "Trace":
        return cls(KernelCall(**r) for r in rows)


def _short(t) -> str:
    try:
        name = dtype_key(t.dtype)
    except ValueError:
        name = str(t.dtype).replace("torch.", "")
    return f"{name}{list(t.shape)}"


def _nbytes(t) -> int:
    # A broadcast (expanded) view has more elements than memory; count the memory.
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def trace(fn, *args, **kwargs) -> Trace:
    """Run ``fn(*args, **kwargs)`` and list every aten op it dispatched that does work.

    Each op of eager PyTorch is (at least) one kernel that reads its input tensors
    from DRAM and writes its outputs back, so summing their sizes counts the traffic of
    the unfused version, the way the napkin math does. Views (``x[:, None]``,
    ``.view``) move nothing and are left out. Works in both modes: on the CPU the ops
    are the same, only the kernels behind them differ.
    """
    calls = Trace()

    def tensors(tree):
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            returns = func._schema.returns
            is_view = bool(returns) and returns[0].alias_info is not None \
                and not returns[0].alias_info.is_write
            # _unsafe_view is a view its schema does not mark as one (matmul ends with it).
            if not is_view and func.overloadpacket.__name__ not in (
                    "empty", "empty_like", "empty_strided", "_unsafe_view"):
                ins, outs = tensors((args, kwargs)), tensors(out)
                calls.append(KernelCall(
                    op=f"aten.{func.overloadpacket.__name__}",
                    read=sum(_nbytes(t) for t in ins),
                    written=sum(_nbytes(t) for t in outs),
                    inputs=", ".join(_short(t) for t in ins) or "-",
                    outputs=", ".join(_short(t) for t in outs) or "-"))
            return out

    with _Counter():
        calls.result = fn(*args, **kwargs)
    return calls


# --------------------------------------------------------------------------------------
# What torch.compile generates: Inductor's kernels, as source text.
# --------------------------------------------------------------------------------------

_TRITON_KERNEL = re.compile(r"async_compile\.triton\(\s*'(\w+)'\s*,\s*'''(.*?)'''", re.S)
_CPP_KERNEL = re.compile(r"(\w+) = async_compile\.cpp_pybinding\(\s*\[.*?\]\s*,\s*r?'''(.*?)'''",
                         re.S)


def parse_inductor_code(codes: list[str]) -> dict:
    """Pull the kernels out of the Python modules Inductor wrote.

    On a GPU Inductor writes Triton kernels (``async_compile.triton(name, source)``);
    on a CPU it writes C++ with OpenMP and vector intrinsics
    (``async_compile.cpp_pybinding(...)``).
    """
    kernels, backend = [], None
    for code in codes:
        for name, source in _TRITON_KERNEL.findall(code):
            kernels.append({"name": name, "source": source.strip("\n")})
            backend = "triton"
        for name, source in _CPP_KERNEL.findall(code):
            kernels.append({"name": name, "source": source.strip("\n")})
            backend = backend or "cpp"
    out = {"backend": backend, "kernels": kernels}
    if not kernels and codes:
        out["wrapper"] = codes[0][:20000]
    return out


def inductor_code(fn, *args) -> dict:
    """Compile ``fn`` with ``torch.compile`` and return the kernels Inductor generated.

    On a CPU this runs a C++ compiler and takes tens of seconds the first time.
    """
    from torch._inductor.utils import run_and_get_code  # loads Inductor: only when asked

    _, codes = run_and_get_code(torch.compile(fn, dynamic=False), *args)
    return parse_inductor_code(codes)
