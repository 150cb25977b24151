"""The clean collection process: the learner's definitions, then the grader's collections.

The grader starts this (through :mod:`.kernel_launcher` ``--collect``, inside the sandbox)
after the notebook has run in its own kernel, and talks to it over three pipes
(:mod:`.clean` is the other end):

1. It reads one line first, before anything else: the assignment, the notebook's code
   cells (IPython's syntax already turned into Python) and a token drawn by the grader.
2. It imports the course, the assignment and the collector, turns the bounds guard on
   (CPU mode), wraps the course's answer-bearing functions (:func:`policy.spy_on_answers`),
   takes a :class:`policy.Snapshot` and installs the audit hook (:func:`policy.install`).
3. It runs the notebook's *definitions*, statement by statement, in a fresh namespace:
   imports, ``def`` and ``class``, assignments to plain names and ``del`` of them (inside
   ``if`` and ``try`` too). Nothing else runs: no calls at the top level, no prints, no plots, no
   loops, no hooks registered with IPython (there is no IPython here).
4. Then, one request at a time, it collects a unit of raw results on the seed the request
   carries (one per unit, drawn by the grader; the grader's own seed never comes here) and
   writes them back framed with the token, which the learner's code never sees.

Every call into an answer-bearing course function made with learner code on the stack
goes down a pipe whose other end only the grader holds, so no code here can take it back.
"""

from __future__ import annotations

import builtins
import io
import json
import linecache
import os
import sys
import time

def _plain_target(node) -> bool:
    import ast

    if isinstance(node, ast.Name):
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_plain_target(e) for e in node.elts)
    return isinstance(node, ast.Starred) and _plain_target(node.value)


def definitions(body: list) -> list:
    """The statements of ``body`` that define names: imports, functions, classes,
    assignments to plain names and ``del`` of them, also inside ``if`` and ``try``;
    nothing else."""
    import ast

    kept = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            kept.append(node)
        elif isinstance(node, ast.Delete) and all(isinstance(t, ast.Name) for t in node.targets):
            kept.append(node)              # a name the notebook deleted is gone here too
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(_plain_target(t) for t in targets) and getattr(node, "value", 1) is not None:
                kept.append(node)
        elif isinstance(node, ast.If):
            node.body = definitions(node.body) or [ast.Pass()]
            node.orelse = definitions(node.orelse)
            kept.append(node)
        elif isinstance(node, ast.Try):
            node.body = definitions(node.body) or [ast.Pass()]
            for handler in node.handlers:
                handler.body = definitions(handler.body) or [ast.Pass()]
            node.orelse, node.finalbody = definitions(node.orelse), definitions(node.finalbody)
            kept.append(node)
    return kept


def bound_names(node) -> list[str]:
    """The names a top-level statement binds."""
    import ast

    names = []
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(sub.name)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.append(sub.id)
        elif isinstance(sub, ast.alias):
            names.append((sub.asname or sub.name).split(".")[0])
    return list(dict.fromkeys(names))


def main() -> None:
    stdin = sys.stdin.buffer
    header = json.loads(stdin.readline())
    token = header["token"].encode()       # kept in this frame only: never in a global
    magic = header["magic"].encode()
    out = os.dup(1)                         # the record's pipe; the learner's prints go nowhere
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    sys.stdout = open(os.devnull, "w")
    marks = int(header["marks_fd"])
    write, dumps, encode = os.write, json.dumps, str.encode

    def send(kind: str, payload: bytes) -> None:
        head = magic + token + encode(kind.ljust(8)) + len(payload).to_bytes(8, "big")
        data = head + payload
        while data:
            data = data[write(out, data):]

    def mark(text: str) -> None:           # a marker in the grader's list of course calls
        write(marks, encode("#" + text + " " + token.decode() + "\n", errors="replace"))

    try:
        import torch     # (no figure is drawn to a screen: the grader sets MPLBACKEND=Agg)
        import triton  # noqa: F401

        import helpers
        from helpers import bounds
        from helpers.grading import extra, policy, registry

        if helpers.is_cpu():
            bounds.install()
        spec = registry.get(header["assignment"])
    except Exception as err:  # noqa: BLE001 - the grader's own setup: said, not a crash
        send("failed", encode(f"the collection process could not start: "
                              f"{type(err).__name__}: {err}"[:2000], errors="replace"))
        return
    save = torch.save
    policy.spy_on_answers(marks)
    snapshot = policy.Snapshot()
    changes = snapshot.changes
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    guard = policy.install(namespace)
    refused = guard.refused

    statements = _define(header["cells"], namespace, mark)
    send("defined", encode(dumps({"statements": statements, "changes": changes(),
                                  "refused": list(refused)}), errors="replace"))
    while True:
        line = stdin.readline()
        if not line:
            return
        request = json.loads(line)
        if "race" in request:           # the class leaderboard (:mod:`.leaderboard`)
            from helpers.grading import leaderboard

            mark("unit race")
            found = changes()
            reply = {"tampered": found} if found else leaderboard.serve(spec, request,
                                                                         namespace)
            buffer = io.BytesIO()
            save(reply, buffer)
            mark("end race")
            send("race", buffer.getvalue())
            continue
        mark(f"unit {request['unit']}")
        found = changes()
        if found:                  # nothing the rebound code could forge runs from here on
            send("tampered", encode("\n".join(found), errors="replace"))
            continue
        raw = _collect(spec, request, namespace, extra, registry)
        found = changes()
        if found:
            send("tampered", encode("\n".join(found), errors="replace"))
            continue
        raw["refused"] = list(refused)
        raw["kernels"] = policy.learner_kernels(namespace)
        buffer = io.BytesIO()
        save(raw, buffer)
        mark(f"end {request['unit']}")
        send("raw", buffer.getvalue())


def _define(cells, namespace: dict, mark) -> list[dict]:
    """Run the definitions of every cell; return what each statement did."""
    import ast

    from helpers.grading.static import parse

    done = []
    for number, source in cells:
        filename = f"<cell {number}>"
        lines = source.splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        try:
            tree = parse(source)
        except (SyntaxError, RecursionError, MemoryError, ValueError) as err:
            done.append({"cell": number, "line": 0, "names": [],
                         "error": f"{type(err).__name__}: {str(err)[:200]}"})
            continue
        for node in definitions(tree.body):
            names = bound_names(node)
            mark(f"statement {number} {node.lineno} " + ",".join(names))
            record = {"cell": number, "line": node.lineno, "names": names, "error": None}
            try:
                code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")
                exec(code, namespace)
            except BaseException as err:
                if isinstance(err, KeyboardInterrupt):
                    raise
                record["error"] = f"{type(err).__name__}: {str(err)[:200]}"
            done.append(record)
    mark("defined")
    return done


def _collect(spec, request: dict, namespace: dict, extra, registry) -> dict:
    """One unit's raw results (:func:`registry.read_bytes` reads them): ``ok`` and the
    encoded ``raw`` results, or what went wrong; the seconds it took."""
    start = time.perf_counter()
    unit, seed = request["unit"], int(request["seed"])
    try:
        if request.get("checks"):
            checks = extra.from_source(request["checks"], request.get("path", "<checks>"))
            spec = checks.merged(registry.get(checks.extends))
        raw = {"ok": True, "raw": registry.encode(registry.collect(spec, unit, namespace,
                                                                   seed))}
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        raw = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000],
               "not_implemented": registry.is_not_implemented(err),
               "missing": err.name if isinstance(err, registry.MissingAnswer) else ""}
    raw["seconds"] = round(time.perf_counter() - start, 3)
    return raw


if __name__ == "__main__":
    main()
