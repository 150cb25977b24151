"""A Triton kernel compiled for a GPU on a machine without one, and what the compiler made.

Shared memory, registers per thread and spills decide whether a tile choice fits a GPU and
how many programs share an SM. They are facts of the compiled kernel, not of the Python
source, and Triton can produce them without a GPU: ``triton.compile`` lowers a kernel for
any target (here ``GPUTarget("cuda", 90, 32)``, an H100), ``metadata.shared`` is the
shared memory a program asks for, and the CUDA tools Triton ships read the registers out
of the binary (``cuobjdump -res-usage``) and the spills out of ``ptxas -v``.

In CPU mode helpers sets ``TRITON_INTERPRET=1`` before Triton is imported, and every
``@triton.jit`` function, triton.language's own included, becomes an interpreter function
that cannot be compiled. So the compiling happens in a fresh Python process (this file run
by path, in isolated mode, never importing helpers) whose environment has
``TRITON_INTERPRET=0``: it gets the kernel's source text and that of the ``@triton.jit``
helpers it calls, compiles, and answers in JSON.

* :func:`resources`: compile ``kernel`` with its constexprs and launch options ->
  :class:`Resources` (or the compiler's error in ``error``); :func:`resources_many`: several
  settings of one kernel, compiled in one process;
* :func:`occupancy`: how many programs fit on one SM, and which limit binds (Triton's
  tutorial 02, "fused softmax", computes it the same way).

This module imports only the standard library (Triton in the compiling process), so that
running it by path cannot switch the interpreter on.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Per compute capability, from the CUDA C++ Programming Guide, "Technical Specifications
# per Compute Capability" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/):
# 32-bit registers per SM, resident warps per SM, resident blocks (programs) per SM, and
# the most shared memory one block may use (all of the SM's but 1 KiB, reserved by the
# system for each block, from 8.0 on).
SM_LIMITS = {
    90: {"registers": 65536, "warps": 64, "blocks": 32, "smem_per_block": 227 * 1024},
    89: {"registers": 65536, "warps": 48, "blocks": 24, "smem_per_block": 99 * 1024},
    86: {"registers": 65536, "warps": 48, "blocks": 16, "smem_per_block": 99 * 1024},
    80: {"registers": 65536, "warps": 64, "blocks": 32, "smem_per_block": 163 * 1024},
    75: {"registers": 65536, "warps": 32, "blocks": 16, "smem_per_block": 64 * 1024},
}
RESERVED_SMEM_PER_BLOCK = 1024      # the same guide: from 8.0 on, per resident block
MAX_REGISTERS_PER_THREAD = 255      # beyond this ptxas spills to local memory
WARP_SIZE = 32
TIMEOUT_S = 300

_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
          "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
          "bool": "i1", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


class CompileToolError(RuntimeError):
    """The kernel could not be handed to the compiler: what is wrong, and how to fix it."""


@dataclass(frozen=True)
class Resources:
    """What one program of a kernel compiled for ``sm_<capability>`` needs."""

    kernel: str
    capability: int
    num_warps: int
    num_stages: int
    shared_bytes: int | None = None        # dynamic shared memory per program
    registers_per_thread: int | None = None
    spilled_bytes: int | None = None       # spill stores (ptxas -v); None if not read
    stack_bytes: int | None = None         # the stack frame (spills live there)
    error: str | None = None               # the compiler's words if it does not fit/compile
    ptx: str | None = None                 # the PTX itself, when asked for (``ptx=True``)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def spills(self) -> bool:
        """Spill stores if ptxas said, else a stack frame (where spills live) at all."""
        if self.spilled_bytes is not None:
            return self.spilled_bytes > 0
        return bool(self.stack_bytes)

    def lines(self) -> list[str]:
        head = f"{self.kernel} on sm_{self.capability}, {self.num_warps} warps, " \
               f"{self.num_stages} stages"
        if self.error:
            return [head, f"does not compile: {self.error}"]
        spill = "no spills" if self.spilled_bytes == 0 else (
            "spills unknown" if self.spilled_bytes is None else f"{self.spilled_bytes:,} B spilled")
        return [head, f"shared memory {self.shared_bytes:,} B per program, "
                      f"{self.registers_per_thread} registers per thread, {spill}"]


@dataclass(frozen=True)
class Occupancy:
    """Programs of one kernel resident on one SM, by each limit."""

    by_registers: int
    by_shared: int
    by_warps: int
    by_blocks: int

    @property
    def programs_per_sm(self) -> int:
        return min(self.by_registers, self.by_shared, self.by_warps, self.by_blocks)

    @property
    def limited_by(self) -> str:
        """The binding limit: registers, shared memory, warps or blocks (all that tie)."""
        named = {"registers": self.by_registers, "shared memory": self.by_shared,
                 "warps": self.by_warps, "blocks": self.by_blocks}
        return " and ".join(k for k, v in named.items() if v == self.programs_per_sm)


def limits(capability: int) -> dict:
    if capability not in SM_LIMITS:
        raise CompileToolError(f"no SM limits for compute capability {capability}; known: "
                               f"{', '.join(map(str, sorted(SM_LIMITS)))}")
    return SM_LIMITS[capability]


def occupancy(resources: Resources, spec) -> Occupancy:
    """Programs per SM of ``resources`` on ``spec`` (a :class:`helpers.hardware.GPUSpec`).

    Each limit on its own: the register file over the registers of one program
    (registers per thread x 32 x warps), the SM's shared memory over one program's (plus
    the 1 KiB reserved per block), the resident warps over the program's warps, and the
    resident-block limit.
    """
    if not resources.ok:
        raise ValueError(f"{resources.kernel} did not compile: {resources.error}")
    major, minor = spec.compute_capability
    lim = limits(10 * major + minor)
    regs = (resources.registers_per_thread or 0) * WARP_SIZE * resources.num_warps
    shared = (resources.shared_bytes or 0) + RESERVED_SMEM_PER_BLOCK
    return Occupancy(
        by_registers=lim["registers"] // regs if regs else lim["blocks"],
        by_shared=spec.smem_per_sm_bytes // shared,
        by_warps=lim["warps"] // resources.num_warps,
        by_blocks=lim["blocks"])


# ------------------------------------------------------------------------------------
# In this process: the kernel's source, its signature, the cache.
# ------------------------------------------------------------------------------------

_cache: dict[str, Resources] = {}


def _python_function(kernel):
    fn = getattr(kernel, "fn", None)
    if not callable(fn) or not hasattr(kernel, "arg_names"):
        raise CompileToolError(f"{getattr(kernel, '__name__', kernel)!r} is not a Triton kernel: "
                               "pass the @triton.jit function itself (matmul_kernel, not "
                               "matmul_kernel[grid] nor the launcher)")
    return fn


def _source(fn) -> str:
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError) as err:
        raise CompileToolError(f"the source of {fn.__name__} cannot be read ({err}): define "
                               "the kernel in a file or a notebook cell") from err
    return inspect.cleandoc("\n" + text) if text[:1].isspace() else text


def _module_text(kernel) -> tuple[str, str]:
    """Python source defining ``kernel``, the @triton.jit functions it calls and the plain
    constants it reads, ready to be compiled elsewhere; and the kernel's name."""
    lines, seen, order = ["import math", "import triton", "import triton.language as tl"], set(), []

    def visit(jit):
        fn = _python_function(jit)
        if fn in seen:
            return
        seen.add(fn)
        for name in fn.__code__.co_names:
            value = fn.__globals__.get(name)
            if value is None or hasattr(builtins, name):
                continue
            if hasattr(value, "fn") and hasattr(value, "arg_names"):
                visit(value)
            elif type(value).__name__ == "module" and value.__name__.split(".")[0] in (
                    "triton", "math"):
                lines.append(f"import {value.__name__} as {name}")
            elif isinstance(value, (bool, int, float, str)):
                lines.append(f"{name} = {value!r}")
            elif type(value).__name__ == "constexpr":
                lines.append(f"{name} = tl.constexpr({value.value!r})")
        order.append(_source(fn))

    visit(kernel)
    return "\n".join(lines) + "\n\n\n" + "\n\n\n".join(order) + "\n", kernel.fn.__name__


