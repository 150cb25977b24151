"""What the learner's code may not do in the clean collection process, and how it is seen.

The clean process (:mod:`.clean_run`) imports the course and the grader's collector before
any of the learner's code runs, then runs the learner's definitions and graded functions in
the same interpreter. Python cannot wall one part of a process off from another, so the
collector holds three lines instead, each set up before the first learner statement:

* :func:`install`, an audit hook (PEP 578), which the process cannot remove: from then on
  the interpreter's back doors are refused to everyone but a few library callers that use
  them for their own bookkeeping. Refused: reading frames (``sys._getframe``, a
  traceback's or a generator's frame: the collector's frames hold what a trial is), trace,
  profile and audit hooks (code that runs inside the collector's calls), the garbage
  collector's lists of objects (a way to every object, the collector's included),
  ``ctypes`` and ``/proc/*/mem`` (memory written behind the interpreter's back), and new
  code or defaults given to a function the learner did not write. A refusal raises
  ``RuntimeError`` in the learner's code and is recorded for the instructor.
* :class:`Snapshot`: every value bound in the course's modules and classes, and in the
  modules the record is written with, by identity; :meth:`Snapshot.changes` names what the
  learner's code rebound since (``registry.judge = ...`` through any alias).
* :func:`spy_on_answers`: every Python function of the modules that hold answers (the op
  families, the grader, the intensity models, the exercises' checks) replaced by a
  wrapper that records a call made while learner code is on the stack, however the
  function was reached (an alias, a default argument, an attribute).
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
import types

# Modules whose functions compute what graded parts ask for.
ANSWER_MODULES = ("helpers.kernels", "helpers.grading", "helpers.intensity", "helpers.launches",
                  "helpers.roofline", "helpers.tile_plan", "helpers.exercises")
# Modules the collector writes its record with: rebinding their names is tampering too.
RECORD_MODULES = ("torch.serialization", "pickle", "io", "zipfile", "builtins", "json")
LEARNER_FILE = "<cell "       # the file name of every piece of the learner's code here
_BUILTIN_NAMES = frozenset(vars(builtins))

# Library files allowed the refused calls, for their own bookkeeping; what they get never
# reaches the learner's code. The first group reads a caller's frame for a module's name
# (a named tuple, a TypeVar, an Enum made in a function), the second formats a warning or
# finds a logger's caller.
_LIB = os.path.dirname(os.__file__)
_NAMERS = tuple(os.path.join(_LIB, name) for name in (
    "typing.py", "collections/__init__.py", "enum.py"))
try:
    import typing_extensions      # torch's; it reads its caller's module the same way

    _NAMERS += (typing_extensions.__file__,)
except ImportError:
    pass
_SAFE_FILES = tuple(os.path.join(_LIB, name) for name in (
    "logging/__init__.py", "typing.py", "collections/__init__.py", "enum.py",
    "dataclasses.py", "warnings.py", "abc.py")) + (__file__,)
# Library helpers that hand a frame to whoever calls them.
_FRAME_GIVERS = tuple(os.path.join(os.path.dirname(os.__file__), name)
                      for name in ("inspect.py", "traceback.py"))
_REFUSED_EVENTS = {
    "sys._current_frames": "reading the interpreter's frames",
    "sys._current_exceptions": "reading the interpreter's frames",
    "sys.settrace": "a trace hook", "sys.setprofile": "a profile hook",
    "sys.addaudithook": "an audit hook", "sys.monitoring.register_callback": "a monitoring hook",
    "gc.get_objects": "the garbage collector's list of objects",
    "gc.get_referrers": "the garbage collector's list of objects",
    "gc.get_referents": "the garbage collector's list of objects",
}
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}


class Guard:
    """The state the audit hook keeps: which namespace is the learner's, what was refused."""

    def __init__(self):
        self.namespace: dict | None = None
        self.active = False
        self.refused: list[str] = []
        self._busy: set[int] = set()

    def _caller_file(self) -> str:
        frame = sys._getframe(3)     # 0 this, 1 decide, 2 the hook, 3 who raised the event
        return frame.f_code.co_filename if frame is not None else ""

    def decide(self, event: str, args) -> str | None:
        """Why ``event`` is refused, or None."""
        if event == "sys._getframe":
            # Libraries read their callers' frames for their own bookkeeping (typing, a
            # logger's caller); a frame handed to the notebook's code leads, through
            # ``f_back``, to the collector's.
            caller = self._caller_file()
            given = args[0].f_code.co_filename if args and args[0] is not None else ""
            if caller == __file__ or caller.startswith(_NAMERS):   # spies; a module's name
                return None
            if caller.startswith((LEARNER_FILE, *_FRAME_GIVERS)) \
                    or given.startswith(LEARNER_FILE):
                return "reading the interpreter's frames"
            return None
        what = _REFUSED_EVENTS.get(event)
        if what is None and event.startswith("ctypes."):
            what = "ctypes"
        elif what is None and event == "object.__getattr__" and len(args) > 1 \
                and args[1] in _FRAME_ATTRIBUTES:
            # only the notebook's own code: libraries format tracebacks with them
            return ("reading the interpreter's frames"
                    if self._caller_file().startswith(LEARNER_FILE) else None)
        elif what is None and event in ("object.__setattr__", "object.__delattr__") \
                and isinstance(args[0], types.FunctionType) \
                and getattr(args[0], "__globals__", None) is not self.namespace:
            what = f"changing the {args[1]} of a function the notebook did not define"
        elif what is None and event == "open" and isinstance(args[0], (str, bytes)) \
                and os.fsdecode(args[0]).startswith("/proc/") \
                and os.fsdecode(args[0]).endswith("/mem"):
            what = "the process's memory file"
        if what is None:
            return None
        return None if self._caller_file().startswith(_SAFE_FILES) else what

    def hook(self, event: str, args) -> None:
        if not self.active:
            return
        me = threading.get_ident()
        if me in self._busy:        # the hook's own sys._getframe
            return
        self._busy.add(me)
        try:
            why = self.decide(event, args)
        finally:
            self._busy.discard(me)
        if why is not None:
            if len(self.refused) < 20:
                self.refused.append(f"{event} ({why})")
            raise RuntimeError(f"{why} is not allowed while the grader collects results "
                               f"({event}); a graded notebook never needs it")


