"""Assignment 08 (a Mixture-of-Experts layer): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_08.py) are
graded end to end by tests/test_grading_lessons.py. Here more slips are judged in this
process, without a notebook: routing and dispatch slips, the kernel hints, the padding
answers, layers that borrow the course, the timed part's own code at a tiny shape; on a
GPU machine one more test grades the solution in GPU mode, where the timed part counts.
"""

from __future__ import annotations

import nbformat
import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import keys_moe
from helpers.grading.assignments import moe as graded
from helpers.grading.assignments import moe_blocks as mb
from helpers.grading.assignments import moe_dispatch as md
from helpers.kernels import moe

from planting import check_kernel_as_on_a_gpu, parts_of, solution  # tests/planting.py

SOLUTION = solution("08_moe")
SPEC = registry.get("08_moe")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
GPU_LIMITS = grader.Limits(cell_timeout=540, part_timeout=540, total_timeout=1200,
                           memory_mb=16384)


def test_the_assignment_is_registered_and_counts_26_points():
    assert registry.MODULES["08_moe"] == "helpers.grading.assignments.moe"
    assert SPEC.max_points == 26 and CPU_MAX == 23


# ------------------------------------------------------------------------------------
# More slips, judged in this process: the learner's functions called directly.
# ------------------------------------------------------------------------------------

