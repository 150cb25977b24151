"""Watching kernels run: which Triton kernels a call launched, and where they read and wrote.

Two questions the checks must answer about a learner's launcher, whatever it prints:

* **Did it launch a Triton kernel of its own?** ``return a + b`` gives the right answer
  without any kernel. :func:`watch` records every launch (compiled or interpreted) while a
  call runs, with the kernel's Python function, so a check can tell a kernel defined in the
  notebook from the course's own or from none at all.

* **Did the kernel stay inside its tensors?** On a GPU a load past the end of a tensor
  usually returns whatever bytes live there (the caching allocator packs tensors into
  large segments) and a store past the end silently overwrites a neighbour. Triton's
  interpreter does the same on the CPU heap: it reads raw addresses, so an unmasked
  kernel reads junk and its stores corrupt ``malloc``'s bookkeeping, which crashes the
  process later, somewhere else. :func:`watch` (``guard=True``) puts a bounds check in the
  interpreter's load and store: every address a program touches must lie inside the tensor
  its pointer was computed from (``a_ptr + offsets`` belongs to ``a``, even where it runs
  into a neighbouring tensor). An access outside is recorded (which program, which
  operation, which tensor, which indices) and *not performed*, as if masked off, so the
  kernel finishes, nothing is corrupted, and the check can say exactly what went wrong.

* **Did the kernel write the output it returned?** A launcher can launch a kernel that
  stores nothing and copy a result computed with torch into the output. The guard also
  records which elements each store of an interpreted kernel wrote, and the contents of
  every tensor the kernel wrote when it finished (:meth:`Launch.written_by`), so a check
  can tell an output the kernel wrote from one filled in around it.

In GPU mode the guard needs an interpreted kernel: :func:`interpreted` (from
:mod:`helpers.interpreted`) swaps a notebook's compiled kernels for interpreted twins while
a check runs (tensors are copied to the host and back by the interpreter, so the guard sees
exact-size host copies).

The lessons use it (lesson 03 shows a missing mask caught in the act) and so does the
grader; it depends on nothing else in the course.

This module patches Triton's interpreter, an internal API; every patch is undone when the
``with`` block ends, and :func:`guard_available` says whether this Triton has the hooks.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import numpy as np

from .interpreted import interpreted, notebook_kernels  # noqa: F401 - part of this API


@dataclass
class Violation:
    """One load or store (of one program) that reached outside its tensor."""

    op: str                 # "load" or "store"
    program: tuple          # program id (x, y, z)
    grid: tuple             # number of programs per axis
    count: int              # how many lanes of this access were outside
    arg: str                # the kernel argument the pointer came from
    first_index: int        # element index of the first bad address, relative to `arg`
    last_index: int
    arg_numel: int

    def describe(self) -> str:
        where = (f"{self.arg}[{self.first_index}]" if self.first_index == self.last_index
                 else f"{self.arg}[{self.first_index}:{self.last_index + 1}]")
        side = "before the start" if self.first_index < 0 else "past the end"
        pid = self.program[0] if self.grid[1:] == (1, 1) else self.program
        return (f"program {pid} of {self.grid[0] if self.grid[1:] == (1, 1) else self.grid} "
                f"{'read' if self.op == 'load' else 'wrote'} {where}, {side} of {self.arg} "
                f"({self.arg_numel} elements)")


@dataclass
class Launch:
    """One kernel launch: which kernel, its constexpr values, its tensors, what went wrong."""

    fn: object                       # the kernel's Python function (under @triton.jit)
    name: str
    module: str
    constexprs: dict = field(default_factory=dict)
    tensor_ptrs: tuple = ()          # data_ptr() of every tensor argument, as passed
    violations: list = field(default_factory=list)
    ranges: list = field(default_factory=list, repr=False)  # set by the guard
    tensors: dict = field(default_factory=dict, repr=False)  # argument name -> tensor
    scalars: dict = field(default_factory=dict, repr=False)  # the other arguments' values
    # Set by the guard, for interpreted launches: argument name -> bool array over the
    # elements of that tensor's storage that a store wrote, and a copy of the storage as
    # the kernel left it.
    written: dict = field(default_factory=dict, repr=False)
    after: dict = field(default_factory=dict, repr=False)
    read: set = field(default_factory=set, repr=False)   # arguments some load read from
    # Set by the guard: argument name -> bool array over its storage, the elements read.
    read_elements: dict = field(default_factory=dict, repr=False)

    def defined_in(self, namespace: dict) -> bool:
        return getattr(self.fn, "__globals__", None) is namespace

    @property
    def traced(self) -> bool:
        """Were this launch's stores recorded (an interpreted launch under the guard)?"""
        return bool(self.ranges)


