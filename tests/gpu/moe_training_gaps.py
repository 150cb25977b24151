"""Where the MoE training step's GPU sits idle: a probe, not a test (pytest does not collect it).

The moe_training record's step at 8 experts (T = 4096, bf16) reads 17.55 ms on an H200
while its kernels sum to 14.95 ms; torch._grouped_mm's step reads 14.90 ms over 13.46 ms
of kernels (x then had no gradient, so torch's backward skipped dx's GEMM; x has one now,
as in the record). This traces one step of each with torch.profiler (after warm-up, the way
``bench.time_ms`` runs it: a cold L2 first), then lists the GPU's idle stretches between
kernels, each with the kernel after it and the CUDA runtime calls the host made during
it (a ``cudaStreamSynchronize`` or a device-to-host copy there means the host waited).

    python3 tests/gpu/moe_training_gaps.py [--tokens 4096] [--shape few_large] [--top 12]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402

from helpers.experiments import moe_training as mt  # noqa: E402
from helpers.experiments.moe import SHAPES, _randn, _weights  # noqa: E402


def trace(step, cache, steps: int = 1) -> dict:
    """The trace of ``steps`` steps issued back to back (no wait between them, as do_bench
    issues its runs), a cold L2 before the first."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        cache.zero_()                         # a cold L2, as do_bench makes it
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(path)
    return events


def host_and_bench(step, steps: int = 10) -> str:
    """The host's time to issue a step (the GPU busy with earlier work, so nothing waits
    on it unless the step itself synchronises) against do_bench's time of the step."""
    import time

    import triton

    torch.cuda.synchronize()
    hold = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(30):                          # ~100 ms of queued GPU work ahead
        hold @ hold
    start = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - start) * 1e3 / steps
    torch.cuda.synchronize()
    bench = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
    return f"host {host:.2f} ms a step, do_bench {bench:.2f} ms a step"


def gaps(events, top: int) -> list[str]:
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                     key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op")]
    kernels = [k for k in kernels if k["ts"] >= kernels[0]["ts"]]
    # The step: from the first kernel after the cache clear to the last.
    first = next(i for i, k in enumerate(kernels) if "FillFunctor" not in k["name"]
                 and "Memset" not in k["name"]) if len(kernels) > 1 else 0
    kernels = kernels[first:]
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy = sum(k["dur"] for k in kernels)
    out = [f"  step on the GPU {span / 1e3:.2f} ms, kernels {busy / 1e3:.2f} ms, idle "
           f"{(span - busy) / 1e3:.2f} ms over {len(kernels)} kernels"]
    stretches = []
    end = kernels[0]["ts"] + kernels[0]["dur"]
    for k in kernels[1:]:
        if k["ts"] - end > 0:
            stretches.append((k["ts"] - end, end, k))
        end = max(end, k["ts"] + k["dur"])
    before = {id(k): p for p, k in zip(kernels, kernels[1:])}
    for idle, start, k in sorted(stretches, key=lambda s: -s[0])[:top]:
        out.append(f"    after {before[id(k)]['name'][:70]}")
        calls = {}
        for r in runtime:
            if r["ts"] < start + idle and r["ts"] + r.get("dur", 0) > start:
                calls[r["name"]] = calls.get(r["name"], 0) + 1
        said = ", ".join(f"{n[:40]} x{c}" for n, c in sorted(calls.items(), key=lambda x: -x[1])[:6])
        out.append(f"  {idle:8.1f} us idle before {k['name'][:60]:60} | host: {said}")
    return out


def versions_steps(shape: str, tokens: int):
    """The record's versions at ``shape`` and ``tokens`` (bf16, x requiring grad as in the
    record): ``(name, step, params)`` each, or ``(name, why, None)`` for one that cannot run."""
    s = SHAPES[shape]
    w = _weights(s, torch.bfloat16, seed=7)
    x = _randn((tokens, s.hidden), torch.bfloat16, seed=920).requires_grad_()
    dout = _randn((tokens, s.hidden), torch.bfloat16, seed=921)
    for name, v in mt._versions(w).items():
        if isinstance(v, str):
            yield name, v, None
            continue
        fn, p = v

        def step(fn=fn, p=p):
            p.zero()
            x.grad = None
            fn(x, p, s.top_k).backward(dout)
        yield name, step, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="few_large")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    print(f"{torch.cuda.get_device_name()}, {SHAPES[args.shape].name}, T = {args.tokens}")
    for name, step, p in versions_steps(args.shape, args.tokens):
        if p is None:
            print(name, step)
            continue
        print(name)
        print("\n".join(gaps(trace(step, cache), args.top)))
        print("  three steps back to back:")
        print("\n".join(gaps(trace(step, cache, steps=3), args.top)))
        print(f"  {host_and_bench(step)}")
        p.zero()


if __name__ == "__main__":
    main()
