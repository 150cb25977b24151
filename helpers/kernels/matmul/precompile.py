"""A tuner's candidates compiled side by side before it times them (GPU mode).

``triton.autotune`` compiles each candidate setting the first time it launches it, one
after another, and on a cold cache that is most of a new shape's first call: every
setting is a separate kernel (its tile sizes, warps and stages are compile-time
constants), and each goes through Triton's passes, LLVM and NVIDIA's ``ptxas`` before it
can be timed. The compilations do not depend on one another, so this module starts them
all at once in worker threads (Triton's ``AsyncCompileMode``, which PyTorch's Inductor
uses for the same purpose) and lets the tuner time the finished kernels as before: what
it times and keeps is unchanged, only the wait before the first timing is shorter.

The settings compiled are exactly those the tuner will time: its own configs, pruned by
its own ``early_config_prune``, with each config's ``pre_hook`` applied to copies of the
arguments (the persistent kernel's hook gives the TMA descriptors that setting's boxes,
which are part of the compiled kernel). A call whose key the tuner already knows (it
will launch its kept setting and time nothing) compiles nothing here.
"""

from __future__ import annotations

import copy
import functools
import os
from concurrent.futures import ThreadPoolExecutor

from triton.tools.tensor_descriptor import TensorDescriptor

try:                                    # Triton 3.4 and later
    from triton.runtime import _async_compile
except ImportError:                     # an older Triton compiles one setting at a time
    _async_compile = None

ENABLED = True
WORKERS = max(1, min(8, len(os.sched_getaffinity(0))))   # the cores this process may use


def known(tuner, named: dict) -> bool:
    """Whether ``tuner`` (a ``triton.autotune`` object) already kept a setting for a call
    with these arguments: its key as ``Autotuner.run`` builds it."""
    args = {k: v for k, v in named.items() if k in tuner.arg_names}
    key = [args[k] for k in tuner.keys if k in args]
    key += [str(v.dtype) for v in args.values() if hasattr(v, "dtype")]
    return tuple(key) in tuner.cache


def tuner_candidates(tuner, args: tuple, kwargs: dict) -> int:
    """Compile, side by side, every setting ``tuner`` will time for ``tuner[grid](*args,
    **kwargs)``; how many were submitted (0: nothing to do or no way to do it here).

    Only a head start: whatever goes wrong here (a Triton whose tuner reads its arguments
    otherwise, say) leaves the tuner to compile each setting itself, as it always could."""
    if not ENABLED or _async_compile is None:
        return 0
    try:
        calls = _warmups(tuner, args, kwargs)
    except Exception:                       # noqa: BLE001 - see the docstring
        return 0
    return side_by_side(calls) if calls else 0


def _warmups(tuner, args: tuple, kwargs: dict) -> list:
    """One ``warmup`` call per setting ``tuner`` will time for this call (none if it
    knows the call's key or keeps a single setting)."""
    named = {**dict(zip(tuner.arg_names, args)), **kwargs}
    if known(tuner, named):
        return []
    tuner.nargs = named
    try:
        configs = tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = None
    if len(configs) < 2:                    # one setting: the launch compiles it anyway
        return []
    calls = []
    for config in configs:
        call_args = args
        if config.pre_hook is not None:      # on copies: the caller's arguments stay as given
            hooked = {k: copy.copy(v) if isinstance(v, TensorDescriptor) else v
                      for k, v in named.items()}
            config.pre_hook({**hooked, **config.all_kwargs()})
            call_args = tuple(hooked[name] for name in tuner.arg_names[:len(args)])
        calls.append(functools.partial(tuner.fn.warmup, *call_args, grid=(1,), **kwargs,
                                       **config.all_kwargs()))
    return calls


def side_by_side(warmups: list) -> int:
    """Run each ``warmup`` (a kernel's ``.warmup(...)``: compile, do not launch) with its
    compilation in a worker thread; wait for all. A setting that fails to compile keeps its
    error, which the tuner's own launch of it raises and reports as it would have.

    Nothing is done while another compile mode is on (Inductor's, say): it is not ours to
    end."""
    if not warmups or _async_compile is None or _async_compile.active_mode.get() is not None:
        return 0
    with ThreadPoolExecutor(WORKERS) as pool:
        mode = _async_compile.AsyncCompileMode(pool)
        try:
            with mode:
                for warmup in warmups:
                    try:
                        warmup()
                    except Exception:       # noqa: BLE001 - the tuner's launch will say why
                        pass
        except Exception:                   # noqa: BLE001 - a compile failed: as above
            pass
        finally:
            _async_compile.active_mode.set(None)    # never leave later compiles deferred
            # Every compile that finished goes into its kernel cache as a compiled kernel:
            # the mode's exit stops at the first failure and would leave the rest as
            # futures, which a launcher that indexes a compiled kernel cannot use.
            for future in getattr(mode, "future_kernels", {}).values():
                try:
                    future.result()
                except Exception:           # noqa: BLE001 - kept as the failed future
                    pass
    return len(warmups)