def install(namespace: dict) -> Guard:
    """The audit hook, on from now on, for the learner's ``namespace``."""
    guard = Guard()
    guard.namespace = namespace
    sys.addaudithook(guard.hook)
    guard.active = True
    return guard


# --------------------------------------------------------------------------------------
# What the learner's code rebinds.
# --------------------------------------------------------------------------------------


def _course_modules(prefixes=("helpers",), exact=RECORD_MODULES):
    return [m for name, m in list(sys.modules.items())
            if isinstance(m, types.ModuleType) and (name in exact or any(
                name == p or name.startswith(p + ".") for p in prefixes))]


class Snapshot:
    """The identity of every value bound in the course's modules and classes."""

    def __init__(self):
        self.bound: dict[tuple[str, str], dict[str, object]] = {}
        self._objects: dict[tuple[str, str], object] = {}
        for module in _course_modules():
            self._take(("module", module.__name__), module)
            if not module.__name__.startswith("helpers"):
                continue
            for value in list(vars(module).values()):
                if isinstance(value, type) and value.__module__ == module.__name__:
                    self._take(("class", f"{module.__name__}.{value.__qualname__}"), value)

    def _take(self, key, owner) -> None:
        self._objects[key] = owner
        self.bound[key] = dict(vars(owner))     # the objects themselves: ids get reused

    def changes(self) -> list[str]:
        """``helpers.grading.registry.judge`` and the like: names rebound since the snapshot
        (a submodule imported later, which adds itself to its package, is not a change)."""
        found = []
        for key, before in self.bound.items():
            owner = self._objects.get(key)
            if owner is None:
                continue
            now = dict(vars(owner))
            for name, value in before.items():
                if name not in now:
                    found.append(f"{key[1]}.{name} deleted")
                elif now[name] is not value:
                    found.append(f"{key[1]}.{name} replaced")
            for name in now.keys() - before.keys():
                # Triton's interpreter adds its own names to a launched kernel's module;
                # a new name matters where it shadows a builtin the module's code calls.
                if key[0] == "class" or name in _BUILTIN_NAMES:
                    found.append(f"{key[1]}.{name} added")
        return found[:10]


# --------------------------------------------------------------------------------------
# Calls into the course's answers.
# --------------------------------------------------------------------------------------


_NOT_SPIED = ("helpers.grading.policy", "helpers.grading.clean_run")   # the spies' own