def _storage_indices(t) -> "np.ndarray":
    """The storage element index of every element of ``t``, in ``t``'s order."""
    import torch

    flat = torch.arange(t.untyped_storage().nbytes() // max(1, t.element_size()))
    return flat.as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1).numpy()


def _flat_storage(t):
    """The whole storage under ``t``, as a 1-D tensor of ``t``'s dtype."""
    import torch

    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),))
    return flat


def written_by(launches, out) -> tuple[int, int, int]:
    """How the traced ``launches`` account for tensor ``out``.

    Returns ``(given, unwritten, changed)``: how many of the launches were handed ``out``'s
    storage (0: the kernels never saw this tensor); how many elements of ``out`` no store
    of theirs wrote; how many differ from what the last of them left there (the launcher
    changed them afterwards).
    """
    import torch

    mine = [(launch, name) for launch in launches for name, t in launch.tensors.items()
            if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
            and t.dtype == out.dtype and t.device == out.device]
    if not mine:
        return 0, out.numel(), 0
    idx = _storage_indices(out)
    covered = np.zeros(idx.shape, dtype=bool)
    for launch, name in mine:
        mask = launch.written.get(name)
        if mask is not None:
            inside = idx < mask.size
            covered[inside] |= mask[idx[inside]]
    last, name = mine[-1]
    changed = 0
    if name in last.after:
        left = last.after[name][torch.from_numpy(idx).to(out.device)]
        now = out.detach().reshape(-1)
        same = (left == now) | (left.isnan() & now.isnan()) if left.is_floating_point() \
            else (left == now)
        changed = int((~same).sum())
    return len(mine), int((~covered).sum()), changed


@dataclass
class Log:
    launches: list = field(default_factory=list)

    @property
    def violations(self) -> list:
        return [v for launch in self.launches for v in launch.violations]


_active: list[Log] = []          # logs of the `watch` blocks in force (innermost last)
_current: list[Launch] = []      # the launch being interpreted right now


def _kernel_fn(kernel):
    """The Python function under @triton.jit (and under @triton.autotune, if any)."""
    fn = kernel
    while not inspect.isfunction(fn) and hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def _record(kernel, args, kwargs) -> Launch:
    fn = _kernel_fn(kernel)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    is_constexpr = {p.name: "constexpr" in str(p.annotation) for p in params}
    constexprs = {}
    for name, value in list(zip([p.name for p in params], args)) + list(kwargs.items()):
        if is_constexpr.get(name) and isinstance(value, int):
            constexprs[name] = value
    ptrs = tuple(a.data_ptr() for a in list(args) + list(kwargs.values()) if hasattr(a, "data_ptr"))
    named = list(zip([p.name for p in params], args)) + list(kwargs.items())
    tensors = {name: value for name, value in named if hasattr(value, "untyped_storage")}
    scalars = {name: value for name, value in named if not is_constexpr.get(name)
               and isinstance(value, (int, float)) and name in is_constexpr}
    launch = Launch(fn=fn, name=getattr(fn, "__name__", repr(kernel)),
                    module=getattr(fn, "__module__", "") or "", constexprs=constexprs,
                    tensor_ptrs=ptrs, tensors=tensors, scalars=scalars)
    for log in _active:
        log.launches.append(launch)
    return launch


# ------------------------------------------------------------------------------------
# The patches. Each wraps one function of Triton and is removed on exit.
# ------------------------------------------------------------------------------------


def _interpreter():
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton always ships it
        return None
    return interpreter


def guard_available() -> bool:
    itp = _interpreter()
    return (itp is not None and hasattr(itp, "interpreter_builder")
            and hasattr(itp, "GridExecutor") and hasattr(itp.GridExecutor, "_init_args_hst")
            and hasattr(itp.interpreter_builder, "create_masked_load"))


def _ranges_of(executor, args_hst, kwargs_hst) -> list[tuple]:
    """(name, start, end, itemsize, numel) of every tensor the interpreter will see."""
    from triton.runtime.jit import TensorWrapper

    names = list(getattr(executor, "arg_names", []))
    pairs = list(zip(names, args_hst)) + list(kwargs_hst.items())
    out = []
    for name, arg in pairs:
        tensor = arg.base if isinstance(arg, TensorWrapper) else arg
        if not hasattr(tensor, "untyped_storage"):
            continue
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
        out.append((name, start, start + storage.nbytes(), tensor.element_size(),
                    tensor.numel(), tensor.data_ptr()))
    return out


