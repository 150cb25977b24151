"""Assignment 04's design parts: the learner's tile for the H100, judged on their kernel
compiled for sm_90 (part 3, no GPU needed), and its speed beside cuBLAS (part 4, GPU).

Part 3 needs no GPU: Triton compiles for the H100 on any machine (:mod:`helpers.compiled`),
and the compiled kernel says how much shared memory and how many registers one program
takes. The kernel compiled is the one the learner's ``linear`` launches, with
``H100_CONFIG``'s block sizes, stages and warps, specialized as a launch on contiguous
4096 x 4096 fp16 matrices would be. Also :func:`tile_values`, the napkin numbers of one tile
with the values known slips give (part 1's key and part 3's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F

from ... import bounds, compiled, dtypes, hardware, intensity, runtime
from ...feedback import Feedback, graded_number, target
from ...kernels.matmul.config import TileConfig
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import MissingAnswer, answer, collect_answers

FP16 = torch.float16

# Part 3: the H100 choice, compiled for sm_90 as a contiguous 4096^3 fp16 launch.
H100 = hardware.GPUS["H100-SXM"]
CAPABILITY = 90
FIT_TOLERANCE = 0.10        # compiled shared memory vs the derived SRAM
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")

# Part 4: a shape the notebook never times, against F.linear. Measured at f92a519 (fp16,
# do_bench, one process): a tiled kernel with pointer loads reaches 0.93-1.04x cuBLAS when
# its B is stored K x N (lesson 04's layout), but 0.69-0.73x when it reads W as nn.Linear
# stores it (N x K, K contiguous) with 128 x 256 x 64 or 256 x 128 x 64 tiles, 3-4 stages,
# 8 warps, on an H100 at 4096^3 and 8192^3 (0.67-0.71x on an H200); 128 x 128 x 64 with 4
# warps, or BLOCK_K = 32, reach 0.56-0.60x. The goal sits between the two.
SPEED_SHAPE = (8192, 8192, 8192)
SPEED_GOAL = 0.65



def tile_values(tile, stages: int, dtype) -> dict:
    """``{"intensity": ..., "sram": ...}`` of one tile, each ``(value, relative tolerance,
    [(value of a known slip, what it means)])``, the answer-key format; part 1's tile
    (:mod:`keys_tiling`, sealed in a release) and the learner's own (part 3)."""
    bm, bn, bk = tile
    s, name = dtype.itemsize, dtypes.dtype_key(dtype)
    flops, step = 2 * bm * bn * bk, intensity.sram_bytes(bm, bn, bk, dtype)   # one stage
    ai, sram = flops / step, intensity.sram_bytes(bm, bn, bk, dtype, stages)
    return {"intensity": (ai, 0.02, [
        (ai / 2, f"you count one FLOP per multiply-add (it is two), or 4 bytes per element "
                 f"({name} is {s})"),
        (flops / (bm * bk * s), "you count the A tile's bytes only: the B tile is loaded too"),
        (flops / (bn * bk * s), "you count the B tile's bytes only: the A tile is loaded too"),
        (1 / ai, "you divide bytes by FLOPs: intensity is FLOPs per byte"),
        (ai / 8, "you count bits, not bytes")]),
        "sram": (sram, 0.02, [
        (step, f"you count one stage: each of the {stages} stages has its own A and B tiles"),
        (sram + bm * bn * 4, "you add the fp32 accumulator: it lives in registers, not "
                             "shared memory"),
        (stages * bm * bn * s, "you count a tile of C: the stages hold tiles of A and B"),
        (2 * sram, f"you use 4 bytes per element: {name} is {s}"),
        (8 * sram, "you count bits, not bytes"), (sram / 1024, "you give KiB; the answer is "
                                                             "in bytes")])}



def read_config(config) -> dict | str:
    """``H100_CONFIG`` as ints, or what is wrong with it."""
    if not isinstance(config, dict):
        return f"H100_CONFIG should be a dict, not {type(config).__name__}"
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        return f"H100_CONFIG has no {', '.join(missing)} (it needs {', '.join(CONFIG_KEYS)})"
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in config.values()):
        return f"every value of H100_CONFIG should be a positive int: {config!r:.120}"
    return dict(config)