def _answer_function(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ not in _NOT_SPIED and any(
        value.__module__ == p or (value.__module__ or "").startswith(p + ".")
        for p in ANSWER_MODULES)


_COURSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # helpers/


def _learner_below(frame) -> bool:
    """Whether the call was made by the notebook's code: the first frame below that is
    the notebook's or the course's decides (library frames in between, a ``map`` or a
    pytree walk, are looked through); a course function calling another is not a call
    the notebook made."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(LEARNER_FILE):
            return True
        if name.startswith(_COURSE_DIR):
            return False
        frame = frame.f_back
    return False


def import_answer_modules() -> None:
    """Import every module of :data:`ANSWER_MODULES` (a few ms: their imports are loaded),
    but the grader's own machinery and the instructor's answer keys."""
    import importlib
    import pkgutil

    names = []
    for root in ANSWER_MODULES:
        try:
            module = importlib.import_module(root)
        except Exception:  # noqa: BLE001 - not in this release
            continue
        path = getattr(module, "__path__", None)
        names += [info.name for info in pkgutil.walk_packages(path, root + ".")] if path else []
    for name in names:
        machinery = name.startswith("helpers.grading.") and not name.startswith(
            "helpers.grading.assignments.") or name.rsplit(".", 1)[-1].startswith("keys_")
        if name.startswith(ANSWER_MODULES) and not machinery and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module this machine cannot load is not spied
                pass


def spy_on_answers(fd: int) -> None:
    """Wrap every answer-bearing function where the course binds it: a call made with
    learner code on the stack writes ``module.function`` down ``fd``, a pipe the grader
    reads (what is written there cannot be taken back from this process).

    Every answer module is imported first: one the notebook imported only later would
    bind its functions unwatched (``from helpers.launches import trace as count``)."""
    import_answer_modules()
    spies: dict[int, types.FunctionType] = {}
    getframe, write = sys._getframe, os.write

    def spy_for(fn):
        if id(fn) not in spies:
            line = f"{fn.__module__}.{fn.__qualname__}\n".encode()
            left = [100]        # calls told a function (a loop must not fill the pipe)

            def spy(*args, **kwargs):
                if left[0] > 0 and _learner_below(getframe(1)):
                    left[0] -= 1
                    write(fd, line)
                return fn(*args, **kwargs)
            spy.__name__, spy.__qualname__ = fn.__name__, fn.__qualname__
            spy.__module__, spy.__doc__ = fn.__module__, fn.__doc__
            spies[id(fn)] = spy
        return spies[id(fn)]

    for module in _course_modules(exact=()):
        for name, value in list(vars(module).items()):
            if _answer_function(value):
                setattr(module, name, spy_for(value))
            elif isinstance(value, type) and value.__module__ == module.__name__ \
                    and module.__name__.startswith(ANSWER_MODULES):
                for attr, member in list(vars(value).items()):
                    if _answer_function(member) and not attr.startswith("__"):
                        setattr(value, attr, spy_for(member))


def learner_kernels(namespace: dict) -> dict[str, dict]:
    """For every ``@triton.jit`` function the notebook defines: the course's jitted
    functions and modules it reaches by name (device functions followed, the notebook's and
    the course's), and the source of every function of the notebook's it reaches."""
    import inspect

    from triton.runtime.jit import KernelInterface

    def jitted(obj):
        for _ in range(4):           # Autotuner / Heuristics wrap the JITFunction
            fn = getattr(obj, "fn", None)
            if isinstance(fn, types.FunctionType):
                return fn
            obj = fn
        return None

    def names(code):
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)

    def source(fn):
        try:
            return inspect.getsource(fn)
        except (OSError, TypeError):
            return ""

    found = {}
    for name, value in list(namespace.items()):
        fn = jitted(value) if isinstance(value, KernelInterface) else None
        if fn is None or fn.__globals__ is not namespace:
            continue
        course, sources, todo, seen = [], {}, [fn], set()
        while todo:
            f = todo.pop()
            if id(f) in seen:
                continue
            seen.add(id(f))
            if f.__globals__ is namespace:
                sources[f.__name__] = source(f)
            for n in names(f.__code__):
                target = f.__globals__.get(n)
                if isinstance(target, types.ModuleType):
                    if target.__name__.startswith(ANSWER_MODULES):    # course.some_kernel
                        course.append(target.__name__)
                    continue
                g = jitted(target) if isinstance(target, KernelInterface) else None
                if g is None:
                    continue
                if (g.__module__ or "").startswith("helpers."):
                    course.append(f"{g.__module__}.{g.__qualname__}")
                else:
                    todo.append(g)
        found[name] = {"course": sorted(set(course)), "sources": sources}
    return found