def _arg_type(name: str, value) -> tuple[str, object, bool]:
    """(Triton type, constant or None, divisible by 16) of one argument, as a launch would
    specialize it: a tensor is a pointer (16-byte aligned), an int 1 a constant, an int
    that is a multiple of 16 is marked so (it lets the compiler vectorize the loads)."""
    if isinstance(value, str):
        return value, None, value.startswith("*")
    if isinstance(value, bool):
        return "i1", None, False
    if isinstance(value, int):
        if value == 1:
            return "constexpr", 1, False
        return ("i32" if -2**31 <= value < 2**31 else "i64"), None, value % 16 == 0
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "data_ptr"):
        key = str(dtype).replace("torch.", "")
        if key not in _TYPES:
            raise CompileToolError(f"argument {name}: tensors of {dtype} are not supported here")
        return "*" + _TYPES[key], None, True
    if isinstance(value, float):
        return "fp32", None, False
    raise CompileToolError(f"argument {name}: give a Triton type ('*fp16', 'i32'), an int or a "
                           f"tensor, not {type(value).__name__}")


def _specialize(kernel, signature: dict, constexprs: dict):
    _python_function(kernel)
    arg_names = list(kernel.arg_names)
    unknown = sorted((set(signature) | set(constexprs)) - set(arg_names))
    if unknown:
        raise CompileToolError(f"{kernel.fn.__name__} has no argument {', '.join(unknown)}; "
                               f"its arguments: {', '.join(arg_names)}")
    params = inspect.signature(kernel.fn).parameters
    sig, consts, aligned = {}, {}, []
    for i, name in enumerate(arg_names):
        annotation = str(params[name].annotation)
        if "constexpr" in annotation:
            if name not in constexprs:
                if params[name].default is inspect.Parameter.empty:
                    raise CompileToolError(f"missing constexpr {name} of {kernel.fn.__name__}: "
                                           f"pass constexprs={{'{name}': ...}}")
                consts[name] = params[name].default
            else:
                consts[name] = constexprs[name]
            sig[name] = "constexpr"
            continue
        if name not in signature:
            raise CompileToolError(f"missing argument {name} of {kernel.fn.__name__}: give its "
                                   "type ('*fp16', 'i32'), an example int or a tensor in signature")
        kind, const, divisible = _arg_type(name, signature[name])
        sig[name] = kind
        if const is not None:
            consts[name] = const
        if divisible:
            aligned.append(i)
    return sig, consts, aligned


