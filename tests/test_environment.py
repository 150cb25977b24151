"""environment.yml and pyproject.toml must install the same pinned versions."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).replace('"', "'").lower()


def pyproject_pins() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {_norm(r) for r in data["project"]["dependencies"]}


def environment_pins() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pins = set()
    for line in lines[start + 1:]:
        item = line.strip()
        if not item.startswith("- "):
            break
        item = item[2:].strip()
        if not item.startswith("-e"):
            pins.add(_norm(item))
    return pins


def test_same_pins_in_both_files():
    only_py = pyproject_pins() - environment_pins()
    only_env = environment_pins() - pyproject_pins()
    assert not only_py and not only_env, (
        f"pyproject.toml and environment.yml disagree: only in pyproject {sorted(only_py)}, "
        f"only in environment.yml {sorted(only_env)}")


def test_every_dependency_is_pinned_exactly():
    for req in pyproject_pins():
        assert "==" in req, f"{req} is not pinned with =="


def test_torch_and_triton_are_a_pair_torch_accepts():
    # torch 2.13.0's CUDA wheels require triton==3.7.1 (their METADATA): a GPU user's
    # pip must be able to satisfy both pins at once.
    pins = pyproject_pins()
    assert "torch==2.13.0" in pins
    assert any(p.startswith("triton==3.7.1") for p in pins)


def test_conda_python_is_supported():
    text = (ROOT / "environment.yml").read_text()
    version = re.search(r"python=(\d+)\.(\d+)", text)
    assert version and (int(version[1]), int(version[2])) >= (3, 11)
