"""The environment: environment.yml and pyproject.toml install the same pinned versions,
and ./course sets it up as the README says (the first run): which Python, when to rebuild,
and which torch (its CPU build without an NVIDIA driver, decided before pip starts).
./course lab's tests are in tests/test_course_lab.py."""

import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from course_script import (
    COURSE,
    CPU_INDEX,
    fake_nvidia_smi,
    fake_python,
    nvidia_driver_here,
    old_venv,
    pyproject_hash,
    run_course,
)

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


# -- ./course env: which Python, and when to rebuild --------------------------------------

def test_an_inactive_pyenv_shim_is_reported_as_such(tmp_path):
    shim = tmp_path / "shims" / "python3.12"
    shim.parent.mkdir()
    shim.write_text("""#!/usr/bin/env bash
echo "pyenv: python3.12: command not found" >&2
echo >&2
echo "The \\`python3.12' command exists in these Python versions:" >&2
echo "  3.12.1" >&2
echo >&2
echo "Note: See 'pyenv help global' for tips on allowing multiple" >&2
echo "      Python versions to be found at the same time." >&2
exit 127
""")
    shim.chmod(0o755)
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=shim, COURSE_VENV=tmp_path / "venv",
                   PYENV_ROOT=tmp_path / "pyenv")
    assert r.returncode == 2
    assert "too old" not in r.stderr
    assert "pyenv shim" in r.stderr and "pyenv: python3.12: command not found" in r.stderr
    assert f"PYTHON={tmp_path}/pyenv/versions/3.12.1/bin/python3.12 ./course env" in r.stderr
    assert "pyenv shell 3.12.1" in r.stderr
    assert not (tmp_path / "venv").exists()


def test_a_python_that_does_not_run_is_not_called_too_old(tmp_path):
    broken = tmp_path / "python3"
    broken.write_text("#!/usr/bin/env bash\necho 'error while loading shared libraries' >&2\n"
                      "exit 127\n")
    broken.chmod(0o755)
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=broken, COURSE_VENV=tmp_path / "venv")
    assert r.returncode == 2 and "too old" not in r.stderr
    assert "could not run" in r.stderr and "error while loading shared libraries" in r.stderr


def test_an_old_python_is_called_too_old(tmp_path):
    old = fake_python(tmp_path / "python3.10", "3.10.14", "/opt/py310", tmp_path / "log")
    r = run_course("env", COURSE_DRY_RUN=1, PYTHON=old, COURSE_VENV=tmp_path / "venv")
    assert r.returncode == 2 and "Python 3.10.14, too old" in r.stderr


