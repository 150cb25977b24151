"""How one matmul shape runs on a GPU, beyond the kernel's settings: the operands' layout,
timing whole plans against each other, and remembering the winner on disk.

A **plan** is everything one call of a shape does: copies of the operands into another
layout (if any), the kernel launch, C. :mod:`~helpers.kernels.matmul.tuned` builds a few
candidates on a shape's first call, times each whole plan, and keeps the fastest.

**The candidates** (:func:`~helpers.kernels.matmul.tuned.matmul_tuned`'s first call):

* v6, autotuned, and v6 with the tuner's runner-up setting
  (:func:`runner_up`): the tuner times each setting once, and
  a GPU that slows for a moment while it times one hands the win to another, so a second
  measurement of the two best, as whole plans, guards the pick;
* the persistent TMA kernel, autotuned, where the TMA takes the operands
  (:func:`~helpers.kernels.matmul.persistent.usable`);
* stream-K, where the persistent kernel's tiles leave the last wave part-empty, with the
  persistent kernel's setting and with 128 x 256 and 128 x 128 tiles
  (:mod:`~helpers.kernels.matmul.streamk`); and where C's rows are off 16 bytes, which
  rules the persistent kernel out (its C goes through a descriptor), stream-K with those
  two tiles, storing C from the registers;

each on the operands as given and, when their rows do not start on 128-byte lines, on copies
that do. "As given" means no copy by the plan: the persistent kernel still pads B itself
where :func:`~helpers.kernels.matmul.persistent.pads_b` says so. Each plan is timed whole,
copies included, the candidates in turn (:func:`time_plans`). The copy is one launch,
built on the shape's first call and launched compiled after that
(:mod:`~helpers.kernels.matmul.pack`): at these sizes the host's Python work per call would
cost more than the copy.

**Layout.** A row of A or B that does not start on a 128-byte line (K = 1000 in fp16: each
row is 2,000 bytes, 16 lines less 48 bytes) makes each 128-byte piece of it straddle two
lines of L2, and a row that does not even start on 16 bytes (K = 1999) rules out 16-byte
loads altogether. Measured on an H100 80GB HBM3 (fp16, the tuned kernels, triton 3.6):
2047 x 4097 x 1023 took 101 us as given and 38 us with A and B copied into rows of whole
lines, 3000 x 5000 x 2500 229 us against 128 us (kernels alone). The copies
(:mod:`~helpers.kernels.matmul.pack`: both operands in one launch) cost a pass over A and B,
which pays for big products and not for the smallest: at 1000^3, v6 alone took 11.6 us on
whole lines (cuBLAS: 11.5 us) against 16.3 us as given, but the copy of both operands took
about 8 us. Hence no rule: both layouts are candidates, and the clock decides.

**No copy at all** is no candidate: v6 on rows off 16 bytes loads element by element, with
no asynchronous copies to pipeline. On 15 small unaligned products measured on an H200
(fp16 and bf16, 97 x 113 x 231 to 5318 x 626 x 1612, the plans timed in turn by the tuner
itself) it tied once (1153 x 64 x 138: 10.3 us against 10.27), lost by 1.14x at
97 x 113 x 231 and by 1.5-4.4x on the other 13 (655^3: 31.3 us against 13.0).

**Decisions on disk.** Triton's autotuner keeps its timings on disk (``cache_results``), so
a new process skips the search; but choosing between candidate plans still means loading
every candidate's kernel and timing them again. :class:`Decisions` keeps the outcome, the
plan that won (kernel, setting, layout), in Triton's cache directory (``TRITON_CACHE_DIR``),
keyed by the exact shape, layout, dtype, GPU, Triton version and the kernels' source: a
process that finds a decision builds only that plan, with the setting fixed, and tunes
nothing.
"""

from __future__ import annotations

import hashlib
import json
import statistics

import torch
import triton

from .config import TileConfig
from .pack import packer
from .persistent import stored, transposed

LINE = 128          # bytes in one line of L2
VECTOR = 16         # bytes in one vectorised load


def on_rows_of(t: torch.Tensor, row_bytes: int) -> bool:
    """Whether every row of row-major ``t`` starts on a ``row_bytes`` boundary."""
    if t.stride(-1) != 1:
        return False
    return t.shape[0] <= 1 or ((t.stride(0) * t.element_size()) % row_bytes == 0
                               and t.data_ptr() % row_bytes == 0)


def needs_padding(a: torch.Tensor, b: torch.Tensor,
                   row_bytes: int = VECTOR) -> tuple[bool, bool, int]:
    """Whether to copy A, whether to copy B, into rows that start every ``row_bytes``; and
    the column count to run B with (N, or N rounded up to a whole 16-byte vector).

    A row-major matrix whose rows do not start on 16-byte boundaries (K = 1999 in fp16),
    or a B whose N is no multiple of 8 fp16 elements, defeats the kernel's 16-byte loads:
    every element is then loaded on its own, several times slower than the copy costs.
    A transposed view (column-major: ``W.T`` of nn.Linear) is judged by the rows of the
    matrix underneath (:func:`~helpers.kernels.matmul.persistent.stored`), and copied
    as such (:func:`operand_packer`); its N needs no padding, as C's rows are not its rows.
    """
    vector = VECTOR // a.element_size()

    def misaligned(x):      # rows of a row-major matrix, off the boundary
        return x.stride(1) == 1 and x.shape[0] > 1 and not on_rows_of(x, row_bytes)

    x_b, N = stored(b), b.shape[1]
    pad_a = misaligned(stored(a))
    if x_b is not b:
        return pad_a, misaligned(x_b), N
    pad_b = b.stride(1) == 1 and (not on_rows_of(b, row_bytes) or N % vector != 0)
    return pad_a, pad_b, (triton.cdiv(N, vector) * vector if pad_b else N)


