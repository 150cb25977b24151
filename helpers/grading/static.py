"""What the grader reads in a notebook's source, in its own process, before trusting a run.

The raw results of a graded function come from a process that runs the learner's
definitions (:mod:`.clean_run`): a notebook that patches the tools the collection relies
on (torch's serialiser, Triton's interpreter, the course's modules, Python's import
machinery) could try to rewrite the record of its own run there. Its *source* cannot lie
to the grader, which reads it here with :mod:`ast`, never running it:

* :func:`tampering`: statements that change a library or the course from the outside
  (``torch.save = ...``, ``setattr(triton..., ...)``, ``def __import__``, a new
  ``sys.meta_path`` finder, IPython input transformers, ``ctypes``, ``gc.get_referrers``).
  Code that hides what it runs from this reading (``exec``, ``eval``, ``compile``,
  ``__import__`` of a computed name, a cell nested too deeply to parse here) counts too.
  A graded notebook never needs either; the grader withholds the verdicts of such a
  notebook and flags it for the instructor, who can grade it by hand.
* :func:`launches_a_kernel`: whether the notebook contains a launch (``kernel[grid](...)``)
  of a ``@triton.jit`` kernel it defines at all; without one, no trace of a run can make
  a kernel part pass.
"""

from __future__ import annotations

import ast

# Modules whose attributes a notebook may read but never assign.
PROTECTED = ("torch", "triton", "numpy", "builtins", "sys", "os", "io", "pickle", "importlib",
             "inspect", "types", "gc", "threading", "helpers", "IPython", "ipykernel",
             "jupyter_client", "zmq", "marshal", "copyreg", "functools")
# ... except the settings they exist to have changed.
SETTINGS = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.",
            "torch.set_", "torch.manual_seed", "numpy.random.seed", "triton.config.",
            "os.environ")
# Names whose mere use in a graded notebook means reaching into the interpreter.
INTROSPECTION = {"ctypes": "ctypes", "meta_path": "sys.meta_path", "settrace": "a trace hook",
                 "setprofile": "a profile hook", "input_transformers_post": "input transformers",
                 "input_transformers_cleanup": "input transformers",
                 "ast_transformers": "AST transformers", "get_referrers": "gc.get_referrers",
                 "get_objects": "gc.get_objects", "__code__": "a function's code object",
                 "__globals__": "a function's globals", "f_globals": "a frame's globals",
                 "_getframe": "the interpreter's frames", "__builtins__": "__builtins__",
                 "__subclasses__": "every class of the interpreter",
                 "__closure__": "a function's closure", "cell_contents": "a function's closure",
                 "getclosurevars": "a function's closure", "__wrapped__": "a wrapped function",
                 "f_back": "the interpreter's frames", "f_locals": "a frame's locals",
                 "tb_frame": "the interpreter's frames", "currentframe": "the interpreter's frames",
                 "walk_stack": "the interpreter's frames", "walk_tb": "the interpreter's frames",
                 "addaudithook": "an audit hook"}
HIDDEN = ("exec", "eval", "compile")
# The grader's own machinery: a graded notebook imports its check_* calls from
# helpers.grading.assignments, never the collector or the judge, nor the bounds watch's
# private state (lesson 03 shows the watch itself: its public names are fine).
MACHINERY = ("helpers.bounds._",) + tuple(f"helpers.grading.{m}" for m in (
    "registry", "harness", "policy", "clean", "clean_run", "parts", "grader", "session",
    "sandbox", "static", "similarity", "reuse", "gpu", "extra", "answers", "report", "flags",
    "leaks", "outputs", "kernel_launcher", "leaderboard"))


def _machinery(name: str) -> bool:
    return any(name == m or name.startswith(m if m.endswith("_") else m + ".")
               for m in MACHINERY)


def parse(source: str) -> ast.Module:
    """``ast.parse``, tried once more on CPython's spurious ``SystemError: AST constructor
    recursion depth mismatch`` (python/cpython#106905, fixed in 3.11.8 and 3.12.1): an
    error path of the AST constructor forgets its depth count, which a process with other
    threads (the grader's Jupyter client) meets now and then. Seen once in the course's
    test suite on 3.11.7, where it failed a whole grading; the same source parses again."""
    try:
        return ast.parse(source)
    except SystemError as err:
        if "recursion depth mismatch" not in str(err):
            raise
        return ast.parse(source)


def _parse(cells, unreadable: list | None = None):
    """``(number, tree)`` of each code cell that parses. A cell this process cannot parse
    but a kernel might run is listed in ``unreadable``: one nested too deeply
    (``RecursionError``, ``MemoryError``: the notebook may have raised its kernel's recursion
    limit), or text Python's parser refuses before it reads it (``ValueError``: a lone
    surrogate, which UTF-8 cannot encode)."""
    for number, source in cells:
        try:
            yield number, parse(_python(source))
        except SyntaxError:
            continue
        except (RecursionError, MemoryError, ValueError) as err:
            if unreadable is not None:
                why = "nested too deeply for the grader to read" if not isinstance(
                    err, ValueError) else "text the grader cannot read"
                unreadable.append(f"code cell {number}: {why} ({type(err).__name__})")


