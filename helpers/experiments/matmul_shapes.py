"""The course's matmul on shapes nobody chose for it: drawn afresh, with a printed seed.

Lesson 07's sweep names its 16 shapes, and a tuner built beside a list can end up tuned to
the list. This experiment draws its shapes when it runs, from a seeded generator that
knows nothing of the tuner, so a record is a sample of what users multiply:

* ``llm``: a linear layer of a real model (:data:`MODELS`: hidden sizes 1,024-16,384,
  MLP widths, grouped-query K/V projections, vocabulary projections 32k-256k) times a
  token count from 1 to 16,384. ``y = x @ W.T``: M tokens, K the layer's input, N its
  output.
* ``square``: n x n x n for n in 512-8,192, half of them off multiples of 128.
* ``random``: three sizes drawn log-uniformly in 64-12,288, any integer: off the tile grid.
* ``tail``: shapes whose count of 128 x 128 output tiles lands a few tiles past a whole
  number of waves of the GPU's SMs, where a data-parallel kernel runs a last wave that is
  almost empty (wave quantisation).

Each row is timed three ways, medians of :func:`helpers.bench.time_rounds` (cold L2, in
turn, one process): ``torch.matmul`` (cuBLAS), :func:`helpers.kernels.matmul.matmul` (the
course's tuned path) and, where K or N is no multiple of 8 (rows of A or B then start off
16-byte boundaries and cuBLAS takes slow, unvectorised paths), cuBLAS on operands padded
once to multiples of 8, as a careful user would. A row is judged against the faster of the
two cuBLAS runs, so no ratio credits cuBLAS's misalignment penalty. A row is *aligned*
when all of M, N and K are multiples of 8; the record reports aligned and unaligned rows
apart. The ``nn.Linear`` layout, ``x @ W.T`` with ``W`` stored (out, in), is timed
against ``F.linear`` the same way. Two back-to-back loops
(:data:`LOOP_SHAPES`, no L2 flush, as a training step calls them) time the host path.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .. import bench
from ..kernels.matmul.tuned import last_choice
from . import experiment

# (name, hidden, MLP width, K/V width of grouped-query attention, vocabulary), from each
# model's published configuration.
MODELS = [
    ("GPT-2 medium", 1024, 4096, 1024, 50257),
    ("Llama-3.2-1B", 2048, 8192, 512, 128256),
    ("Phi-3-mini", 3072, 8192, 3072, 32064),
    ("Qwen2.5-7B", 3584, 18944, 512, 152064),
    ("Gemma-2-9B", 3584, 14336, 2048, 256000),
    ("Llama-3-8B", 4096, 14336, 1024, 128256),
    ("Mistral-7B", 4096, 14336, 1024, 32000),
    ("Llama-3-70B", 8192, 28672, 1024, 128256),
    ("Llama-3.1-405B", 16384, 53248, 1024, 128256),
]
FAMILIES = ("llm", "square", "random", "tail")
COUNT = 48                      # shapes a record draws: 12 of each family
MAX_TOKENS = 16384
TILE = 128                      # the output tile the tail shapes are drawn against
# A row's work and output stay within what one H100 times in seconds: 4 TFLOP and 2^30
# output elements (2 GiB in bf16); a drawn shape past either draws its token count again.
MAX_FLOPS = 4e12
MAX_OUTPUT = 2**30
ALIGN = 8                       # elements: 16 bytes of fp16/bf16, what cuBLAS vectorises
LOOP_SHAPES = [(1000, 1000, 1000), (4096, 4096, 1024)]
LOOP_CALLS = 500
ROUNDS = 3

# The targets (an H100; recorded on an H200 too), each against cuBLAS as a practitioner runs
# it (on padded operands where a row is off 16 bytes): the drawn shapes' geometric mean and
# floor, the aligned shapes' geometric mean, the same for x @ W.T against F.linear, and the
# back-to-back loops' calls per second against torch's.
GEOMEAN_VS_CUBLAS = 0.97
FLOOR_VS_CUBLAS = 0.85
ALIGNED_GEOMEAN_VS_CUBLAS = 0.98
LINEAR_GEOMEAN_VS_F_LINEAR = 0.95
LINEAR_FLOOR_VS_F_LINEAR = 0.85
BACK_TO_BACK_VS_TORCH = 0.85


@dataclass(frozen=True)
class Shape:
    family: str
    label: str
    M: int
    N: int
    K: int
    dtype: str                  # "fp16" or "bf16"

    @property
    def aligned(self) -> bool:
        """Every dimension a multiple of :data:`ALIGN` (cuBLAS's fast, vectorised paths)."""
        return all(d % ALIGN == 0 for d in (self.M, self.N, self.K))

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K


def _tokens(rng: random.Random) -> int:
    """1 to 16,384 tokens, log-uniform: half powers of two, half any integer."""
    if rng.random() < 0.5:
        return 2 ** rng.randint(0, 14)
    return max(1, round(math.exp(rng.uniform(0, math.log(MAX_TOKENS)))))


def _fits(M: int, N: int, K: int) -> bool:
    return 2.0 * M * N * K <= MAX_FLOPS and M * N <= MAX_OUTPUT


def _llm(rng: random.Random) -> tuple[str, int, int, int]:
    name, hidden, mlp, kv, vocab = rng.choice(MODELS)
    layer, k, n = rng.choice([("q/o projection", hidden, hidden), ("k/v projection", hidden, kv),
                              ("MLP up", hidden, mlp), ("MLP down", mlp, hidden),
                              ("vocabulary", hidden, vocab)])
    while True:
        m = _tokens(rng)
        if _fits(m, n, k):
            return f"{name} {layer}, {m} tokens", m, n, k


def _square(rng: random.Random) -> tuple[str, int, int, int]:
    n = rng.randint(4, 64) * TILE                 # 512 to 8,192
    if rng.random() < 0.5:
        n -= rng.randint(1, TILE - 1)             # off the multiples of 128
    return f"square {n}", n, n, n


def _random(rng: random.Random) -> tuple[str, int, int, int]:
    while True:
        m, n, k = (round(math.exp(rng.uniform(math.log(64), math.log(12288)))) for _ in range(3))
        if _fits(m, n, k):
            return f"random {m}x{n}x{k}", m, n, k


def _tail(rng: random.Random, sms: int) -> tuple[str, int, int, int]:
    """Output tiles 1 to sms/8 past a whole number (1-3) of waves of ``sms`` programs."""
    while True:
        waves = rng.randint(1, 3)
        tiles_m = rng.randint(4, 48)
        tiles_n = -(-(waves * sms + rng.randint(1, max(1, sms // 8))) // tiles_m)
        past = tiles_m * tiles_n - waves * sms
        if not 1 <= past <= max(1, sms // 8):
            continue
        # Still tiles_m x tiles_n tiles; most on multiples of 8, one in four anywhere.
        step = 1 if rng.random() < 0.25 else ALIGN
        m = tiles_m * TILE - step * rng.randint(0, TILE // step - 1)
        n = tiles_n * TILE - step * rng.randint(0, TILE // step - 1)
        k = rng.randint(8, 64) * TILE
        if _fits(m, n, k):
            return f"tail: {waves} wave{'s' * (waves > 1)} + {past} tiles", m, n, k


def draw(seed: int, sms: int, count: int = COUNT) -> list[Shape]:
    """``count`` shapes, the families in turn, each dtype for half of each family; the same
    ``seed`` and SM count give the same shapes."""
    if count < len(FAMILIES) or sms < 1:
        raise ValueError(f"draw at least {len(FAMILIES)} shapes for at least one SM, "
                         f"got count={count}, sms={sms}")
    rng = random.Random(seed)
    makers = {"llm": _llm, "square": _square, "random": _random,
              "tail": lambda r: _tail(r, sms)}
    out = []
    for i in range(count):
        family = FAMILIES[i % len(FAMILIES)]
        label, m, n, k = makers[family](rng)
        dtype = ("fp16", "bf16")[(i // len(FAMILIES)) % 2]
        out.append(Shape(family, label, m, n, k, dtype))
    return out


def padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``x`` copied into the top-left of a zero matrix of ``rows`` x ``cols``."""
    out = x.new_zeros(rows, cols)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def padded_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M x K) and B (K x N) with K and N padded to multiples of 8 (zeros add nothing);
    ``(a_p @ b_p)[:, :N]`` is ``a @ b``. Done once, outside the timing: weights are padded
    when they are loaded, not at every call."""
    M, K = a.shape
    N = b.shape[1]
    return padded(a, M, up(K)), padded(b, up(K), up(N))


def summary(rows: list[dict], key: str = "vs_cublas") -> dict:
    """Geometric means and worst of ``key`` over all rows, the aligned and the unaligned."""
    def part(rs):
        ratios = [r[key] for r in rs]
        if not ratios:
            return {"rows": 0}
        worst = min(rs, key=lambda r: r[key])
        return {"rows": len(ratios), "geomean": bench.geomean(ratios), "worst": worst[key],
                "worst_label": f"{worst['label']} ({worst['dtype']})",
                "below_0.85": sum(x < 0.85 for x in ratios)}
    return {"all": part(rows), "aligned": part([r for r in rows if r["aligned"]]),
            "unaligned": part([r for r in rows if not r["aligned"]])}


_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _time_row(shape: Shape, ours, seed: int) -> dict:
    M, N, K = shape.M, shape.N, shape.K
    dtype = _DTYPES[shape.dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=dtype, generator=g)   # nn.Linear's (out, in)
    b = w.t().contiguous()                                            # the row-major K x N
    want = a.float() @ b.float()
    scale = want.abs().max().clamp_min(1e-30)
    row = {**asdict(shape), "aligned": shape.aligned}
    start = time.perf_counter()
    c = ours(a, b)
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - start
    row["error"] = ((c.float() - want).abs().max() / scale).item()
    row["linear_error"] = ((ours(a, w.t()).float() - want).abs().max() / scale).item()
    # What the tuner kept for each layout (kernel: v6, persistent or streamk; its setting),
    # and every candidate plan's time as the tuner took it, where this process tuned.
    for name, pair in (("choice", (a, b)), ("linear_choice", (a, w.t()))):
        kept = last_choice(*pair) or {}
        row[name] = {k: kept[k] for k in ("kernel", "config", "layout", "candidates_ms")
                     if k in kept}
    fns = {"cublas": lambda: torch.matmul(a, b), "ours": lambda: ours(a, b),
           "f_linear": lambda: F.linear(a, w), "ours_linear": lambda: ours(a, w.t())}
    if K % ALIGN or N % ALIGN:          # rows of A or B off 16 bytes: pad them once
        a_p, b_p = padded_operands(a, b)
        w_p = b_p.t().contiguous()
        fns["cublas_padded"] = lambda: torch.matmul(a_p, b_p)
        fns["f_linear_padded"] = lambda: F.linear(a_p, w_p)
    turns = bench.time_rounds(fns, rounds=ROUNDS)
    for name, spread in turns.items():
        row[f"{name}_ms"] = spread["ms"]
    best = min(row["cublas_ms"], row.get("cublas_padded_ms", math.inf))
    best_linear = min(row["f_linear_ms"], row.get("f_linear_padded_ms", math.inf))
    row["vs_cublas"] = best / row["ours_ms"]
    row["vs_cublas_as_given"] = row["cublas_ms"] / row["ours_ms"]
    row["linear_vs_f_linear"] = best_linear / row["ours_linear_ms"]
    row["ours_tflops"] = bench.tflops(shape.flops, row["ours_ms"])
    row["cublas_tflops"] = bench.tflops(shape.flops, best)
    return row


def back_to_back(ours, calls: int = LOOP_CALLS) -> list[dict]:
    """Microseconds a call over ``calls`` calls in a row, bf16, no L2 flush between them."""
    out = []
    for M, N, K in LOOP_SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        row = {"M": M, "N": N, "K": K, "calls": calls}
        for name, fn in (("torch", torch.matmul), ("ours", ours)) * ROUNDS:
            for _ in range(3):
                fn(a, b)
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn(a, b)
            stop.record()
            stop.synchronize()
            row.setdefault(f"{name}_runs_us", []).append(start.elapsed_time(stop) * 1e3 / calls)
        for name in ("torch", "ours"):
            row[f"{name}_us"] = sorted(row[f"{name}_runs_us"])[ROUNDS // 2]
        row["ours_vs_torch"] = row["torch_us"] / row["ours_us"]      # calls per second
        out.append(row)
    return out


def _part(part: str, count: int) -> tuple[int, int]:
    """``"k/n"`` as ``(k, n)``: the k-th of n runs that measure the draw's rows in turn."""
    try:
        k, n = (int(x) for x in str(part).split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n <= count:
        raise ValueError(f"part reads 'k/n' with 1 <= k <= n <= {count} (the shapes drawn), "
                         f"got {part!r}: run part=1/2, then part=2/2 with earlier=<the JSON "
                         "file part 1 wrote>")
    return k, n


def _here() -> dict:
    """This GPU and this tree, as a record's provenance names them."""
    from .. import records

    here = records.provenance()
    return {"gpu": here["gpu"], "sms": here["sm_count"],
            **{k: here.get(k) for k in ("git_commit", "git_dirty", "torch", "triton")}}


def _earlier(path, k: int, n: int, seed, count: int, here: dict, start: int):
    """The seed and rows of part ``k - 1`` of ``n``, from the record it wrote at ``path``."""
    from .. import records

    if not path:
        raise ValueError(f"part {k}/{n} continues part {k - 1}/{n}: pass earlier=<the JSON "
                         f"file part {k - 1} wrote>")
    rec = records.read(path)
    got, made = rec.results, rec.provenance
    problems = []
    if rec.name != "matmul_shapes":
        problems.append(f"it is a {rec.name!r} record")
    elif got.get("part") != f"{k - 1}/{n}":
        problems.append(f"it holds part {got.get('part')}, not part {k - 1}/{n}")
    else:
        checks = [("seed", got.get("seed"), seed), ("count", got.get("count"), count),
                  ("GPU", made.get("gpu"), here["gpu"]), ("SM count", got.get("sms"), here["sms"])]
        checks += [(key, made.get(key), here[key])
                   for key in ("git_commit", "git_dirty", "torch", "triton")]
        for what, theirs, mine in checks:
            if (mine is not None or what == "git_dirty") and theirs != mine:
                problems.append(f"its {what} is {theirs!r}, this run's {mine!r}")
        rows = got.get("rows") or []
        if len(rows) != start:
            problems.append(f"it holds {len(rows)} rows, parts 1-{k - 1} measure {start}")
        elif not problems:              # the rows are the draw's first ones, in order
            drawn = draw(got["seed"], here["sms"], count)[:start]
            if [(r.get("label"), r.get("dtype")) for r in rows] != \
                    [(d.label, d.dtype) for d in drawn]:
                problems.append(f"its rows are not the first {start} shapes of seed "
                                f"{got['seed']}'s draw")
    if problems:
        raise ValueError(f"{path} cannot be continued as part {k}/{n}: " + "; ".join(problems))
    return got["seed"], list(got["rows"])


@experiment("matmul_shapes")
def matmul_shapes(seed: int | None = None, count: int = COUNT, part: str = "1/1",
                  earlier: str | None = None) -> dict:
    """Draw ``count`` shapes (a fresh seed unless given, kept in the record), time each.

    ``part="k/n"`` measures the k-th of n slices of the draw, for a GPU lent in calls
    shorter than the whole run (each row tunes two layouts on a cold cache): part 1 draws
    the seed; each later part continues the record the one before wrote (``earlier=<its
    JSON file>``) on the same GPU model and commit; the last adds the summaries and the
    back-to-back loops, and only its record is complete.
    """
    from ..kernels.matmul import matmul

    count = int(count)
    k, n = _part(part, count)
    if k == 1 and earlier:
        raise ValueError(f"part {k}/{n} starts the draw: it continues no earlier part "
                         f"(earlier={earlier!r})")
    here = _here()
    start, stop = (k - 1) * count // n, k * count // n
    rows = []
    if k > 1:
        seed, rows = _earlier(earlier, k, n, seed, count, here, start)
    seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
    shapes = draw(seed, here["sms"], count)
    rows += [_time_row(s, matmul, seed + i) for i, s in enumerate(shapes[start:stop], start)]
    out = {"seed": seed, "sms": here["sms"], "count": count, "part": f"{k}/{n}", "rows": rows}
    if k < n:
        return {**out, "note": f"part {k} of {n}: rows 1-{stop} of {count}; continue with "
                               f"part={k + 1}/{n} earlier=<this file>"}
    return {**out, "summary": summary(rows), "linear_summary": summary(rows, "linear_vs_f_linear"),
            "back_to_back": back_to_back(matmul),
            "note": "vs_cublas: the faster of cuBLAS as given and on operands padded to "
                    "multiples of 8 (rows off 8 only), over ours; cold L2, medians of "
                    f"{ROUNDS} rounds in turn; back_to_back: no flush, CUDA events"}
