"""Assignment 06, part 3 (GPU): the notebook's kernel timed beside the course's.

* 3a: causal attention with a window of :data:`WINDOW_SPEED` keys at 4096 tokens, against the
  course's causal kernel without one (every key left of the diagonal), on the same inputs. A
  window that size leaves a third of the causal tiles (about 11 of 33 a block, with
  128 x 64 tiles), but half of those 11 carry a mask (the window's edge, the diagonal) and a
  program's fixed work (its Q tile, its output) is shared by fewer tiles: the solution's
  kernel measured 1.71x on an H100 (0.219 ms against 0.375 ms; bash tests/gpu/device.sh
  pytest tests/test_grading_06.py). The goal, :data:`WINDOW_GOAL`, sits below that; a
  kernel that visits the tiles left of the window as well is no faster than the course's.
* 3b: no mask and causal, without a window, within :data:`COURSE_SLACK` of the course's time.

The course's kernel runs with the table's settings (``forward_config``, handed out to the
learner), not the setting its tuner would time on this GPU: the goals were set against the
table, and the notebook's kernel is expected to launch with it.

Outputs are checked first: against the course's kernel without a window, against
``scaled_dot_product_attention`` with the window as a boolean mask with one.
"""

from __future__ import annotations

import torch

from ...feedback import Feedback, target
from ...kernels import attention as ak
from .. import harness
from ..gpu import gpu_lock
from ..registry import answer

BF16 = torch.bfloat16
SPEED_SHAPE, SPEED_DTYPE = (64, 4096, 64), BF16      # 4 x 16 heads, 4096 tokens, d = 64
COURSE_SLACK = 1.2
WINDOW_SPEED, WINDOW_GOAL = 512, 1.5
ERROR = 2 * ak.TOLERANCES[BF16][0]     # the graded bf16 tolerance, as in part 2



def window_error(fn, q, k, v) -> float:
    """The largest error of the windowed output against SDPA with the window as a mask."""
    n = q.shape[1]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    band = (j <= i) & (j > i - WINDOW_SPEED)
    want = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None],
                                                            attn_mask=band)[0]
    got = fn(q, k, v, True, window=WINDOW_SPEED, softcap=None)[0]
    return (got.float() - want.float()).abs().max().item()


def collect_timings(ns, seed) -> dict:
    """In the collection process: each version timed on the same inputs, causal and not, and
    the notebook's kernel with a window of WINDOW_SPEED keys."""
    from ... import bench
    fn, g = answer(ns, "attention_forward"), harness.generator(seed)
    q, k, v = (torch.randn(*SPEED_SHAPE, generator=g).to(SPEED_DTYPE).cuda() for _ in "qkv")
    table = ak.forward_config(SPEED_SHAPE[-1], SPEED_DTYPE, seq_q=SPEED_SHAPE[1])
    out = {"gpu": torch.cuda.get_device_name()}

    def course(causal):
        return ak.flash_attention_forward(q, k, v, causal, **table)

    with gpu_lock():
        for causal in (False, True):
            err = (fn(q, k, v, causal, window=None, softcap=None)[0].float()
                   - course(causal)[0].float()).abs().max().item()
            out["causal" if causal else "no mask"] = {
                "error": err,
                "yours": bench.time_ms(lambda: fn(q, k, v, causal, window=None, softcap=None)),
                "course": bench.time_ms(lambda: course(causal))}
        out["window"] = {"error": window_error(fn, q, k, v), "course": out["causal"]["course"],
                         "yours": bench.time_ms(lambda: fn(q, k, v, True, window=WINDOW_SPEED,
                                                           softcap=None))}
    return out


def _shape() -> str:
    return f"{' x '.join(map(str, SPEED_SHAPE))} bf16"


def _wrong(raw, modes) -> str | None:
    bad = [m for m in modes if not raw[m]["error"] <= ERROR]
    if not bad:
        return None
    return (f"O at {SPEED_SHAPE[1]} tokens ({bad[0]}) differs from " + (
        "SDPA's with the window as a mask" if bad[0] == "window" else "the course's kernel's")
        + " beyond the bf16 tolerance")


def window_speed(part, raw):
    problem = _wrong(raw, ("window",))
    if problem:
        return Feedback(part, False, problem)
    w, ratio = raw["window"], raw["window"]["course"] / raw["window"]["yours"]
    text = (f"on {raw['gpu']}, {_shape()}, causal: yours with a window of {WINDOW_SPEED} keys "
            f"{w['yours']:.3f} ms, the course's kernel without one {w['course']:.3f} ms: "
            f"{ratio:.2f}x (the goal is {WINDOW_GOAL:g}x)")
    return target(part, ratio >= WINDOW_GOAL, text,
                  "A window leaves most causal tiles unseen: a program should start at the "
                  "tile its first query's window reaches and mask only the tiles the window's "
                  "edge or the diagonal cross")


def course_speed(part, raw):
    modes = ("no mask", "causal")
    problem = _wrong(raw, modes)
    if problem:
        return Feedback(part, False, problem)
    text = f"on {raw['gpu']}, {_shape()}: " + "; ".join(
        f"{m}: yours {raw[m]['yours']:.3f} ms, the course's {raw[m]['course']:.3f} ms"
        for m in modes)
    return target(part, all(raw[m]["course"] / raw[m]["yours"] >= 1 / COURSE_SLACK
                            for m in modes), text,
                  "Compare your launch settings with helpers.kernels.attention.forward_config, "
                  "and check that causal programs stop at the diagonal")