def resources(kernel, *, signature: dict, constexprs: dict, num_warps: int = 4,
              num_stages: int = 3, capability: int = 90, ptx: bool = False) -> Resources:
    """``kernel`` compiled for ``sm_<capability>`` with these options: what it needs.

    ``signature`` gives every argument that is not a constexpr: a Triton type (``"*fp16"``,
    ``"i32"``), an example int (1 becomes a constant and a multiple of 16 is marked
    divisible, as a launch specializes them: a stride of 1 is what lets the compiler copy
    tiles asynchronously) or a tensor (its pointer type). ``constexprs`` gives the
    ``tl.constexpr`` arguments. A kernel that does not compile, or asks for more shared
    memory than one program may have on that GPU, comes back with ``error`` set.
    ``ptx=True``: the PTX comes back too (``Resources.ptx``), to read what was generated.
    """
    (found,) = resources_many(kernel, [dict(signature=signature, constexprs=constexprs,
                                            num_warps=num_warps, num_stages=num_stages,
                                            capability=capability, ptx=ptx)])
    return found


def resources_many(kernel, calls: list[dict]) -> list[Resources]:
    """:func:`resources` of ``kernel`` for each of ``calls`` (each the keyword arguments of
    one :func:`resources` call), in order. Those not in the cache are compiled one after
    another in one compiling process: its first kernel pays for starting the compiler
    (about half a second), the others do not. Each still gets a cache of its own, so
    ptxas runs for every one and tells its spills."""
    requests = [_request(kernel, **call) for call in calls]
    todo = {key: job for key, job in requests if key not in _cache}
    for (key, job), got in zip(todo.items(), _compile_elsewhere(list(todo.values()))):
        lim = limits(job["capability"])
        shared = got.get("shared_bytes")
        if got.get("error") is None and shared is not None and shared > lim["smem_per_block"]:
            got["error"] = (f"out of resource: shared memory, Required: {shared}, Hardware "
                            f"limit: {lim['smem_per_block']} (sm_{job['capability']}: one "
                            "program may use all of an SM's shared memory but 1 KiB). Reducing "
                            "block sizes or num_stages may help")
        _cache[key] = Resources(kernel=job["kernel"], capability=job["capability"],
                                num_warps=job["num_warps"], num_stages=job["num_stages"], **got)
    return [_cache[key] for key, _ in requests]


def _request(kernel, *, signature: dict, constexprs: dict, num_warps: int = 4,
             num_stages: int = 3, capability: int = 90, ptx: bool = False) -> tuple[str, dict]:
    """The compiling process's job for one :func:`resources` call, and its cache key."""
    limits(capability)
    sig, consts, aligned = _specialize(kernel, signature, constexprs)
    text, name = _module_text(kernel)
    job = {"source": text, "kernel": name, "signature": sig, "constexprs": consts,
           "aligned": aligned, "num_warps": int(num_warps), "num_stages": int(num_stages),
           "capability": int(capability), "ptx": bool(ptx)}
    key = hashlib.sha256(json.dumps(job, sort_keys=True, default=repr).encode()).hexdigest()
    return key, job


def matmul_resources(kernel, config: dict, *, constexprs: dict | None = None, n: int = 4096,
                     dtype: str = "fp16", capability: int = 90) -> Resources:
    """A matmul kernel compiled as a launch on contiguous ``n x n`` matrices would be.

    The kernel takes, before its constexprs, the pointers of A, B and C, then M, N, K and
    the strides of A, B and C (the course's signature): the strides of 1 become constants
    and the others multiples of 16, as a launch specializes them. ``config`` holds the
    constexprs (``BLOCK_M``, ...) and ``num_warps``, ``num_stages``; ``constexprs`` any
    others the kernel takes (``GROUP_M``). :func:`matmul_call` gives the arguments, for
    :func:`resources_many`.
    """
    return resources(kernel, **matmul_call(kernel, config, constexprs=constexprs, n=n,
                                           dtype=dtype, capability=capability))


