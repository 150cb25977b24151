"""GPU mode or CPU mode, decided once, before any kernel is compiled.

* GPU mode: a CUDA device is present. Triton compiles every kernel to machine code
  and the course times it for real.
* CPU mode: no CUDA device (or ``COURSE_MODE=cpu``). We set ``TRITON_INTERPRET=1``
  before Triton looks at any kernel, so each ``@triton.jit`` function runs in Triton's
  interpreter: every program instance is executed with NumPy on the CPU. Results are
  correct, speed is meaningless, so the notebooks shrink the problem sizes
  (:func:`pick_size`) and show performance figures from recorded GPU runs instead.

Import order matters: ``triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is
*decorated*, so this module must run before any module that defines kernels. That is
why ``import helpers`` is the first line of every notebook.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

GPU = "gpu"
CPU = "cpu"


class SetupError(RuntimeError):
    """The installed software cannot run the course; the message says how to fix it."""


class NeedsGPUError(RuntimeError):
    """Raised by helpers that only make sense on a real GPU (timing, probes)."""


class InterpreterLimitationError(ValueError):
    """A request that Triton's interpreter (CPU mode) is known to get wrong."""


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def decide_mode(requested: str | None, cuda_available: bool, interpret_env: str | None) -> str:
    """The mode for a given environment; pure, so the tests can drive every branch.

    ``requested`` is ``COURSE_MODE`` (``"gpu"``, ``"cpu"`` or unset), ``interpret_env`` is
    ``TRITON_INTERPRET`` as the user left it.
    """
    if requested is not None:
        requested = requested.strip().lower()
        if requested not in (GPU, CPU):
            raise SetupError(
                f"COURSE_MODE={requested!r} is not a mode. Use COURSE_MODE=gpu, "
                "COURSE_MODE=cpu, or unset it to let the course decide."
            )
        if requested == GPU and not cuda_available:
            raise SetupError(
                "COURSE_MODE=gpu, but PyTorch sees no CUDA device. Check `nvidia-smi`, and "
                "that torch is a CUDA build (torch.version.cuda is not None); or unset "
                "COURSE_MODE to run in CPU mode."
            )
        if requested == GPU and interpret_env == "1":
            raise SetupError(
                "COURSE_MODE=gpu but TRITON_INTERPRET=1 is set, which would run every kernel "
                "in the interpreter. Unset TRITON_INTERPRET (or use COURSE_MODE=cpu)."
            )
        return requested
    if interpret_env == "1":
        return CPU  # the user asked for the interpreter explicitly
    return GPU if cuda_available else CPU


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_versions(mode: str, triton_version: str, numpy_version: str) -> None:
    """Stop with a clear message on combinations known to break the course."""
    if mode == CPU and _version_tuple(triton_version) < (3, 7) and _version_tuple(
        numpy_version
    ) >= (2, 4):
        raise SetupError(
            f"Triton {triton_version}'s interpreter crashes on kernels with loops under "
            f"NumPy {numpy_version} ('only 0-dimensional arrays can be converted to Python "
            "scalars'). CPU mode needs Triton >= 3.7, or NumPy < 2.4. Fix: run ./course lab, "
            "which installs the pinned versions, or `pip install 'triton>=3.7'`."
        )


def _import_triton():
    try:
        import triton
    except ImportError as err:
        raise SetupError(
            f"Triton is not installed, and no Triton wheel exists for {platform.system()} "
            f"{platform.machine()}: Triton ships for Linux x86_64 and aarch64 only. "
            "Run the course on Linux, in WSL 2 on Windows, or in a cloud notebook with a "
            "GPU (Colab, a cloud H100); CPU mode also works on any Linux machine."
        ) from err
    return triton


def _activate(mode: str) -> None:
    if mode == CPU:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            # Kernels decorated before this point would stay compiled kernels.
            import warnings

            warnings.warn(
                "triton was imported before helpers: kernels defined earlier will not run "
                "in the interpreter. Put `import helpers` first.",
                stacklevel=3,
            )
        os.environ["TRITON_INTERPRET"] = "1"
        # The interpreter computes with NumPy, which warns where a GPU silently gives inf
        # (exp of a large number in a GELU or a sigmoid): the result is the same, the
        # warning is noise, and random inputs would make it come and go between runs.
        import warnings

        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                module="triton.runtime.interpreter")
    import numpy

    triton = _import_triton()
    check_versions(mode, triton.__version__, numpy.__version__)
    if mode == GPU:
        import torch

        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (7, 5):
            raise SetupError(
                f"{torch.cuda.get_device_name()} has compute capability {major}.{minor}; "
                "Triton needs 7.5 or newer (a T4 or later). Run with COURSE_MODE=cpu to use "
                "the interpreter instead."
            )


MODE: str = decide_mode(
    os.environ.get("COURSE_MODE"), _cuda_available(), os.environ.get("TRITON_INTERPRET")
)
_activate(MODE)


def is_gpu() -> bool:
    return MODE == GPU


def is_cpu() -> bool:
    return MODE == CPU


def device() -> str:
    """Where tensors for kernels live: ``"cuda"`` in GPU mode, ``"cpu"`` in CPU mode."""
    return "cuda" if MODE == GPU else "cpu"


def pick_size(gpu, cpu):
    """The GPU-sized problem in GPU mode, the small one in CPU mode.

    The interpreter runs each program instance in Python, about a million times slower
    than the hardware, so CPU mode keeps problems small enough to finish in seconds.
    """
    return gpu if MODE == GPU else cpu


def check_dot_dtype(dtype) -> None:
    """Refuse bf16 ``tl.dot`` in CPU mode, where the interpreter gets it silently wrong."""
    import torch

    if MODE == CPU and dtype == torch.bfloat16:
        raise InterpreterLimitationError(
            "bf16 tl.dot gives silently wrong results in Triton's interpreter (CPU mode). "
            "Use torch.float16 or torch.float32 here; bf16 matrix products run on a GPU."
        )


def require_gpu(what: str) -> None:
    if MODE != GPU:
        raise NeedsGPUError(
            f"{what} needs a GPU: CPU mode runs kernels in Triton's interpreter, whose speed "
            "says nothing about the hardware. The notebooks show a recorded GPU run instead."
        )


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str
    triton: str
    numpy: str
    platform: str
    mode: str
    device: str

    def lines(self) -> list[str]:
        return [
            f"Python  {self.python}",
            f"torch   {self.torch}",
            f"triton  {self.triton}",
            f"numpy   {self.numpy}",
            f"system  {self.platform}",
            f"device  {self.device}",
            f"mode    {self.mode}",
        ]


def environment() -> Environment:
    import numpy
    import torch
    import triton

    if MODE == GPU:
        props = torch.cuda.get_device_properties(0)
        device_text = (
            f"{props.name} (compute capability {props.major}.{props.minor}, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda})"
        )
        mode_text = "GPU: kernels are compiled by Triton and timed for real"
    else:
        device_text = "no CUDA GPU" if not _cuda_available() else "CUDA GPU present but unused"
        mode_text = (
            "CPU: kernels run in Triton's interpreter (TRITON_INTERPRET=1); "
            "performance figures come from recorded GPU runs"
        )
    return Environment(
        python=sys.version.split()[0],
        torch=torch.__version__,
        triton=triton.__version__,
        numpy=numpy.__version__,
        platform=f"{platform.system()} {platform.machine()}",
        mode=mode_text,
        device=device_text,
    )


def report() -> None:
    """Print the environment: versions, device and mode."""
    print("\n".join(environment().lines()))
