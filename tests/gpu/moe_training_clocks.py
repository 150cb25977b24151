"""Whether the MoE training step slows down as the GPU heats: a probe, not a test.

The moe_training record's 8-expert step (T = 4096, bf16, H200) reads 16.6 ms under
do_bench while the same step's kernels, profiled over three steps, sum to 14.3 ms;
torch._grouped_mm's step reads 14.1 ms over 13.3 ms. This runs each version's step
back to back for a few seconds under torch.profiler while ``nvidia-smi`` samples the SM
clock and the board power every 50 ms, then prints, per kernel name, its mean time in the
first three steps and in the last ten, with the clock and power over the same stretches.

Found on an H200 (x then without grad, so torch's backward skipped dx's GEMM): our
kernels grew from 14.1 to 16.1 ms a step as the SM clock fell 1,980 -> 1,562 MHz at 649 W,
torch's from 13.2 to 14.2 ms at 1,718 MHz and 680 W. Both probes now give x a gradient,
as the record does.

    python3 tests/gpu/moe_training_clocks.py [--shape few_large] [--tokens 4096] [--steps 120]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402

from helpers.experiments.moe import SHAPES  # noqa: E402
from moe_training_gaps import versions_steps  # noqa: E402 - the same steps, beside this file


def sampled(step, steps: int):
    """Kernel events of ``steps`` back-to-back steps, one list per step, and the clock
    samples ``(seconds since start, MHz, W)`` taken while they ran."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    start = time.time()
    marks = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
            step()
        torch.cuda.synchronize()
    took = time.time() - start
    smi.terminate()
    lines = smi.communicate()[0].split("\n")
    samples = [tuple(float(v) for v in ln.split(",")) for ln in lines if ln.count(",") == 1]
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        kernels = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"),
                         key=lambda e: e["ts"])
    os.unlink(path)
    per = max(1, len(kernels) // steps)
    return [kernels[i * per:(i + 1) * per] for i in range(steps)], samples, took


def by_name(steps) -> dict:
    out = defaultdict(float)
    for s in steps:
        for k in s:
            out[k["name"][:60]] += k["dur"] / len(steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="few_large")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, {SHAPES[args.shape].name}, T = {args.tokens}")
    for name, step, p in versions_steps(args.shape, args.tokens):
        if p is None:
            continue
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        time.sleep(2)                        # let the board cool a little between versions
        steps, samples, took = sampled(step, args.steps)
        n = len(samples)
        head, tail = samples[:max(1, n // 10)], samples[-max(1, n // 3):]
        mean = lambda rows, i: sum(r[i] for r in rows) / len(rows)  # noqa: E731
        print(f"{name}: {args.steps} steps in {took:.2f} s ({took * 1e3 / args.steps:.2f} ms "
              f"a step); SM clock {mean(head, 0):.0f} -> {mean(tail, 0):.0f} MHz, power "
              f"{mean(head, 1):.0f} -> {mean(tail, 1):.0f} W")
        first, last = by_name(steps[:3]), by_name(steps[-10:])
        print(f"  {'kernel':60} {'first 3':>9} {'last 10':>9}  (us a step)")
        for k in sorted(last, key=lambda k: -last[k])[:8]:
            print(f"  {k:60} {first.get(k, 0):9.0f} {last[k]:9.0f}")
        print(f"  {'all kernels':60} {sum(first.values()):9.0f} {sum(last.values()):9.0f}")
        p.zero()


if __name__ == "__main__":
    main()