def matmul_call(kernel, config: dict, *, constexprs: dict | None = None, n: int = 4096,
                dtype: str = "fp16", capability: int = 90) -> dict:
    """The keyword arguments of :func:`resources` that :func:`matmul_resources` passes."""
    fn = _python_function(kernel)
    params = [p for p, v in inspect.signature(fn).parameters.items()
              if "constexpr" not in str(v.annotation)]
    signature = {p: f"*{dtype}" for p in params[:3]}
    ints = [n] * 3 + [n, 1] * 3 if len(params) == 12 else ["i32"] * (len(params) - 3)
    signature.update(zip(params[3:], ints))
    options = {k: v for k, v in config.items() if k in ("num_warps", "num_stages")}
    consts = {**(constexprs or {}), **{k: v for k, v in config.items() if k not in options}}
    return dict(signature=signature, constexprs=consts, capability=capability, **options)


def _compile_elsewhere(jobs: list[dict]) -> list[dict]:
    """Each job's answer, from one compiling process that takes them in turn."""
    if not jobs:
        return []
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_MODE", "TRITON_INTERPRET")}
    env["TRITON_INTERPRET"] = "0"
    with tempfile.TemporaryDirectory(prefix="course-compile-") as tmp:
        done = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), tmp],
                              input=json.dumps(jobs), capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S * len(jobs), cwd=tmp)
    answer = done.stdout.strip().splitlines()[-1:] if done.stdout else []
    try:
        got = json.loads(answer[0])
    except (IndexError, ValueError):
        got = None
    if not isinstance(got, list) or len(got) != len(jobs):
        raise CompileToolError("the compiling process failed: "
                               + (done.stderr.strip()[-800:] or f"exit {done.returncode}"))
    for one in got:
        if "tool_error" in one:
            raise CompileToolError(one["tool_error"])
    return got


# ------------------------------------------------------------------------------------
# In the compiling process (this file run by path, TRITON_INTERPRET=0).
# ------------------------------------------------------------------------------------

def _read_tools(cubin: bytes, log: str, folder: str) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    if not os.path.exists(tool):
        raise CompileToolError(f"cuobjdump is missing ({tool}): it comes with Triton's NVIDIA "
                               "backend; reinstall triton (./course env)")
    path = os.path.join(folder, "kernel.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    if regs is None:
        raise CompileToolError(f"cuobjdump gave no register count: {usage[-300:]!r}")
    spill = re.search(r"(\d+) bytes spill stores", log)
    return {"registers_per_thread": int(regs.group(1)),
            "stack_bytes": int(stack.group(1)) if stack else None,
            "spilled_bytes": int(spill.group(1)) if spill else None}


def _work(job: dict, folder: str) -> dict:
    import contextlib
    import importlib.util
    import io

    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"      # ptxas -v: the spill stores
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = os.path.join(folder, "course_kernel.py")
    with open(path, "w") as f:
        f.write(job["source"])
    spec = importlib.util.spec_from_file_location("course_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, job["kernel"])
    attrs = {(i,): [["tt.divisibility", 16]] for i in job["aligned"]}
    names = list(job["signature"])           # constexprs by position: every Triton 3.x
    constexprs = {(names.index(k),): v for k, v in job["constexprs"].items()}
    source = ASTSource(fn=fn, signature=job["signature"], constexprs=constexprs, attrs=attrs)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(source, target=GPUTarget("cuda", job["capability"], 32),
                                      options={"num_warps": job["num_warps"],
                                               "num_stages": job["num_stages"]})
    except Exception as err:  # noqa: BLE001 - the compiler's words are the answer
        words = str(err).strip()
        return {"error": f"{type(err).__name__}: {words[-1500:]}"}
    return {"shared_bytes": int(compiled.metadata.shared),
            **_read_tools(compiled.asm["cubin"], log.getvalue(), folder),
            **({"ptx": compiled.asm["ptx"]} if job.get("ptx") else {})}


def _main() -> None:
    answers = []
    for i, job in enumerate(json.loads(sys.stdin.read())):
        folder = os.path.join(sys.argv[1], str(i))
        os.makedirs(folder)
        # A private cache for each kernel: a cached kernel skips ptxas, whose log tells the
        # spills (Triton reads the variable at each compile).
        os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "cache")
        try:
            answers.append(_work(job, folder))
        except CompileToolError as err:
            answers.append({"tool_error": str(err)})
    print(json.dumps(answers))


if __name__ == "__main__":
    _main()
