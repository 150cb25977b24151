"""Probe: does the attention tuner's pick hold under the record's sustained load?

At 4,096 tokens, d = 128, the tuner picked pointer tiles (64 x 64 or 128 x 128) that the
record and the pipeline probe then timed 5-12% slower than the descriptor setting (128 x
64, 4 warps, 2 stages), which the tuner had timed slower. Its own timings (in interleaved
rounds, a few seconds after compiling every candidate) disagree with later ones on the
same tensors. This probe times the forward's candidates for one key four ways, printing
the SM clock and power that ``nvidia-smi`` reads beside each phase:

1. the tuner's own timing, at its first call (``tuning._timed``'s result);
2. the tuner's method again at once (``time_plans``): is the ranking repeatable?
3. the same after 20 s of sustained matmuls (a hot GPU, at its power limit);
4. longer interleaved runs (``do_bench`` rep = 300 ms, 3 rounds).

    PYTHONPATH=$PWD python3 tests/gpu/attention_tuner_probe.py    # $OUT/attention_tuner.json
    TOKENS=1024 HEAD_DIM=64 PYTHONPATH=$PWD python3 tests/gpu/attention_tuner_probe.py

At 1,024 tokens a call is host-paced (stop 49's probe), and the record at 74853d9 read two
of the finalists' picks there slower than the short rounds' picks of the record before it
(d = 64 causal forward: 128 x 128 w8 s3 at 160 TFLOP/s against 64 x 64 w4 s3 at 202). The
fifth timing (``record``) is the record's own: ``helpers.bench.time_rounds``, three rounds.

Read on an H200 (triton 3.6, torch 2.11), TFLOP/s, not causal, 64 x 64 pointer tiles /
128 x 128 pointer tiles / 128 x 64 descriptor tiles: the tuner's rounds 491.5 / 503.2 /
495.7; again 503.1 / 503.3 / 489.6; after the heat (1,485 MHz at its end) 507.6 / 501.8 /
494.7; 300 ms rounds 462.7 / 484.7 / 497.8. Causal, 300 ms rounds: 428.5 / 422.4 / 428.6.
The SM clock read 1,950-1,965 MHz after the short and the long rounds alike, so the long
rounds' order is not the clock's doing; its cause is not established. The tuner now times
its three fastest again in 200 ms rounds (``tuning.FINALISTS``): 451.3 / 486.3 / 494.9,
the descriptor tiles picked.
"""
import json
import os
import subprocess
import time

import torch
import triton

from helpers import bench
from helpers.kernels import attention as ak
from helpers.kernels.attention import tuning
from helpers.kernels.matmul.plan import time_plans

CAUGHT = {}
_timed = tuning._timed


def _catching(pass_name, *args, **kwargs):
    found = _timed(pass_name, *args, **kwargs)
    CAUGHT[pass_name] = found
    return found


def smi() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()


def ranked(times: dict, work: float) -> list:
    return [(name, round(work / ms / 1e9, 1)) for name, ms in sorted(times.items(),
                                                                     key=lambda kv: kv[1])]


def heat(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def main():
    tuning._timed = _catching
    out, rows = os.environ.get("OUT", "."), []
    b, h = 4, 16
    n, d = int(os.environ.get("TOKENS", 4096)), int(os.environ.get("HEAD_DIM", 128))
    for causal in (False, True):
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        work = 4 * b * h * n * n * d / (2 if causal else 1)
        CAUGHT.clear()
        ak.flash_attention_forward(q, k, v, causal)
        row = {"tokens": n, "head_dim": d, "causal": causal,
               "chosen": tuning.chosen("forward", q, k, causal),
               "tuner": ranked(CAUGHT["forward"]["ms"], work),
               "tuner_finalists": ranked(CAUGHT["forward"].get("sustained_ms", {}), work),
               "clock_after_tuner": smi()}
        runs = {}
        for name in CAUGHT["forward"]["ms"]:
            bm, bn, w, s = (int(x) for x in name.replace("x", " ").replace("w", "")
                            .replace("s", "").split()[:4])
            tiles = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s,
                         tma=name.endswith("tma"))
            runs[name] = (lambda t=tiles: ak.flash_attention_forward(q, k, v, causal, **t))
        row["again"] = ranked(time_plans(runs), work)
        row["clock_again"] = smi()
        heat(20)
        row["clock_hot"] = smi()
        row["hot"] = ranked(time_plans(runs), work)
        taken = {name: [] for name in runs}
        for _ in range(3):
            for name, fn in runs.items():
                taken[name].append(triton.testing.do_bench(fn, warmup=25, rep=300))
        row["long"] = ranked({name: sorted(t)[1] for name, t in taken.items()}, work)
        row["clock_long"] = smi()
        row["record"] = ranked({name: t["ms"] for name, t in bench.time_rounds(runs).items()},
                               work)
        print(causal, "chosen", row["chosen"], flush=True)
        for key in ("tuner", "tuner_finalists", "again", "hot", "long", "record"):
            print(causal, key, row[key][:5], flush=True)
        print({key: val for key, val in row.items() if key.startswith("clock")}, flush=True)
        rows.append(row)
        with open(os.path.join(out, "attention_tuner.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
