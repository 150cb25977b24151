"""Reference records: GPU measurements saved as JSON, with where and when they were made.

A learner without a GPU still sees real numbers: every figure a CPU-mode notebook shows
comes from a record that ``./course record`` wrote on a real GPU. Each record carries its
provenance (GPU, driver, CUDA, torch, triton, date, git commit), and every table and plot
drawn from it says so through :attr:`Record.label`.

Files live in ``helpers/records/<experiment>__<gpu key>.json``; the experiments that
produce them are in :mod:`helpers.experiments`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import runtime

RECORDS_DIR = Path(__file__).parent / "records"
SCHEMA = 1
# The GPU a CPU-mode notebook shows when several were recorded: the course's reference.
PREFERRED_GPUS = ("H100-SXM", "H200")


class RecordNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class Record:
    name: str
    provenance: dict
    results: dict
    live: bool = False  # measured in this process, not read from a file

    @property
    def gpu(self) -> str:
        return self.provenance.get("gpu", "unknown GPU")

    @property
    def label(self) -> str:
        """One line naming the source, for captions, titles and printed tables."""
        p = self.provenance
        how = "measured now" if self.live else "recorded"
        return (f"{how} on {self.gpu}, {p.get('date', '?')} "
                f"(torch {p.get('torch', '?')}, triton {p.get('triton', '?')})")

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "schema": SCHEMA, "provenance": self.provenance,
                           "results": self.results}, indent=1, sort_keys=True)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def provenance() -> dict:
    """Where and when a measurement is being made: this GPU, its software, this commit."""
    runtime.require_gpu("recording a GPU measurement")
    import numpy
    import torch
    import triton

    from . import hardware

    spec = hardware.current_gpu()
    props = torch.cuda.get_device_properties(0)
    # A copy of the tree made elsewhere (for a lent GPU machine, say) passes the commit in,
    # and that wins: such a copy may carry a .git of some other commit, or none.
    commit = os.environ.get("COURSE_GIT_COMMIT")
    dirty = None                    # unknown: the copy's state is the sender's to vouch for
    if not commit:
        commit = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "gpu": torch.cuda.get_device_name(),
        "gpu_key": spec.key if spec else props.name.replace(" ", "_"),
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
    }


def path_for(name: str, gpu_key: str, directory: Path = RECORDS_DIR) -> Path:
    return Path(directory) / f"{name}__{gpu_key}.json"


def write(record: Record, directory: Path = RECORDS_DIR) -> Path:
    path = path_for(record.name, record.provenance["gpu_key"], directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.to_json() + "\n")
    return path


def read(path: Path) -> Record:
    data = json.loads(Path(path).read_text())
    missing = {"name", "provenance", "results"} - set(data)
    if missing:
        raise ValueError(f"{path} is not a reference record: it lacks {sorted(missing)}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path} has record schema {data.get('schema')}, this course reads "
                         f"{SCHEMA}: re-record it with ./course record {data['name']}")
    return Record(data["name"], data["provenance"], data["results"])


def available(name: str, directory: Path = RECORDS_DIR) -> list[str]:
    """GPU keys for which ``name`` was recorded."""
    return sorted(p.stem.split("__", 1)[1] for p in Path(directory).glob(f"{name}__*.json"))


def load(name: str, gpu: str | None = None, directory: Path = RECORDS_DIR) -> Record:
    """The record of experiment ``name`` on ``gpu`` (default: H100 SXM if recorded)."""
    have = available(name, directory)
    if not have:
        raise RecordNotFoundError(
            f"no reference record for {name!r} in {directory}. On a GPU machine, run "
            f"`./course record {name}` and commit the JSON it writes."
        )
    if gpu is None:
        gpu = next((g for g in PREFERRED_GPUS if g in have), have[0])
    if gpu not in have:
        raise RecordNotFoundError(f"{name!r} was recorded on {have}, not on {gpu!r}.")
    return read(path_for(name, gpu, directory))


def measure(name: str, **options) -> Record:
    """Run experiment ``name`` now, on this GPU, and return it as a live record."""
    from . import experiments

    results = experiments.run(name, **options)
    return Record(name, provenance(), results, live=True)


def get(name: str, gpu: str | None = None, **options) -> Record:
    """Measure now in GPU mode; read the committed record in CPU mode.

    This is how a notebook shows real numbers in both modes with one line.
    """
    if runtime.is_gpu():
        return measure(name, **options)
    return load(name, gpu)


def every_gpu(rec: Record, directory: Path = RECORDS_DIR) -> list[Record]:
    """``rec`` (measured now or read), then the committed record of its experiment on every
    other GPU: how a lesson draws its table once per GPU recorded."""
    mine = rec.provenance.get("gpu_key")
    return [rec] + [load(rec.name, key, directory) for key in available(rec.name, directory)
                    if key != mine]
