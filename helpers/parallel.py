"""Start ``world`` ranks on this machine, one process each, and collect what they return.

``launch(fn, world, *args)`` runs ``fn(rank, world, *args)`` in ``world`` fresh processes
(``torch.multiprocessing.spawn``) joined by ``torch.distributed`` over a free TCP port
on 127.0.0.1, and returns each rank's return value, rank 0 first (through files in a
temporary folder: results travel as ``torch.save`` pickles, tensors included):

* GPU mode: backend ``nccl``, rank ``r`` on GPU ``r`` (so ``world`` is at most
  ``torch.cuda.device_count()``). NVLink multicast (NVLS) stays off in every rank:
  ``NCCL_NVLS_ENABLE=0`` unless the environment already says otherwise.
* CPU mode: backend ``gloo``, one torch thread a rank; the ranks inherit the mode (and
  ``TRITON_INTERPRET=1``), so each runs the kernels in Triton's interpreter.

``fn`` must be importable by name (a module's top-level function, not a lambda or a
function typed into a notebook): each new process imports it afresh. An exception in a
rank stops the launch with that rank's traceback.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import tempfile
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import runtime

# Set in every rank this module starts, unless already set.
RANK_ENV = {"NCCL_NVLS_ENABLE": "0"}
# CPU mode: one thread a rank, or the ranks fight over the cores.
CPU_RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def backend() -> str:
    """``"nccl"`` in GPU mode, ``"gloo"`` in CPU mode."""
    return "nccl" if runtime.is_gpu() else "gloo"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_world(world: int) -> None:
    """Refuse a world this machine cannot run: fewer than one rank, or more GPUs than it has."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive number of ranks, got {world!r}")
    if runtime.is_gpu() and world > torch.cuda.device_count():
        raise runtime.NeedsGPUError(
            f"{world} ranks need {world} GPUs (one each), but this machine has "
            f"{torch.cuda.device_count()}. Use fewer ranks, or COURSE_MODE=cpu to run them "
            "on the CPU with gloo.")


@contextlib.contextmanager
def _environment(values: dict):
    """``values`` in ``os.environ`` (where not set already) while ranks start."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def launch(fn: Callable, world: int, *args, timeout_s: float = 300) -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each in its own rank.

    ``timeout_s`` bounds each collective: a rank left waiting (another died, or called a
    different collective) fails after it instead of hanging.
    """
    check_world(world)
    env = {**RANK_ENV, **({} if runtime.is_gpu() else CPU_RANK_ENV)}
    with tempfile.TemporaryDirectory(prefix="ranks-") as folder, _environment(env):
        ranks = mp.spawn(_rank_main, args=(fn, world, free_port(), backend(), folder, args,
                                           timeout_s), nprocs=world, join=False)
        try:
            while not ranks.join():      # raises with a failed rank's traceback
                pass
        finally:
            # A rank that raised left its traceback in a file in /tmp, which torch reads
            # into the exception above and then leaves behind.
            for name in ranks.error_files:
                with contextlib.suppress(OSError, TypeError):
                    os.unlink(name)
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False)
                for r in range(world)]


def _rank_main(rank, fn, world, port, backend_name, folder, args, timeout_s):
    for k, v in RANK_ENV.items():
        os.environ.setdefault(k, v)
    options = {}
    if backend_name == "nccl":
        torch.cuda.set_device(rank)
        options["device_id"] = torch.device("cuda", rank)
        # NCCL's copies run as kernels on the SMs. On a high-priority stream their blocks
        # are scheduled first as the blocks of a running GEMM retire, so an exchange meant
        # to overlap a GEMM that fills every SM does not wait for the GEMM's last wave.
        try:
            options["pg_options"] = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
        except (AttributeError, TypeError):       # a torch without them: the default stream
            pass
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend_name, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **options)
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(folder) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