def _home_of(launch, address: int):
    """The tensor argument whose storage holds ``address`` (its data pointer first)."""
    inside = [r for r in launch.ranges if r[1] <= address < r[2]]
    exact = [r for r in inside if r[5] == address]
    return (exact or inside or [None])[0]


def _track_pointer(ptr, result):
    """``ptr + offsets``: the result points into the same tensor as ``ptr`` does.

    Pointer arithmetic keeps its origin: ``a_ptr + offsets`` belongs to ``a`` even where
    it runs past ``a``'s end into a neighbouring tensor, which is exactly what a missing
    mask does (the heap packs small tensors next to one another). The origin is decided
    on the first addition, when ``ptr`` is still the tensor's own base address.
    """
    launch = _current[-1] if _current else None
    if launch is None or not launch.ranges:
        return result
    home = ptr.attr.get(_HOME) if isinstance(getattr(ptr, "attr", None), dict) else None
    if home is None:
        home = _home_of(launch, int(np.asarray(ptr.data).min()))
    if home is not None and isinstance(getattr(result, "attr", None), dict):
        result.attr[_HOME] = home
    return result


_HOME = "course_bounds_home"


def _check(op: str, ptrs, mask):
    """Return ``mask`` with every out-of-bounds lane switched off; record what was off.

    A lane is out of bounds when its address leaves the tensor its pointer came from, or,
    for a pointer of unknown origin, when it lies in none of the launch's tensors.
    """
    launch = _current[-1] if _current else None
    ranges = launch.ranges if launch is not None else None
    if not ranges:
        return mask
    itp = _interpreter()
    addr = np.asarray(ptrs.data).astype(np.uint64)
    m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
    itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    home = ptrs.attr.get(_HOME) if isinstance(getattr(ptrs, "attr", None), dict) else None
    inside = np.zeros(addr.shape, dtype=bool)
    for _, start, end, *_ in ([home] if home is not None else ranges):
        inside |= (addr >= np.uint64(start)) & (addr + np.uint64(itemsize) <= np.uint64(end))
    bad = m & ~inside
    if op == "store":
        _mark_written(launch, addr[m & inside])
    else:
        _mark_read(launch, addr[m & inside])
    if not bad.any():
        return mask
    bad_addr = addr[bad].astype(np.int64)
    first = int(bad_addr.min())
    if home is None:
        # Name the tensor the bad addresses belong to: the one starting just below them.
        below = [r for r in ranges if r[5] <= first]
        home = max(below, key=lambda r: r[5]) if below else min(ranges, key=lambda r: r[5])
    name, _, _, size, numel, base = home
    builder = itp.interpreter_builder
    launch.violations.append(Violation(
        op=op, program=tuple(int(i) for i in (builder.grid_idx or (0, 0, 0))),
        grid=tuple(int(i) for i in (builder.grid_dim or (1, 1, 1))), count=int(bad.sum()),
        arg=name, first_index=(first - base) // size,
        last_index=(int(bad_addr.max()) - base) // size, arg_numel=numel))
    return itp.TensorHandle(np.asarray(m & inside), mask.dtype)


def _mark_written(launch, addresses) -> None:
    """Note the storage elements that a store's in-bounds lanes wrote."""
    for name, start, end, size, *_ in launch.ranges:
        sel = addresses[(addresses >= np.uint64(start)) & (addresses < np.uint64(end))]
        if sel.size:
            mask = launch.written.get(name)
            if mask is None:
                mask = launch.written[name] = np.zeros((end - start) // size, dtype=bool)
            mask[((sel - np.uint64(start)) // np.uint64(size)).astype(np.int64)] = True


def _mark_read(launch, addresses) -> None:
    """Note the tensors, and their elements, that a load's in-bounds lanes read."""
    for name, start, end, size, *_ in launch.ranges:
        sel = addresses[(addresses >= np.uint64(start)) & (addresses < np.uint64(end))]
        if sel.size:
            launch.read.add(name)
            mask = launch.read_elements.get(name)
            if mask is None:
                mask = launch.read_elements[name] = np.zeros((end - start) // size, dtype=bool)
            mask[((sel - np.uint64(start)) // np.uint64(size)).astype(np.int64)] = True


def elements_read(launches, tensor) -> "np.ndarray":
    """Which elements of ``tensor`` some load of the traced ``launches`` read: a bool
    array shaped like ``tensor`` (a causal kernel that skips hidden tiles leaves the keys
    after each query block unread by that block's program)."""
    import torch

    idx = _storage_indices(tensor)
    seen = np.zeros(idx.shape, dtype=bool)
    ptr = tensor.untyped_storage().data_ptr()
    for launch in launches:
        for name, t in launch.tensors.items():
            mask = launch.read_elements.get(name)
            if mask is not None and t.untyped_storage().data_ptr() == ptr:
                inside = idx < mask.size
                seen[inside] |= mask[idx[inside]]
    return seen.reshape(tuple(tensor.shape)) if torch.is_tensor(tensor) else seen


def read_by(launches, tensor) -> bool:
    """Did a load of one of the traced ``launches`` read from ``tensor``'s storage?"""
    ptr = tensor.untyped_storage().data_ptr()
    return any(name in launch.read for launch in launches
               for name, t in launch.tensors.items() if t.untyped_storage().data_ptr() == ptr)


def _keep_after(launch) -> None:
    """Copy every tensor the kernel wrote, as it left it (see :func:`written_by`)."""
    for name in launch.written:
        t = launch.tensors.get(name)
        if t is not None:
            launch.after[name] = _flat_storage(t.detach()).clone()


@contextlib.contextmanager
def _patched(guard: bool):
    import triton.runtime.jit as jit

    itp = _interpreter()
    undo = []

    def patch(owner, name, make):
        was_own = name in vars(owner)
        original = vars(owner)[name] if was_own else getattr(owner, name)
        # A wrapper left by an earlier copy of this module (the grader re-imports the
        # course before collecting results) is replaced, not wrapped a second time.
        current = getattr(owner, name)
        base = getattr(current, "__course_original__", current)
        wrapper = make(base)
        wrapper.__course_original__ = base
        setattr(owner, name, wrapper)
        undo.append((owner, name, original, was_own))

    def wrap_jit_run(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                _record(self, args, kwargs)
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return run

    def wrap_interp_run(original):
        def run(self, *args, grid, warmup, **kwargs):
            if warmup:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            launch = _record(self, args, kwargs)
            _current.append(launch)
            try:
                result = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                _current.pop()
            if launch.written and _active:   # someone is watching: keep the evidence
                _keep_after(launch)
            return result
        return run

    def wrap_init_args(original):
        def _init_args_hst(self, args_dev, kwargs):
            args_hst, kwargs_hst = original(self, args_dev, kwargs)
            if _current:
                _current[-1].ranges = _ranges_of(self, args_hst, kwargs_hst)
            return args_hst, kwargs_hst
        return _init_args_hst

    def wrap_load(original):
        def create_masked_load(ptrs, mask, other, *rest):
            return original(ptrs, _check("load", ptrs, mask), other, *rest)
        return create_masked_load

    def wrap_addptr(original):
        def create_addptr(ptr, offset):
            return _track_pointer(ptr, original(ptr, offset))
        return create_addptr

    def wrap_store(original):
        def create_masked_store(ptrs, value, mask, *rest):
            return original(ptrs, value, _check("store", ptrs, mask), *rest)
        return create_masked_store

    try:
        patch(jit.JITFunction, "run", wrap_jit_run)
        if itp is not None:
            patch(itp.InterpretedFunction, "run", wrap_interp_run)
        if guard and guard_available():
            patch(itp.GridExecutor, "_init_args_hst", wrap_init_args)
            patch(itp.interpreter_builder, "create_masked_load", wrap_load)
            patch(itp.interpreter_builder, "create_masked_store", wrap_store)
            patch(itp.interpreter_builder, "create_addptr", wrap_addptr)
        yield
    finally:
        for owner, name, original, was_own in reversed(undo):
            if was_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # an attribute we added: the inherited one shows again


_installed: list = []   # the patches in force: one ExitStack per install


@contextlib.contextmanager
def watch(guard: bool = True):
    """Record every kernel launch in the block; with ``guard``, bounds-check interpreted ones.

    Nested blocks each get every launch; the patches are installed once, by the outermost
    block (or by :func:`install`).
    """
    log = Log()
    _active.append(log)
    try:
        if _installed:
            yield log
        else:
            with _patched(guard):
                _installed.append(None)
                try:
                    yield log
                finally:
                    _installed.pop()
    finally:
        _active.remove(log)


def install() -> None:
    """Guard every interpreted launch from now on (the grader does this in CPU mode).

    A learner's own cell may launch an unmasked kernel; without the guard its stray
    stores corrupt the heap and kill the kernel process later, far from the mistake.
    """
    if _installed:
        return
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(True))
    _installed.append(stack)