def operand_packer(a, b, pad_a: bool, pad_b: bool, n_padded: int, row_bytes: int):
    """``prepare(a, b)``: the operands that :func:`needs_padding` says to copy, copied
    into rows every ``row_bytes`` in one launch (:func:`packer`); a transposed view
    as the transpose of such a copy of the matrix underneath, so the layout stays."""
    flip_a, flip_b = transposed(a), transposed(b)
    x_a, x_b = (a.t() if flip_a else a), (b.t() if flip_b else b)
    copy = packer(x_a if pad_a else None, x_a.shape[1], x_b if pad_b else None,
                  x_b.shape[1] if flip_b else n_padded, row_bytes)
    if not (flip_a or flip_b):
        return copy

    def prepare(a, b):
        x, y = copy(a.t() if flip_a else a, b.t() if flip_b else b)
        return (x.t() if flip_a else x), (y.t() if flip_b else y)

    return prepare


# Rounds in which the candidate plans of a shape are timed, each round every plan in turn.
PLAN_ROUNDS = 3


def time_plans(runs: dict, *args, rounds: int = PLAN_ROUNDS, rep: int = 40) -> dict:
    """``name -> run`` as ``name -> ms``: each whole plan's median time over ``rounds``
    rounds, every plan once a round, in turn (A B C, A B C, ...), each ``run(*args)`` with a
    cold L2 for about ``rep`` ms a round. (Lesson 06's attention tuner times its candidate
    settings the same way.)

    In turn, not one plan after another: under a long load an H200's SM clock fell from
    about 1,980 to 1,560 MHz, and a plan timed after the others ran on the slower chip. One
    plan after another on an H200 (4096^3 fp16, the timings kept in a decision), the
    tuned path kept v6 at 215 us, while the persistent kernel, timed on its own first,
    took 193.5 us. Rounds cost ``rounds`` times the timing of one (a few seconds, once per
    shape, beside the tuners' own search)."""
    taken: dict = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            taken[name].append(time_once(lambda run=run: run(*args), rep))
    return {name: statistics.median(t) for name, t in taken.items()}


def time_once(fn, rep: int = 40) -> float:
    """Median milliseconds of ``fn()`` run for about ``rep`` ms, each run with a cold L2: one
    round's timing, shorter than a lone measurement's, as the rounds add up the samples."""
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


class Decisions:
    """Winning plans on disk, one small JSON file per shape and layout, in Triton's cache.
    (Lesson 06's attention tuner keeps its settings in another ``file``, keyed its way.)"""

    FILE = "matmul_plan.json"

    def __init__(self, salt: str = "course-matmul-plan-1", file: str = FILE):
        self.salt, self.file = salt, file

    def key_of(self, *parts) -> str:
        """A key from anything printable: the salt and ``parts``, hashed."""
        return hashlib.sha256(repr((self.salt, *parts)).encode()).hexdigest()

    def key(self, a: torch.Tensor, b: torch.Tensor, kernels: tuple[str, ...]) -> str:
        """Everything the winner depends on: exact shapes, strides, dtype, the operands'
        offsets within a line, the GPU, Triton, and the kernels' own cache keys (their
        source and the spaces they search)."""
        props = torch.cuda.get_device_properties(a.device)
        return self.key_of(tuple(a.shape), tuple(b.shape), a.stride(), b.stride(),
                           str(a.dtype), a.data_ptr() % LINE, b.data_ptr() % LINE, props.name,
                           (props.major, props.minor), triton.__version__, kernels)

    def get(self, key: str) -> dict | None:
        from triton.runtime.cache import get_cache_manager
        path = get_cache_manager(key).get_file(self.file)
        if path is None:
            return None
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):          # a torn or foreign file: decide again
            return None

    def put(self, key: str, decision: dict) -> None:
        from triton.runtime.cache import get_cache_manager
        get_cache_manager(key).put(json.dumps(decision, sort_keys=True), self.file,
                                   binary=False)


DECISIONS = Decisions()
# Keep and read decisions (GPU mode). Off: every process tunes and times its candidates.
USE_DECISIONS = True


def runner_up(tuner, known: set) -> dict | None:
    """The setting ``tuner`` timed second best for the one key it learned since ``known``
    (its keys before the call), or ``None``.

    A second opinion on the tuner's pick. Each setting is timed once, and a GPU that slows
    for a moment while one setting is timed can hand the win to another: in one recorded
    H100 run the tuner kept split-K 4 at 256 x 256 x 16384 fp16 (21.6 us as a plan), where
    later runs on an H100 timed split-K 8 at 19.2 us and split-K 4 at 21.4 us. Timing the
    runner-up as a whole plan beside the winner costs one more measurement and catches that.
    """
    new = [key for key in tuner.cache if key not in known]
    timings = getattr(tuner, "configs_timings", None) or {}
    if len(new) != 1 or len(timings) < 2:
        return None

    def median(config):
        t = timings[config]
        return t[0] if isinstance(t, (list, tuple)) else t

    ranked = sorted(timings, key=median)
    if ranked[0] is not tuner.cache[new[0]]:    # the timings are not this key's
        return None
    return TileConfig.from_triton(ranked[1])
