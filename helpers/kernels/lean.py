"""Launching a compiled Triton kernel again without the JIT's Python work.

``kernel[grid](*args, **constexprs)`` is a JIT launch. On every call Triton binds the
arguments, works out how each one specialises the kernel (a pointer's 16-byte alignment,
an integer's divisibility by 16 or equality to 1, its 32- or 64-bit type), hashes all that
into a cache key, finds the compiled kernel and only then launches it. That Python is paid
on the host for every launch. Measured on the H200 machine (triton 3.6, bf16, batch 4, 16
heads, causal, 1,024 tokens, d = 64): issuing one call of the attention forward, a single
launch, took 68 us of host time while its kernel ran for 37 us; the backward's three
launches with autograd took about 700 us of host time for 172 us of kernels. At such sizes
the GPU waits for Python.

:class:`Lean` keeps the compiled kernel of a call's first launch, under a key of
everything the specialisation can read: each tensor's dtype, device and 16-byte alignment
and the exact value of every other argument (a stride, a length) but the floats, which
never specialise. A later call with the same key launches it directly,
``compiled[grid](...)``, as :mod:`~helpers.kernels.matmul.tuned` launches a kept plan. A
new length is a new key: one JIT launch, then direct ones.

The direct launch is kept only if it gives what the JIT launch gave: on the first call of
a key the kernel runs once more, directly, and the outputs must match bit for bit (the
same binary; a launcher of another Triton that took other arguments would not).
"""

from __future__ import annotations

import torch

from .. import runtime

# Kept kernels per launcher; past this many (a loop over ever new lengths) start afresh.
MAX_KEPT = 256


def _spec(x):
    """What of one argument can specialise the compiled kernel (floats never do)."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.device.index, x.data_ptr() % 16 == 0
    if isinstance(x, float):
        return float
    return x


class Lean:
    """``launch(grid, args, constexprs, options, outputs)`` of one ``@triton.jit`` kernel:
    through the JIT on a key's first call, then directly.

    ``args``: the kernel's arguments in order, up to its constexprs, which come last and
    are given by name in ``constexprs``; ``options``: ``num_warps`` and ``num_stages``;
    ``outputs``: the positions in ``args`` of the tensors the kernel writes (compared on a
    key's first call, and the kernel must write them whole, the same every run).
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.kept: dict = {}

    def __call__(self, grid: tuple, args: tuple, constexprs: dict, options: dict,
                 outputs: tuple = ()) -> None:
        rest = self.names[len(args):]
        if set(rest) != set(constexprs):
            raise TypeError(f"{self.names[0]}...: the arguments after the {len(args)} given "
                            f"are {rest}, the constexprs given {sorted(constexprs)}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if not runtime.is_gpu() or torch.cuda.is_current_stream_capturing():
            # The interpreter compiles nothing to keep; a CUDA graph being captured may not
            # read its outputs back, which the first direct launch's check does.
            self.kernel[grid](*args, **constexprs, **options)
            return
        key = (grid, tuple(_spec(x) for x in args), tuple(constexprs.items()),
               tuple(options.items()))
        compiled = self.kept.get(key)
        fixed = tuple(constexprs[name] for name in rest)    # in the kernel's order
        if compiled is not None:
            compiled[grid](*args, *fixed)
            return
        compiled = self.kernel[grid](*args, **constexprs, **options)
        if compiled is None or not self._same_again(compiled, grid, args, fixed, outputs):
            return
        if len(self.kept) >= MAX_KEPT:
            self.kept.clear()
        self.kept[key] = compiled

    @staticmethod
    def _same_again(compiled, grid, args, fixed, outputs) -> bool:
        """Whether a direct launch rewrites ``outputs`` exactly as the JIT launch did (if
        not, the JIT launch's outputs are put back)."""
        if not outputs:
            return False
        first = [args[i].clone() for i in outputs]
        try:
            compiled[grid](*args, *fixed)
            same = all(torch.equal(args[i], want) for i, want in zip(outputs, first))
        except Exception:       # noqa: BLE001 - a launcher that takes other arguments
            same = False
        if not same:
            for i, want in zip(outputs, first):
                args[i].copy_(want)
        return same
