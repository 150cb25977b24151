"""VERSIONS.md says what is pinned and what the kernels ran on compiled: its tables must
agree with pyproject.toml's pins and with the provenance of every committed record."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "VERSIONS.md"
RECORDS = REPO / "helpers" / "records"
COLUMNS = ("gpu", "driver", "cuda", "torch", "triton", "numpy", "python")

if not PAGE.exists() and not (REPO / "solutions").exists():
    pytest.skip("the student release carries no versions page", allow_module_level=True)


def _section(title: str) -> str:
    text = PAGE.read_text()
    assert f"\n## {title}\n" in text, f"VERSIONS.md has no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _table(title: str) -> list[list[str]]:
    """The first table of a section, as rows of cells (header and rule left out)."""
    lines = [line for line in _section(title).splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]


def _pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        name, version = re.fullmatch(r"([\w.-]+)==([^;\s]+)\s*(;.*)?", dep).group(1, 2)
        out[name.lower()] = version
    return out


def test_the_pins_table_is_pyprojects():
    page = {row[0].lower(): row[1].split()[0] for row in _table("What is pinned")}
    assert page == _pins(), (
        "VERSIONS.md's table of pins and pyproject.toml differ: "
        f"only on the page {sorted(set(page.items()) - set(_pins().items()))}, "
        f"only in pyproject {sorted(set(_pins().items()) - set(page.items()))}")


def test_the_python_versions_are_pyprojects():
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    lowest = re.fullmatch(r">=\s*(\d+\.\d+)", want)[1]
    assert f"Python {lowest} or newer" in _section("What is pinned")


def _recorded() -> dict[tuple, list[str]]:
    """``{(gpu, driver, cuda, torch, triton, numpy, python): [record files]}``."""
    out: dict[tuple, list[str]] = {}
    for path in sorted(RECORDS.glob("*.json")):
        p = json.loads(path.read_text())["provenance"]
        key = tuple(str(p.get(c, "?")) for c in COLUMNS)
        out.setdefault(key, []).append(path.name)
    return out


def test_every_compiled_combination_in_the_records_is_on_the_page_and_no_other():
    page = {tuple(row) for row in _table("Where the kernels ran compiled")}
    recorded = _recorded()
    assert recorded, "no reference records in helpers/records/"
    missing = {k: v for k, v in recorded.items() if k not in page}
    assert not missing, (
        "records ran on combinations VERSIONS.md does not list; add these rows to its table "
        "'Where the kernels ran compiled':\n" + "\n".join(
            "| " + " | ".join(k) + " |" + f"   ({', '.join(v)})" for k, v in missing.items()))
    unrecorded = page - set(recorded)
    assert not unrecorded, f"VERSIONS.md lists combinations no record ran on: {unrecorded}"


def test_the_page_says_whether_the_pinned_pair_ran_compiled():
    pins = _pins()
    compiled = {(k[3].split("+")[0], k[4]) for k in _recorded()}
    pair = (pins["torch"], pins["triton"])
    text = _section("Where the kernels ran compiled")
    said = f"torch {pair[0]} with Triton {pair[1]}"
    if pair in compiled:
        assert "Not yet run compiled" not in text, "the pinned pair has a record now"
    else:
        assert f"Not yet run compiled: the pinned pair**, {said}" in text, (
            f"no record ran on the pinned pair ({said}): VERSIONS.md must say so")


def test_the_steps_to_check_another_pair_name_commands_that_exist():
    steps = _section("How to check another pair")
    course = (REPO / "course").read_text()
    for command in ("test", "record"):
        assert f"`./course {command}`" in steps
        assert re.search(rf"^\s*(\w+\|)*{command}(\|[\w-]+)*\)", course, re.M), command
    assert (REPO / "tests" / "gpu" / "device.sh").exists()
    assert (REPO / ".github" / "workflows" / "course.yml").exists()