def collect_fit(ns, seed):
    """In the learner's process: the H100 numbers, and the kernel ``linear`` launches
    compiled for sm_90 with ``H100_CONFIG``, its arguments those of a launch on fp16
    operands whose sizes and strides are multiples of 16 (specialized as a 4096^3 launch
    would be: the strides of 1 constants, the rest divisible by 16)."""
    raw = {"answers": collect_answers(("h100_intensity", "h100_sram_bytes"), ns)}
    try:
        config, fn = read_config(answer(ns, "H100_CONFIG")), answer(ns, "linear")
    except MissingAnswer as missing:        # judged "not implemented", part by part
        return dict(raw, missing=missing.name)
    raw["config"] = config
    g = harness.generator(seed)
    x, w, bias = (torch.randn(s, generator=g).to(FP16) for s in ((64, 80), (48, 80), (48,)))
    with bounds.watch(guard=False) as log:
        try:
            fn(*(t.to(runtime.device()) for t in (x, w, bias)))
        except Exception as err:  # noqa: BLE001 - the learner's error, reported
            raw["launch_error"] = f"{type(err).__name__}: {str(err)[-300:]}"
    own = [launch for launch in log.launches if launch.defined_in(ns)]
    raw["launched"] = [launch.name for launch in own]
    if own and isinstance(config, dict):
        launch = own[0]
        options = {k: v for k, v in config.items() if k in ("num_warps", "num_stages")}
        try:
            found = compiled.resources(
                ns[launch.name], signature={**launch.tensors, **launch.scalars},
                constexprs={**launch.constexprs, **{k: v for k, v in config.items()
                                                     if k not in options}},
                capability=CAPABILITY, **options)
            raw["resources"] = asdict(found)
        except compiled.CompileToolError as err:
            raw["tool_error"] = str(err)
    return raw


def _tile(raw) -> TileConfig:
    """``H100_CONFIG`` as the kernels' tile setting (checked: blocks powers of two, ...)."""
    if raw.get("missing"):
        raise MissingAnswer(raw["missing"])
    config = raw["config"]
    if isinstance(config, str):
        raise ValueError(config)
    return TileConfig.from_dict(config, strict=False)


def _design_key(raw):
    """The learner's own tile: its numbers (fp16) and the values known slips give."""
    t = _tile(raw)
    values = tile_values((t.block_m, t.block_n, t.block_k), t.num_stages, FP16)
    return answers.exact_key({"3a": values["intensity"], "3b": values["sram"]})


def design_intensity(raw):
    return graded_number("3a intensity of your H100 tile",
                         answer(raw["answers"], "h100_intensity"), _design_key(raw)["3a"],
                         unit="FLOP/byte", hint="the formula of part 1 on H100_CONFIG's tile")


def design_sram(raw):
    part = "3b SRAM per program of your H100 tile"
    got = answer(raw["answers"], "h100_sram_bytes")
    fb = graded_number(part, got, _design_key(raw)["3b"], unit="bytes",
                       hint="the formula of part 1 with H100_CONFIG's tile and stages")
    shared = (raw.get("resources") or {}).get("shared_bytes")
    if fb.passed and shared is not None and abs(shared - got) > FIT_TOLERANCE * max(shared, got):
        return Feedback(part, False, f"the model is right, but the compiled kernel asks for "
                        f"more than {FIT_TOLERANCE:.0%} more or less: does your kernel load its "
                        "A and B tiles in the K loop and use them (tl.dot), and keep no other "
                        "tiles in shared memory?")
    return fb


def _compiled(raw, part) -> compiled.Resources | Feedback:
    if raw.get("missing"):
        raise MissingAnswer(raw["missing"])
    if isinstance(raw["config"], str):
        return Feedback(part, False, raw["config"])
    if not raw["launched"]:
        why = raw.get("launch_error") or "it launched no @triton.jit kernel of the notebook"
        return Feedback(part, False, f"the fit is that of the kernel linear launches: {why}")
    if raw.get("tool_error"):
        return Feedback(part, False, f"your kernel could not be compiled: {raw['tool_error']}")
    return compiled.Resources(**raw["resources"])


def fits(raw):
    part = "3c fits the H100's shared memory"
    found = _compiled(raw, part)
    if isinstance(found, Feedback):
        return found
    limit = compiled.limits(CAPABILITY)["smem_per_block"]
    if found.error:
        return Feedback(part, False, f"compiled for sm_90 with H100_CONFIG: {found.error}. "
                        "Each stage holds one A and one B tile: fewer stages or a smaller "
                        "BLOCK_K brings it under the limit")
    occ = compiled.occupancy(found, H100)
    # Not the compiled byte count: that is part 3b's answer.
    return Feedback(part, True, f"compiled for sm_90: within the {limit:,} B a program may "
                    f"use, {occ.by_shared} program(s) per SM by shared memory")


