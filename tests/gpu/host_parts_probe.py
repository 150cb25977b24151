"""Probe: the host's microseconds a call, part by part, where a call runs at the host's pace.

Two cases from issue 28's short targets, each part issued 300 times with no
synchronisation (the loop's own time a call), medians of five rounds in turn:

* a decoding step, 1 query against 8k keys, batch 1, GQA 32/8, d = 128, bf16: our whole
  call (kept), its signature (``kept.call_key``) and lookup, the kept call alone, one
  ``torch.empty``, one direct launch of the combine kernel; SDPA's default beside it;
* forward + backward at 512 tokens, batch 4, 16 heads, d = 64, causal, fp16: the forward
  under autograd, forward and backward through ``.backward``, our backward called
  directly (kept), its signature (``kept.backward_key``); SDPA's default beside them.

    PYTHONPATH=$PWD python3 tests/gpu/host_parts_probe.py      # $OUT/host_parts.json

Read on the lent H200 machine, host us a call. Decoding, with the partial results in two
fresh tensors a call: ours 51.9, signature and lookup 3.5, the kept call 46.1, one
``torch.empty`` 8.2, one launch 9.4, SDPA 33.9. With the workspace kept per stream (a
later call, on a slower host: SDPA 39.9, ``torch.empty`` 9.7): the kept call 47.9, one
launch 11.2; 1.20x SDPA's call where it was 1.36x. Forward + backward at 512 tokens: our
forward under autograd 48.6 (SDPA 37.5), forward and backward 291.6 (SDPA 218.1), our
backward called directly 71.2, its signature and lookup 7.4.
"""
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from helpers.kernels import attention as ak
from helpers.kernels.attention import decode, kept

CALLS, ROUNDS = 300, 5


def host_us(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    spent = (time.perf_counter() - t0) / CALLS * 1e6
    torch.cuda.synchronize()
    return spent


def parts(label: str, fns: dict) -> dict:
    for fn in fns.values():
        fn()
        fn()
    taken = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            taken[name].append(host_us(fn))
    row = {"case": label, **{name: round(statistics.median(t), 2) for name, t in taken.items()}}
    print(json.dumps(row), flush=True)
    return row


rows = []
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
ak.flash_attention_forward(q, k, v, "bottom_right")
key = kept.call_key(q, k, v, "bottom_right", None)
found = kept.lookup(key)
assert callable(found), f"no kept call: {found!r}"
plan = next(iter(decode._plans.values()))
work = decode.workspace(q.device, plan["work"])
o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device="cuda")
combine = plan["runners"][1]
rows.append(parts("decode 1 x 8k, batch 1", {
    "ours": lambda: ak.flash_attention_forward(q, k, v, "bottom_right"),
    "call_key + lookup": lambda: kept.lookup(kept.call_key(q, k, v, "bottom_right", None)),
    "kept call": lambda: found(q, k, v),
    "torch.empty": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
    "one launch (combine)": lambda: combine(work, o, lse, *plan["combine_args"]),
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}))

q, k, v = (torch.randn(4, 16, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True)
           for _ in range(3))
do = torch.randn_like(q)
o_, lse_ = ak.flash_attention_forward(q.detach(), k.detach(), v.detach(), True)
ak.flash_attention_backward(do, q.detach(), k.detach(), v.detach(), o_, lse_, True)
qd, kd, vd = q.detach(), k.detach(), v.detach()
rows.append(parts("forward+backward 512 causal", {
    "ours forward (autograd)": lambda: ak.flash_attention(q, k, v, True),
    "ours forward+backward": lambda: ak.flash_attention(q, k, v, True).backward(do),
    "ours backward direct": lambda: ak.flash_attention_backward(do, qd, kd, vd, o_, lse_, True),
    "backward_key + lookup": lambda: kept.lookup(kept.backward_key(do, qd, kd, vd, o_, lse_,
                                                                   True, None)),
    "sdpa forward": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "sdpa forward+backward": lambda: F.scaled_dot_product_attention(
        q, k, v, is_causal=True).backward(do)}))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "host_parts.json"), "w"),
          indent=1)