def route(logits, top_k):
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def make_dispatch(minlength=True, offsets_end=False, clamp=True, drop=True, keep_last=False,
                  rows_are_copies=False, tuple_out=False, by_token=False):
    def dispatch(ids, experts, capacity=None):
        T, top_k = ids.shape
        flat = ids.reshape(-1)
        dev = ids.device
        copy = torch.arange(T * top_k, device=dev)
        first = copy if by_token else torch.argsort((copy % top_k) * T + copy // top_k)
        order = first[torch.argsort(flat[first], stable=True)]     # by expert, then priority
        counts = torch.bincount(flat, minlength=experts if minlength else 0)
        starts = torch.cumsum(counts, 0) - counts
        if capacity is not None:
            ends = starts + counts
            rank = (ends[flat[order]] - 1 - torch.arange(order.numel(), device=dev) if keep_last
                    else torch.arange(order.numel(), device=dev) - starts[flat[order]])
            if drop:
                order = order[rank < capacity]
            counts = counts.clamp(max=capacity) if clamp else counts
        offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        if offsets_end:
            offsets = torch.cat([torch.cumsum(counts, 0), counts.sum(0, keepdim=True)])
        position = torch.full((T * top_k,), -1, dtype=torch.long, device=dev)
        position[order] = torch.arange(order.numel(), device=dev)
        rows = order if rows_are_copies else order // top_k
        fields = (order, rows, counts, offsets, position.view(T, top_k))
        return fields if tuple_out else moe.Dispatch(*fields)
    return dispatch


def verdicts(**answers):
    ns = {"route": route, "dispatch": make_dispatch(), **answers}
    return {fb.part.split()[0]: fb for fb in [*graded.check_route(ns),
                                               *graded.check_dispatch(ns)]}


SLIPS = [  # (answers, {part: words}); every other part of 1a-1d must pass
    ({}, {}),
    ({"route": lambda logits, k: route(-logits, k)}, {"1a": "smallest"}),
    ({"route": lambda logits, k: (route(logits, k)[0].half(), route(logits, k)[1])},
     {"1a": "keep them in float32"}),
    ({"route": lambda logits, k: route(logits, k)[::-1]}, {"1a": "ids are float32"}),
    ({"route": lambda logits, k: moe.route(logits, k)}, {"1a": "calls the course's"}),
    ({"dispatch": make_dispatch(offsets_end=True)},
     {"1b": "where expert e's rows end", "1c": "where expert e's rows end",
      "1d": "where expert e's rows end"}),
    ({"dispatch": make_dispatch(minlength=False)}, {"1c": "minlength"}),
    ({"dispatch": make_dispatch(clamp=False)}, {"1d": "count the rows it keeps"}),
    ({"dispatch": make_dispatch(drop=False, clamp=False)}, {"1d": "still count the copies"}),
    ({"dispatch": make_dispatch(drop=False)}, {"1d": "keeps all"}),
    ({"dispatch": make_dispatch(keep_last=True)}, {"1d": "lower priority than one it drops"}),
    ({"dispatch": make_dispatch(by_token=True)}, {"1d": "earliest tokens whatever their choice"}),
    ({"dispatch": make_dispatch(rows_are_copies=True)},
     {"1b": "order[r] // top_k", "1c": "order[r] // top_k", "1d": "order[r] // top_k"}),
    ({"dispatch": make_dispatch(tuple_out=True)},
     {"1b": "return moe.Dispatch", "1c": "return moe.Dispatch", "1d": "return moe.Dispatch"}),
    ({"dispatch": lambda ids, experts, capacity=None: moe.dispatch(ids, experts, capacity)},
     {"1b": "calls the course's", "1c": "calls the course's", "1d": "calls the course's"}),
]


@pytest.mark.parametrize("answers, expected", SLIPS, ids=range(len(SLIPS)))
def test_each_dispatch_slip_loses_its_parts_with_a_message_that_names_it(answers, expected):
    for key, fb in verdicts(**answers).items():
        if key in expected:
            assert not fb.passed and expected[key] in fb.message, fb
        else:
            assert fb.passed, fb


def test_messages_never_show_the_expected_counts_or_offsets():
    fb = verdicts(dispatch=make_dispatch(offsets_end=True))["1b"]
    spec = md.DISPATCHES[0]
    want = moe.dispatch(md.dispatch_inputs(md.trial_case(spec[0], 0), spec), spec[3])
    assert str(want.offsets.tolist()) not in fb.message and str(want.counts.tolist()) \
        not in fb.message


def test_the_routings_come_from_the_seed_and_hold_the_edges():
    def ids(spec, seed):
        return md.dispatch_inputs(md.trial_case(spec[0], seed), spec)
    for spec in md.DISPATCHES:
        E, top_k = spec[3], spec[4]
        a, b = ids(spec, 3), ids(spec, 4)
        assert a.shape == (spec[2], top_k) and int(a.max()) < E
        assert all(len(set(row)) == top_k for row in a.tolist()), spec[0]   # distinct experts
        used = torch.bincount(a.flatten(), minlength=E)
        if spec[1] in ("ordinary", "capacity"):     # the bincount plant passes these
            assert used.all(), spec[0]
        if spec[5] in ("every", "skewed", "empty"):
            assert not torch.equal(a, b), spec[0]
    empty = md.DISPATCHES[2]
    assert (torch.bincount(ids(empty, 5).flatten(), minlength=10)[[0, 3, 7, 8, 9]] == 0).all()
    for spec in md.DISPATCHES:
        if spec[6] is not None and spec[6] < 32:    # each capacity case drops some copies
            assert moe.dispatch(ids(spec, 3), spec[3], spec[6]).dropped > 0, spec[0]


def make_align(empty_block=False, length="fewest", marker=None, rows_not_copies=False):
    def align_blocks(d, block_m):
        R, E, copies = d.order.numel(), d.counts.numel(), d.position.numel()
        dev = d.order.device
        counts = d.counts.long()
        per_expert = (counts + block_m - 1) // block_m
        if empty_block:
            per_expert = per_expert.clamp(min=1)
        blocks = {"fewest": min(E, R) + (R - min(E, R)) // block_m,
                  "course": min(R, R // block_m + E),
                  "counts": int(per_expert.sum())}[length]
        blocks += E if empty_block else 0        # room for a block per empty expert
        first = torch.cumsum(per_expert, 0) - per_expert
        expert_of_row = torch.repeat_interleave(torch.arange(E, device=dev), counts,
                                                output_size=R)
        row = torch.arange(R, device=dev)
        slot = first[expert_of_row] * block_m + row - d.offsets[:-1][expert_of_row]
        slots = torch.full((blocks * block_m,), copies if marker is None else marker, device=dev)
        slots[slot] = row if rows_not_copies else d.order
        owner = torch.searchsorted(torch.cumsum(per_expert, 0), torch.arange(blocks, device=dev),
                                   right=True)
        return slots, torch.where(owner < E, owner, -1)
    return align_blocks


ALIGN_SLIPS = [  # (align, {part: words}); the other part of 2a-2b must pass
    (make_align(), {}),
    (make_align(empty_block=True), {"2a": "holds no copy but block_expert says expert",
                                    "2b": "more than any counts"}),
    (make_align(length="course"), {"2b": "more than any counts of R rows over E experts"}),
    (make_align(length="counts"), {"2b": "the length depends on the routing"}),
    (make_align(marker=-1), {"2a": "neither a copy number"}),
    (make_align(rows_not_copies=True), {"2a": "copy"}),
    (lambda d, block_m: [t.float() for t in make_align()(d, block_m)],
     {"2a": "1-D tensor of integers", "2b": "1-D tensor of integers"}),
]


@pytest.mark.parametrize("align, expected", ALIGN_SLIPS, ids=range(len(ALIGN_SLIPS)))
def test_each_layout_slip_loses_its_part_with_a_message_that_names_it(align, expected):
    for fb in graded.check_align({"align_blocks": align}):
        key = fb.part.split()[0]
        if key in expected:
            assert not fb.passed and expected[key] in fb.message, fb
        else:
            assert fb.passed, fb


def test_the_grader_s_bound_is_the_costliest_counts():
    # Checked against every way to put R rows on E experts, for small sizes.
    import itertools

    for R, E, bm in itertools.product(range(0, 9), range(1, 5), (1, 2, 3, 4)):
        worst = max(sum(-(-c // bm) for c in counts)
                    for counts in itertools.product(range(R + 1), repeat=E) if sum(counts) == R)
        assert mb.fewest_blocks(R, E, bm) == worst, (R, E, bm)


def test_the_kernel_hints_read_the_pattern_of_wrong_rows():
    # Judged on made-up outputs: no kernel runs.
    case = mb.TASK.case("test", (9, 4, 2, "every"), 8, 8, torch.float32, "kernel").seeded(1)
    a, w, ids = mb.TASK.inputs(case, "cpu")
    expert = ids.reshape(-1)
    right = mb.TASK.reference(case, (a, w, ids))[0]
    copy = torch.arange(18)
    rowwise = torch.stack([a[min(c, 8)] @ w[expert[c]] for c in copy.tolist()])
    assert "reads token t's row" in mb._kernel_hint(rowwise, (a, w, ids))
    shifted = torch.stack([a[c // 2] @ w[(expert[c] + (c == 5)) % 4] for c in copy.tolist()])
    assert "was multiplied by expert" in mb._kernel_hint(shifted, (a, w, ids))
    lost = right.clone()
    lost[7] = 5.0
    assert "holds what no expert gives" in mb._kernel_hint(lost, (a, w, ids))


def test_the_padding_key_names_the_usual_slips_and_hides_the_value():
    values = keys_moe.answer_key()
    assert set(values) == {f"{p}/{i}" for p, sizes in mb.PADDING_SIZES.items()
                           for i in range(len(sizes))}
    for part, (value, rel, mistakes) in values.items():
        others = [value] + [w for w, _ in mistakes]
        assert all(abs(x - y) > rel * abs(y) for i, x in enumerate(others)
                   for y in others[:i]), part      # no slip reads as another, or as right
    # The deterministic edge: top_k = E puts every token on every expert.
    assert values["3b/0"][0] == 4 * (-50 % 16)

    def check(fn):
        return list(graded.check_padding({"expected_padding": fn}))

    exact = {size: values[f"{p}/{i}"][0] for p, sizes in mb.PADDING_SIZES.items()
             for i, size in enumerate(sizes)}
    assert all(check(lambda *size: exact[size]))
    fb = check(lambda T, E, k, bm: E * (-(T * k / E) % bm))[0]
    assert not fb.passed and "average count" in fb.message
    assert all(f"{v:.6g}" not in fb.message for v in exact.values())
    fb = check(lambda T, E, k, bm: exact[(T, E, k, bm)] * (1 + 1e-3))[0]
    assert not fb.passed and "simulation is not exact" in fb.message


def test_a_layer_that_borrows_the_course_is_refused():
    def course_forward(x, w, top_k):            # the course's grouped kernels, interpreted
        return moe.moe_forward(x, w, top_k)

    (fb,) = graded.check_layer({"moe_layer": course_forward})
    assert not fb.passed and "the course's helpers.kernels.moe.grouped.grouped_gemm" \
        in fb.message, fb
    (fb,) = graded.check_layer({"moe_layer": moe.moe_loop})
    assert not fb.passed and "calls the course's helpers.kernels.moe.route" in fb.message, fb
    (fb,) = graded.check_layer({"moe_layer": lambda x, w, top_k: x.clone()})
    assert not fb.passed and "no Triton kernel at all" in fb.message, fb


def test_unanswered_parts_say_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    ns = {"route": stub, "dispatch": stub, "moe_layer": stub}
    results = [*graded.check_route(ns), *graded.check_dispatch(ns), *graded.check_layer(ns)]
    assert [fb.status for fb in results] == ["not implemented"] * 5, results


def speed_raw(yours, course=1.0, loop=30.0, **extra):
    return {"gpu": "a GPU", "error": 5e-3, "yours": yours, "course": course, "loop": loop,
            "own": 3, "others": ["helpers.kernels.moe.grouped.combine_kernel"], **extra}


def test_the_speed_judge_wants_the_courses_speed_on_the_learners_own_kernel():
    judge = SPEC.part("4b").judge          # called directly: registry.judge waits for a GPU
    assert judge(speed_raw(2.0)).passed                      # 0.50x the course's speed
    fb = judge(speed_raw(2.5))
    assert not fb.passed and "0.40x its speed" in fb.message and "No host sync" in fb.message
    assert "differs from moe.moe_loop" in judge(speed_raw(1.0, error=0.5)).message
    borrowed = speed_raw(1.0, others=["helpers.kernels.moe.grouped.grouped_gemm_kernel"])
    assert "your own kernel" in judge(borrowed).message
    assert "your own kernel" in judge(speed_raw(1.0, own=0)).message


def test_gpu_mode_watches_the_kernel_through_the_learners_layout(tmp_path):
    # On a GPU the checks run the notebook's kernel interpreted (to watch its loads), called
    # through the learner's own align_blocks, a plain torch function of the notebook.
    nb = nbformat.read(SOLUTION, as_version=4)
    cells = [c.source.replace("if helpers.is_gpu()", "if False") for c in nb.cells
             if c.cell_type == "code" and c.source.startswith(
                 ("@triton.jit", "BLOCKS =", "def align_blocks"))]
    out = check_kernel_as_on_a_gpu(
        tmp_path, "import torch\nimport triton\nimport triton.language as tl\n\n"
        + "\n\n".join(cells), "moe", "expert_matmul_kernel")
    assert "5 / 5 points" in out


def solution_module(folder, name="solution_08"):
    """The solution notebook's code cells as a module (Triton needs a file to read kernels
    from), imported in this process."""
    import importlib
    import sys

    nb = nbformat.read(SOLUTION, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith(
        ("import helpers", "def ", "@triton.jit", "BLOCKS ="))
        ]
    (folder / f"{name}.py").write_text("\n\n".join(cells) + "\n")
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


@pytest.mark.skipif(helpers.is_gpu(), reason="a CPU stand-in for the GPU part: on a GPU the "
                    "solution is graded for real (next test)")
def test_the_timed_part_collects_and_judges_the_solution_off_a_gpu(tmp_path, monkeypatch):
    # The GPU part's own code, run on the CPU at a tiny shape with a stand-in clock: the
    # layer is called, checked against moe_loop, its launches read, and the times judged.
    from helpers import bench

    learner = solution_module(tmp_path)
    tiny = moe.Shape("tiny", experts=8, top_k=2, hidden=32, width=32)
    monkeypatch.setattr(graded, "SPEED_SHAPE", tiny)
    monkeypatch.setattr(graded, "speed_inputs", lambda seed: (
        torch.randn(24, 32, generator=torch.Generator().manual_seed(seed)),
        moe.make_weights(8, 32, 32, seed=seed)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "a stand-in")
    times = iter([1.0, 0.9, 3.0])            # yours, the course's layer, the loop
    monkeypatch.setattr(bench, "time_ms", lambda f: next(times))
    raw = graded._collect_speed(vars(learner), 5)
    assert raw["own"] == 3 and raw["error"] < 1e-5, raw     # gate, up and down
    assert raw["others"] == [], raw
    fb = SPEC.part("4b").judge(raw)
    assert fb.passed and "0.90x its speed" in fb.message, fb


# ------------------------------------------------------------------------------------
# On a GPU machine: the timed part for real.
# ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed part)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")],
                                  assignment="08_moe", limits=GPU_LIMITS, mode="gpu",
                                  jobs=1)
    parts = parts_of(report.to_dict())
    assert report.score == report.max_score, report.to_text()
    assert report.max_score >= SPEC.max_points - 2, report.to_text()   # 2c may be unwatched
    assert "course's layer" in parts["4b"]["message"], parts["4b"]


def test_the_leaderboard_races_the_layout_and_the_kernel_together(tmp_path):
    # The class leaderboard times part 2's graded kernel: the learner's align_blocks, then
    # expert_matmul, on the race input (in CPU mode the first, small trial).
    from helpers.grading import leaderboard

    learner = vars(solution_module(tmp_path, "solution_08_race"))
    checked = leaderboard.serve(SPEC, {"race": "check", "seed": 3}, learner)
    assert "error" not in checked, checked
    timed = leaderboard.serve(SPEC, {"race": "time", "seed": 3}, learner)
    assert timed.get("ms", 0) > 0, timed