def registers(raw):
    part = "3d registers without spills"
    found = _compiled(raw, part)
    if isinstance(found, Feedback):
        return found
    if found.registers_per_thread is None:
        return Feedback(part, False, f"your kernel does not compile for sm_90: {found.error}")
    tile = _tile(raw)
    bm, bn, acc = tile.block_m, tile.block_n, tile.accumulator_registers()
    if found.spills:
        spilled = "some" if found.spilled_bytes is None else f"{found.spilled_bytes:,}"
        return Feedback(part, False, f"{found.registers_per_thread} registers per thread and "
                        f"{spilled} bytes spilled to local memory: the "
                        f"fp32 accumulator alone takes {acc} registers per thread ({bm} x {bn} "
                        f"over {found.num_warps} warps of 32), of {compiled.MAX_REGISTERS_PER_THREAD}"
                        ". More warps or a smaller tile")
    occ = compiled.occupancy(replace(found, error=None), H100)
    if min(occ.by_registers, occ.by_warps) < 1:
        return Feedback(part, False, f"{found.registers_per_thread} registers x 32 threads x "
                        f"{found.num_warps} warps is more than an SM's register file: fewer warps")
    return Feedback(part, True, f"{found.registers_per_thread} registers per thread, no "
                    f"spills; {occ.programs_per_sm} program(s) per SM, limited by "
                    f"{occ.limited_by}")


# Part 4 (GPU): speed at a large fp16 shape, side by side with F.linear.


def measure_speed(fn, shape=SPEED_SHAPE, dtype=FP16) -> dict:
    """Time ``fn(x, weight, bias)`` and ``F.linear`` on the same random inputs of ``shape``,
    (M, N, K) with x M x K and weight N x K (GPU)."""
    from ... import bench

    runtime.require_gpu("timing a linear layer")
    M, N, K = shape
    g = harness.generator(900)
    x = torch.randn(M, K, generator=g).to(dtype).to("cuda")
    w = torch.randn(N, K, generator=g).to(dtype).to("cuda")
    bias = torch.randn(N, generator=g).to(dtype).to("cuda")
    # |Y| grows as sqrt(K): about 350 at K = 4096, where fp16 steps are 0.25; a correct
    # kernel lands a few steps from cuBLAS's differently ordered sum.
    atol, rtol = 0.5 * math.sqrt(K / 4096), 0.02
    with gpu_lock():
        y, want = fn(x, w, bias).float(), F.linear(x, w, bias).float()
        ok = torch.allclose(y, want, atol=atol, rtol=rtol)
        err = (y - want).abs().max().item()
        yours = bench.time_ms(lambda: fn(x, w, bias))
        cublas = bench.time_ms(lambda: F.linear(x, w, bias))
    flops = intensity.matmul(M, N, K, dtype).flops
    return {"ok": ok, "max_abs_error": err, "allowed": f"{atol:.2g} + {rtol:.0%} of the value",
            "yours_ms": yours, "cublas_ms": cublas, "ratio": cublas / yours,
            "yours_tflops": bench.tflops(flops, yours),
            "cublas_tflops": bench.tflops(flops, cublas),
            "gpu": torch.cuda.get_device_name(), "shape": list(shape)}


def collect_speed(ns, seed):
    """In the learner's process: time ``linear`` beside F.linear (GPU)."""
    return measure_speed(answer(ns, "linear"))


def speed(raw):
    part = "4 speed at a large fp16 shape"
    shape = "x".join(map(str, raw.get("shape") or SPEED_SHAPE))
    if not raw.get("ok"):
        return Feedback(part, False, f"linear is wrong at {shape} fp16 on the GPU: up to "
                        f"{raw.get('max_abs_error', float('nan')):.3g} from F.linear "
                        f"(allowed: {raw.get('allowed')})")
    ratio = float(raw["ratio"])
    text = (f"{shape} on {raw.get('gpu')}: yours {raw['yours_tflops']:,.0f} TFLOP/s, "
            f"F.linear {raw['cublas_tflops']:,.0f}: {ratio:.2f}x (the goal is "
            f"{SPEED_GOAL:.0%})")
    return target(part, ratio >= SPEED_GOAL, text,
                  "Part 3 passing means the choice fits, not that it is fast: lesson 04's "
                  "knob table shows what tile, stages and warps do on an H100")