def _loads_libpython(python: str) -> bool:
    import subprocess
    code = ('import sys; '
            'sys.exit(0 if any("libpython" in l for l in open("/proc/self/maps")) else 1)')
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def test_a_static_build_of_the_same_python_is_preferred_to_a_shared_one(tmp_path):
    """Without PYTHON, python3 on PATH that loads libpython.so gives way to the
    distribution's build of the same version; PYTHON keeps the one named."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = Path(f"/usr/bin/python{version}")
    # A shared build of this version: this environment's own, else one of pyenv's.
    shared = [p for p in [Path(sys.base_prefix) / "bin" / f"python{version}",
                          *sorted(Path.home().glob(f".pyenv/versions/*/bin/python{version}"))]
              if sys.platform == "linux" and p.exists() and _loads_libpython(str(p))]
    base = shared[0] if shared else None
    if not (base and system.exists() and not _loads_libpython(str(system))):
        pytest.skip(f"needs python{version} built with a shared libpython on PATH and a "
                    f"static one at {system}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(base)
    path = f"{bin_dir}:/usr/bin:/bin"
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=tmp_path / "venv", PATH=path)
    assert r.returncode == 0, r.stderr
    assert "would create" in r.stdout and "from /usr (first run)" in r.stdout, r.stdout
    assert f"{system}: the same Python {version}" in r.stdout and "libpython.so" in r.stdout
    assert f"PYTHON={bin_dir}/python3 keeps that one" in r.stdout
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=tmp_path / "venv", PATH=path,
                   PYTHON=bin_dir / "python3")
    assert r.returncode == 0 and f"from {base.parent.parent.resolve()} (first" in r.stdout, r.stdout
    assert "libpython.so" not in r.stdout


def test_python_names_the_interpreter_of_the_environment(tmp_path):
    log = tmp_path / "log"
    venv = old_venv(tmp_path / "venv", log)
    py311 = fake_python(tmp_path / "bin311" / "python3.11", "3.11.7", "/opt/py311", log)
    py312 = fake_python(tmp_path / "bin312" / "python3.12", "3.12.4", "/opt/py312", log)

    def plan(**env):
        r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=venv, **env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "is up to date (Python 3.11.7" in plan()              # no PYTHON: keep it
    assert "is up to date (Python 3.11.7" in plan(PYTHON=py311)   # the same interpreter
    out = plan(PYTHON=py312)
    assert "would rebuild" in out and "with Python 3.12.4 from /opt/py312" in out
    assert "made with Python 3.11.7 from /opt/py311" in out
    (venv / ".course-stamp").write_text("0123456789abcdef 3.11.7\n")   # pyproject changed
    assert "would update" in plan()
    assert not log.exists()  # a dry run runs neither venv nor pip


def test_an_environment_whose_python_is_gone_is_rebuilt(tmp_path):
    venv = tmp_path / "venv"
    old_venv(venv, tmp_path / "log")
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 127\n")   # its Python was removed
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=venv, PYTHON=sys.executable)
    assert r.returncode == 0, r.stderr
    assert "would rebuild" in r.stdout and "does not run any more" in r.stdout


def test_python_rebuilds_the_environment_with_that_interpreter(tmp_path):
    """The real ./course env, with fake interpreters standing in for Python and pip."""
    root = tmp_path / "course"   # a copy of ./course, so that nothing here is touched
    root.mkdir()
    shutil.copy(COURSE, root / "course")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "triton_course_helpers.egg-info").mkdir()   # a build leftover
    log = tmp_path / "log"
    venv = old_venv(tmp_path / "venv", log)
    (venv / "made-with-3.11").write_text("")
    py312 = fake_python(tmp_path / "bin" / "python3.12", "3.12.4", "/opt/py312", log)

    r = run_course("env", script=root / "course", COURSE_VENV=venv, PYTHON=py312,
                   COURSE_TORCH="cuda")    # torch with the rest: the CPU build's step is below
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"3.12.4 -m venv --clear {venv}", calls      # made anew, with 3.12
    # by the new venv's pip, then its packages compiled to bytecode on every core
    assert calls[-2:] == [f"3.12.4 -m pip install --no-compile -e {root}",
                          "3.12.4 -m compileall -q -j 0 -x /tests/|/torch/testing/_internal/ "
                          "/opt/py312/site-packages"], calls
    assert not (venv / "made-with-3.11").exists()
    assert (venv / ".course-stamp").read_text().split() == [pyproject_hash(root), "3.12.4"]
    assert (venv / ".course-python").read_text().strip() == "3.12.4 /opt/py312"
    assert not (root / "triton_course_helpers.egg-info").exists()
    assert "rebuilding" in r.stdout and "[3/3] installing" in r.stdout

    # Run again with the same PYTHON, then without: nothing to do either time.
    log.unlink()
    for env in ({"PYTHON": py312}, {}):
        r = run_course("env", script=root / "course", COURSE_VENV=venv, **env)
        assert r.returncode == 0 and not log.exists(), (r.stdout, r.stderr)


def test_a_folder_that_is_not_a_venv_is_left_alone(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("mine")
    r = run_course("env", COURSE_VENV=tmp_path / "stuff", PYTHON=sys.executable)
    assert r.returncode == 2 and "is not a virtual environment" in r.stderr
    assert (tmp_path / "stuff" / "notes.txt").read_text() == "mine"


# -- ./course env: which torch, decided before pip starts ---------------------------------

def plan_torch(tmp_path, **env) -> str:
    """What a dry run of a first set-up says about torch: its one line."""
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=tmp_path / "venv", PYTHON=sys.executable,
                   **env)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "venv").exists()                 # a dry run installs nothing
    lines = [ln for ln in r.stdout.splitlines() if "pip would take torch" in ln]
    assert len(lines) == 1, r.stdout
    return lines[0]


@pytest.mark.skipif(nvidia_driver_here(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_torch_is_the_cpu_build_said_in_one_line(tmp_path):
    line = plan_torch(tmp_path)
    assert line.startswith("course: no NVIDIA driver here, so pip would take torch's CPU build "
                           f"from {CPU_INDEX} (0.5 GB to download, 2 GB on disk"), line
    assert "COURSE_TORCH=cuda" in line                        # how to take the other one
    assert "Ctrl+C" not in line


def test_with_a_driver_torch_is_the_cuda_build(tmp_path):
    line = plan_torch(tmp_path, PATH=fake_nvidia_smi(tmp_path / "bin"))
    assert line.startswith("course: an NVIDIA driver is here, so pip would take torch with "
                           "CUDA's libraries (2.8 GB to download, 5 GB on disk)"), line


def test_course_torch_and_pips_own_index_override_the_choice(tmp_path):
    with_driver = fake_nvidia_smi(tmp_path / "bin")
    assert "COURSE_TORCH=cpu, so pip would take torch's CPU build" in plan_torch(
        tmp_path, PATH=with_driver, COURSE_TORCH="cpu")
    assert "COURSE_TORCH=cuda, so pip would take torch with CUDA's libraries" in plan_torch(
        tmp_path, COURSE_TORCH="cuda")
    line = plan_torch(tmp_path, PIP_EXTRA_INDEX_URL=CPU_INDEX)
    assert "the index your PIP_INDEX_URL / PIP_EXTRA_INDEX_URL name: its CPU build" in line
    line = plan_torch(tmp_path, PIP_INDEX_URL="https://mirror.example/simple")
    assert line.endswith("PIP_EXTRA_INDEX_URL name."), line
    r = run_course("env", COURSE_DRY_RUN=1, COURSE_VENV=tmp_path / "venv",
                   PYTHON=sys.executable, COURSE_TORCH="gpu")
    assert r.returncode == 2 and "COURSE_TORCH is 'gpu': set it to cpu or cuda" in r.stderr


def _first_setup(tmp_path, offline=False, **env):
    """The real ./course env of a copy of the course, with a fake Python standing in for
    Python and pip: (its output, the calls pip got)."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(COURSE, root / "course")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    log = tmp_path / "log"
    py = fake_python(tmp_path / "bin" / "python3.12", "3.12.4", "/opt/py312", log, offline)
    r = run_course("env", script=root / "course", COURSE_VENV=tmp_path / "venv", PYTHON=py,
                   **env)
    assert r.returncode == 0, r.stderr
    return r.stdout, [c.removeprefix("3.12.4 ") for c in log.read_text().splitlines()], root


