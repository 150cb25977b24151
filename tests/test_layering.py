"""The import rules of helpers/README.md, checked on the source: kernels import only
torch, triton and their few helpers; nothing that measures, grades or computes imports
the plots; and the package has no import cycle (imports inside functions included)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "helpers"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports, anywhere in it, resolved to a module of the package
    where it is one (``from . import finish`` in helpers.plots.fusion -> helpers.plots)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                         for a in node.names)
    return found


def _under(names, *prefixes) -> set[str]:
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes)}


KERNELS = sorted(n for n in MODULES if n.startswith("helpers.kernels."))


@pytest.mark.parametrize("name", KERNELS)
def test_kernels_import_only_torch_triton_and_their_helpers(name):
    # The napkin math and the GPU table are data and formulas: a tile setting may ask
    # them what it costs and what fits, and they import nothing that measures or draws.
    allowed = {"helpers.runtime", "helpers.dtypes", "helpers.kernels", "helpers.hardware",
               "helpers.intensity"}
    ours = _under(_imports(name), "helpers")
    stray = {n for n in ours if n not in allowed
             and not n.startswith(("helpers.kernels.", "helpers.intensity."))}
    assert not stray, f"{name} imports {sorted(stray)}; kernels may import only {sorted(allowed)}"
    gui = _under(_imports(name), "matplotlib", "ipywidgets", "IPython")
    assert not gui, f"{name} imports {sorted(gui)}: kernels draw nothing"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(
    ("helpers.kernels", "helpers.experiments", "helpers.grading")) or n in (
    "helpers.runtime", "helpers.dtypes", "helpers.intensity", "helpers.prediction",
    "helpers.hardware", "helpers.bench", "helpers.records", "helpers.launches",
    "helpers.tile_plan")))
def test_what_measures_computes_or_grades_never_imports_plots(name):
    drawn = _under(_imports(name), "helpers.plots", "matplotlib", "ipywidgets")
    assert not drawn, f"{name} imports {sorted(drawn)}: experiments measure, plots draw"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("helpers.intensity")))
def test_napkin_math_imports_only_the_dtypes(name):
    # Kernels, exercises, plots and grading all import the napkin math, so it imports
    # nothing of theirs.
    ours = _under(_imports(name), "helpers", "torch", "triton")
    stray = {n for n in ours if n != "helpers.dtypes" and not n.startswith("helpers.intensity")}
    assert not stray, f"{name} imports {sorted(stray)}; the napkin math may import helpers.dtypes"


def test_the_gpu_table_times_nothing():
    # helpers.hardware is data (datasheets) and detection: the probes that time the GPU
    # live in helpers.bench, so kernels may read the table.
    ours = _under(_imports("helpers.hardware"), "helpers")
    assert ours <= {"helpers.runtime", "helpers.dtypes"}, sorted(ours)


@pytest.mark.parametrize("name", ["helpers.roofline"] + sorted(
    n for n in MODULES if n.startswith("helpers.performance")))
def test_models_and_the_report_never_import_plots(name):
    # The roofline model and the performance report read records and targets; drawing
    # and formatting figures is the plots' business.
    drawn = _under(_imports(name), "helpers.plots", "matplotlib", "ipywidgets")
    assert not drawn, f"{name} imports {sorted(drawn)}"


def test_compiled_imports_only_the_standard_library_and_triton():
    # helpers/compiled.py is also run by path as the compiling process: importing helpers
    # there would switch Triton's interpreter on (CPU mode) and nothing could compile.
    ours = _under(_imports("helpers.compiled"), "helpers", "torch", "numpy")
    assert not ours, f"helpers.compiled imports {sorted(ours)}"


def test_no_import_cycle():
    graph = {n: {m for m in _imports(n) if m in MODULES and m != n} for n in MODULES}
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    for n in graph:
        graph[n] = {m for m in graph[n] if not m.startswith(n + ".")}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_no_module_reaches_500_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert all(v < 500 for v in long.values()), {n: v for n, v in long.items() if v >= 500}
