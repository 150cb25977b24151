"""Input checks for launchers: a wrong tensor gets a message that says how to fix it.

A Triton kernel trusts the pointers it is given. Handed a CPU tensor in GPU mode, a
non-contiguous view, or the wrong dtype, it reads garbage or crashes the process, so
every launcher checks first.
"""

from __future__ import annotations

import torch

from .. import runtime


def check_tensor(x, name: str, *, dtypes=None, ndim: int | None = None,
                 contiguous: bool = True) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    want = runtime.device()
    if x.device.type != want:
        hint = ("in GPU mode, create it with device='cuda' (or call .cuda())" if want == "cuda"
                else "in CPU mode (Triton's interpreter), keep it on the CPU: .cpu()")
        raise ValueError(f"{name} is on {x.device}, but kernels run on {want}: {hint}. "
                         "helpers.device() names the right device.")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(x.dtype).replace('torch.', '')}; this kernel "
                        f"takes {names}. Convert with .to(torch.float32), for example.")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"{name} is not contiguous (a transposed or sliced view); this kernel "
                         f"indexes it as one flat array. Pass {name}.contiguous().")


def check_32bit_offsets(x, name: str) -> None:
    """Kernels that compute ``row * stride + col`` in 32-bit integers (Triton's default for
    ``tl.arange`` and small arguments) reach at most 2^31 - 1 elements past the base: a
    larger tensor would wrap around to wrong addresses, so it gets an error instead."""
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(x.shape, x.stride())
                   if size > 0)
    if span > 2**31 - 1:
        raise ValueError(f"{name} spans {span:,} elements, past the 2^31 - 1 that this kernel's "
                         "32-bit offsets reach. Split the work into blocks (rows of A and C), "
                         "or use torch.matmul for this size.")


def check_same_shape(a, b, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")


def check_power_of_two(name: str, value, *, minimum: int = 1,
                       why: str = "tl.arange needs one") -> None:
    """Block sizes and warp counts: a power of two of at least ``minimum``, or a clear error."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or value & (value - 1)):
        least = f" of at least {minimum}" if minimum > 1 else ""
        raise ValueError(f"{name} must be a power of two{least} ({why}), got {value!r}")


def check_num_warps(num_warps) -> None:
    """Warps per program: a power of two from 1 to 32 (at most 1024 threads a program)."""
    if num_warps not in (1, 2, 4, 8, 16, 32) or isinstance(num_warps, bool):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