def _python(source: str) -> str:
    """The cell without IPython's magics and shell lines (they are not Python)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _aliases(trees) -> dict[str, str]:
    """Local names of protected modules: ``import torch as t`` -> ``{"t": "torch"}``."""
    out = {root: root for root in PROTECTED}
    out["np"] = "numpy"
    out["tl"] = "triton.language"
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in PROTECTED:
                        out[(a.asname or a.name).split(".")[0]] = a.name if a.asname else \
                            a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.split(".")[0] in PROTECTED:
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _module_expr(node, aliases) -> str | None:
    """A protected module reached another way: ``sys.modules["torch"]``,
    ``importlib.import_module("torch")``, ``__import__("torch")``, ``vars(torch)``."""
    if isinstance(node, ast.Subscript) and _dotted(node.value, aliases) == "sys.modules":
        return "sys.modules[...]"
    if isinstance(node, ast.Call):
        fn = _dotted(node.func, aliases) or getattr(node.func, "id", "")
        if fn in ("importlib.import_module", "__import__"):
            return f"{fn}(...)"
        if fn == "vars" and node.args and (_dotted(node.args[0], aliases) or _root(node.args[0],
                                                                              aliases)):
            return f"vars({_dotted(node.args[0], aliases) or _root(node.args[0], aliases)})"
    return None


def _root(node, aliases) -> str | None:
    return aliases.get(node.id) if isinstance(node, ast.Name) else None


def _dotted(node, aliases) -> str | None:
    """``torch.save`` for an attribute chain rooted at a protected module, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "get_ipython":
        return ".".join(["get_ipython()", *reversed(parts)])
    other = _module_expr(node, aliases) if isinstance(node, (ast.Subscript, ast.Call)) else None
    if other and parts:
        return ".".join([other, *reversed(parts)])
    if isinstance(node, ast.Name) and node.id in aliases and parts:
        # (a bare name rebound in the notebook changes no module: only its attributes do)
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _changed(target, aliases) -> str | None:
    if isinstance(target, ast.Subscript):     # vars(torch)["save"] = ..., m.__dict__[k] = ...
        base = target.value
        inner = _module_expr(base, aliases) or (
            _dotted(base.value, aliases) + ".__dict__"
            if isinstance(base, ast.Attribute) and base.attr == "__dict__"
            and _dotted(base.value, aliases) else None)
        return f"{inner}[...]" if inner and not inner.startswith("os.environ") else None
    name = _dotted(target, aliases)
    if name is None or any(name.startswith(s) or name == s.rstrip(".") for s in SETTINGS):
        return None
    return name


def tampering(cells) -> tuple[list[str], list[str]]:
    """``(changes, hidden)``: statements that change a protected module or reach into the
    interpreter, and code that hides what it runs from this reading. The grader withholds
    the verdicts of a notebook with either."""
    unreadable: list[str] = []
    trees = list(_parse(cells, unreadable))
    aliases = _aliases(trees)
    changes, hidden = [], unreadable
    for number, tree in trees:
        for node in ast.walk(tree):
            where = f"code cell {number}, line {getattr(node, 'lineno', '?')}"
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    name = _changed(t, aliases)
                    if name:
                        changes.append(f"{where}: changes {name}")
                    if isinstance(t, ast.Name) and t.id in ("__import__", "__builtins__"):
                        changes.append(f"{where}: redefines {t.id}")
            if isinstance(node, ast.FunctionDef) and node.name == "__import__":
                changes.append(f"{where}: redefines __import__")
            if isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in ("setattr", "delattr") and node.args:
                    name = _dotted(node.args[0], aliases)
                    if name or isinstance(node.args[0], ast.Name) and node.args[0].id in aliases:
                        changes.append(f"{where}: {fn.id} on {name or node.args[0].id}")
                if isinstance(fn, ast.Attribute) and fn.attr in ("__setattr__", "__delattr__"):
                    changes.append(f"{where}: calls {fn.attr}")
                if isinstance(fn, ast.Name) and fn.id in HIDDEN:
                    hidden.append(f"{where}: runs code from a string ({fn.id})")
                if isinstance(fn, ast.Name) and fn.id == "__import__" and node.args \
                        and not isinstance(node.args[0], ast.Constant):
                    hidden.append(f"{where}: imports a computed name")
            label = None
            if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
                label = INTROSPECTION[node.attr]
            elif isinstance(node, ast.Name) and node.id in INTROSPECTION:
                label = INTROSPECTION[node.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                if any(m.split(".")[0] == "ctypes" for m in mods):
                    label = "ctypes"
                if isinstance(node, ast.ImportFrom):
                    mods += [f"{node.module}.{a.name}" for a in node.names]
                used = next((m for m in mods if _machinery(m)), None)
                if used:
                    changes.append(f"{where}: imports the grader's machinery ({used})")
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                name = _dotted(node, aliases)
                if name and _machinery(name) and not _machinery(name.rsplit(".", 1)[0]):
                    changes.append(f"{where}: reaches the grader's machinery ({name})")
            if label:
                changes.append(f"{where}: reaches into the interpreter ({label})")
    return list(dict.fromkeys(changes)), list(dict.fromkeys(hidden))


def _is_jit(decorator) -> bool:
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("jit", "autotune", "heuristics")


def launches_a_kernel(cells) -> bool:
    """Does the notebook contain ``kernel[grid](...)`` for a ``@triton.jit`` kernel of its own?"""
    trees = list(_parse(cells))
    kernels = {node.name for _, tree in trees for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and any(map(_is_jit, node.decorator_list))}
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in kernels:
                return True
    return False
