"""Probe: where the host time of one attention forward call goes: cProfile over 300 calls
(4 x 16 x 1,024 x 64 bf16, causal), then the host time to issue one call without the
profiler, and that of a bare ``torch.empty_like`` for scale (this host's Python speed).

    PYTHONPATH=$PWD python3 tests/gpu/attention_host_profile.py
"""
import cProfile
import io
import pstats
import time

import torch

from helpers.kernels import attention as A

CALLS = 300


def issue_us(fn) -> float:
    """Host microseconds to issue one call of ``fn`` (CALLS issued, then one synchronize)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    spent = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return spent


q, k, v = (torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
forward = lambda: A.flash_attention_forward(q, k, v, causal=True)  # noqa: E731
for _ in range(3):
    forward()
torch.cuda.synchronize()
profiler = cProfile.Profile()
profiler.enable()
for _ in range(CALLS):
    forward()
profiler.disable()
torch.cuda.synchronize()
table = io.StringIO()
pstats.Stats(profiler, stream=table).sort_stats("tottime").print_stats(22)
print(table.getvalue()[:6000])
print("host us/call", round(issue_us(forward), 1))
print("empty_like us", round(issue_us(lambda: torch.empty_like(q)), 1))