def test_the_cpu_build_is_installed_first_from_pytorchs_cpu_index(tmp_path):
    pin = re.search(r'"torch==([^";]+)"', (ROOT / "pyproject.toml").read_text())[1]
    out, calls, root = _first_setup(tmp_path, COURSE_TORCH="cpu")
    torch = f"-m pip install --no-compile --extra-index-url {CPU_INDEX} torch=={pin}"
    assert calls[-3:-1] == [torch, f"-m pip install --no-compile -e {root}"], calls
    assert calls[-1].startswith("-m compileall -q -j 0 "), calls
    assert f"-c <is the index there?> {CPU_INDEX}/torch/" in calls   # asked before, once
    assert "[3/4] installing torch" in out and "[4/4] installing triton, JupyterLab" in out
    # The next run finds it done.
    (tmp_path / "log").unlink()
    r = run_course("env", script=root / "course", COURSE_VENV=tmp_path / "venv")
    assert r.returncode == 0 and not (tmp_path / "log").exists(), r.stdout


def test_an_unreachable_cpu_index_costs_nothing(tmp_path):
    """Offline, or behind a mirror: torch comes with the rest from pip's own indexes, and
    pip never waits on PyTorch's index (it would retry it for each of torch's dependencies)."""
    out, calls, root = _first_setup(tmp_path, offline=True, COURSE_TORCH="cpu")
    assert not any("--extra-index-url" in c for c in calls), calls
    assert calls[-2] == f"-m pip install --no-compile -e {root}", calls
    assert f"{CPU_INDEX} cannot be reached ([Errno -2] Name or service not known)" in out
    assert "[4/4] installing torch, triton, JupyterLab" in out
