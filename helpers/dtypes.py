"""Data types: their names, their sizes, and which ones the course's kernels take.

One home for every question about a dtype, so that a kernel, an experiment and the
napkin math all spell ``"bf16"`` and count its 2 bytes the same way. It imports only
torch, so kernels may use it too.

The course names a dtype by a short key (``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``,
``"fp8"``), the names of the datasheets' throughput columns. ``tf32`` is not a storage
type: it is how the tensor cores round fp32 inputs (10 mantissa bits), and a tf32 value
is stored in 4 bytes like any fp32 value.
"""

from __future__ import annotations

import torch

# The short keys, from the CUDA cores' fp32 up to Hopper's fp8.
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")

# What the course's kernels load and store: every launcher accepts exactly these.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Bytes per element of each key (tf32 is stored as fp32).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

# The torch dtype that stores each key's values.
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}

_ALIASES = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "fp8": "fp8",
}


def dtype_key(dtype) -> str:
    """``torch.float16`` / ``"float16"`` / ``"fp16"`` -> ``"fp16"``."""
    text = str(dtype).replace("torch.", "").lower()
    if text not in _ALIASES:
        raise ValueError(f"unknown data type {dtype!r}; use one of {', '.join(DTYPES)}")
    return _ALIASES[text]


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype for a key (``"bf16"`` -> ``torch.bfloat16``); a torch dtype as is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return TORCH_DTYPES[dtype_key(dtype)]


def element_size(dtype) -> int:
    """Bytes per element of ``dtype``: a torch dtype or a key such as ``"bf16"``."""
    return ELEMENT_BYTES[dtype_key(dtype)]

