"""The performance report's rows, and how an extractor reads a record to make them.

* :class:`Fields`: a record's results, read so that a missing field raises
  :class:`RecordFieldError` naming the record file and the field's path;
* :class:`Row`: one comparison (kernel, shape, ours, baseline, ratio, fraction of peak,
  verdicts on the course's :data:`~helpers.performance.targets.TARGETS`);
* :class:`Context`: one record opened for reading (its results, its GPU, the GPU's peaks
  from :mod:`helpers.hardware`), which builds rows;
* the small readers the extractors share: a version's time or why it has none, ratios,
  geometric means.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import bench, hardware, records
from .targets import TARGETS, number


class RecordFieldError(LookupError):
    """A record lacks a field the report reads."""


class Fields:
    """Part of a record's results. Reading a field it lacks raises :class:`RecordFieldError`
    with the record and the field's path (``results.sizes[3].triton_ms``)."""

    def __init__(self, value, where: str, path: str = "results"):
        self.value, self.where, self.path = value, where, path

    def _missing(self, what: str) -> RecordFieldError:
        return RecordFieldError(
            f"{self.where}: {what}. The performance report reads it (helpers/performance/"
            "extractors.py): re-record the experiment with ./course record, or update the "
            "extractor.")

    def _wrap(self, value, path: str):
        return Fields(value, self.where, path) if isinstance(value, (dict, list)) else value

    def __getitem__(self, key):
        step = f"[{key}]" if isinstance(key, int) else f".{key}"
        try:
            value = self.value[key]
        except (KeyError, IndexError, TypeError):
            raise self._missing(f"no field {self.path}{step}") from None
        return self._wrap(value, self.path + step)

    def __contains__(self, key) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self):
        if not isinstance(self.value, list):
            raise self._missing(f"{self.path} is not a list")
        return (self._wrap(v, f"{self.path}[{i}]") for i, v in enumerate(self.value))

    def where_(self, **match) -> list:
        """The items of this list whose fields equal ``match``."""
        return [item for item in self if all(k in item and item[k] == v for k, v in match.items())]

    def one(self, **match):
        """The first item of this list whose fields equal ``match`` (there must be one)."""
        found = self.where_(**match)
        if not found:
            said = ", ".join(f"{k}={v!r}" for k, v in match.items())
            raise self._missing(f"no item of {self.path} with {said}")
        return found[0]


@dataclass(frozen=True)
class Value:
    number: float | None   # None: the version did not run (``failed`` says why)
    unit: str
    failed: str = ""
    low: float | None = None    # the range over the rounds, where a record keeps several
    high: float | None = None

    def __str__(self) -> str:
        if self.number is None:
            return self.failed or "did not run"
        text = f"{self.number:.3g} ms" if self.unit == "ms" else \
            f"{number(self.number)} {self.unit}"
        if self.low is not None and self.high is not None:
            text += f" ({number(self.low)} to {number(self.high)})"
        return text


@dataclass(frozen=True)
class Verdict:
    target: str            # a key of TARGETS
    measured: float | None

    @property
    def met(self) -> bool:
        return TARGETS[self.target].met(self.measured)

    def __str__(self) -> str:
        t = TARGETS[self.target]
        value = "no value" if self.measured is None else t.show(self.measured)
        return f"{'met' if self.met else '**missed**'}: {value} ({t.text})"


@dataclass(frozen=True)
class Row:
    kernel: str
    shape: str
    ours: Value | None     # None: a summary over a sweep (a ratio only)
    baseline: str
    base: Value | None
    ratio: float | None    # baseline time / our time: how many times faster ours runs
    peak: float | None     # ours as a fraction of the GPU's datasheet peak
    peak_of: str = ""      # "HBM", or the dtype whose dense TFLOP/s is the peak
    verdicts: tuple = ()

    @property
    def missed(self) -> bool:
        return any(not v.met for v in self.verdicts)


class Context:
    """One record opened for reading: its results, its GPU and the GPU's peaks."""

    def __init__(self, rec: records.Record):
        prov = Fields(rec.provenance, f"the {rec.name} record", "provenance")
        self.gpu = prov["gpu_key"]
        self.where = f"helpers/records/{records.path_for(rec.name, self.gpu).name}"
        self.res = Fields(rec.results, self.where)
        self.spec = hardware.GPUS.get(self.gpu)

    def verdicts(self, *pairs) -> tuple:
        """``(target, measured)`` pairs as verdicts, leaving out targets not set for this GPU."""
        return tuple(Verdict(t, v) for t, v in pairs
                     if not TARGETS[t].gpus or self.gpu in TARGETS[t].gpus)

    def row(self, kernel: str, shape: str, baseline: str, ours: Value | None,
            base: Value | None, ratio: float | None, dtype: str | None = None,
            verdicts=()) -> Row:
        """A row; ``verdicts`` are ``(target, fn(row) -> measured value)`` pairs."""
        peak, peak_of = None, ""
        if self.spec is not None and ours is not None and ours.number is not None:
            peak_of = "HBM" if ours.unit == "GB/s" else dtype if ours.unit == "TFLOP/s" else ""
            if peak_of:
                top = self.spec.hbm_bandwidth_gbs if peak_of == "HBM" else self.spec.peak(dtype)
                peak = ours.number / top
        out = Row(kernel, shape, ours, baseline, base, ratio, peak, peak_of)
        return replace(out, verdicts=self.verdicts(*((t, fn(out)) for t, fn in verdicts)))


def timing(row, key: str = "ms", checked: bool = False) -> float | None:
    """A version's time (or rate), or None where the record says it failed or was refused,
    or, with ``checked`` (our kernels), that its result was outside the tolerance."""
    return None if failure(row, checked) else row[key]


def failure(row, checked: bool = False) -> str:
    """Why a version has no time: ``""`` when it has one."""
    if checked and "within_tolerance" in row and row["within_tolerance"] is False:
        return "wrong result"
    for key, said in (("unavailable", "unavailable"), ("oom", "out of memory"),
                      ("error", "failed")):
        if key in row:
            return said
    return ""


def ratio_of(ours_ms, base_ms) -> float | None:
    """How many times faster ours runs: the baseline's time over ours."""
    return None if ours_ms is None or base_ms is None else base_ms / ours_ms


def geomean_of(ratios) -> float | None:
    ratios = list(ratios)
    return None if None in ratios else bench.geomean(ratios)


def by_ratio(row: Row) -> float | None:
    return row.ratio


def by_peak(row: Row) -> float | None:
    return row.peak


def count(n: int) -> str:
    """``2^28`` for a power of two, ``4,000`` otherwise."""
    return f"2^{n.bit_length() - 1}" if n > 1 and n & (n - 1) == 0 else f"{n:,}"


def check_of(row, key: str = "ok") -> str:
    """What a version's entry in a record's correctness checks says against it: ``""`` when
    it passed, else ``"wrong result"`` or why it did not run."""
    return failure(row) or ("" if row[key] else "wrong result")


def versions(ctx: Context, entry, ours: str, baseline: str, kernel: str, shape: str, rate: str,
             dtype=None, verdicts=(), wrong: str = "", nbytes=None) -> Row:
    """Two of the versions of one recorded comparison (``entry["rows"]`` or
    ``entry["versions"]``, each with a name and ``ms``). ``rate``: ``"GB/s"``, counting for
    both the bytes *ours* moves (``nbytes``, else its row's or the entry's ``bytes``), which
    is what the op must move, so the ratio of the rates is the ratio of the times; or
    ``"TFLOP/s"``, each version's own (every version is credited with the same FLOPs).
    ``wrong``: what the record's separate correctness check said against ours
    (:func:`check_of`), which then counts as not run."""
    rows = entry["rows"] if "rows" in entry else entry["versions"]
    o, b = rows.one(name=ours), rows.one(name=baseline)
    if rate == "GB/s" and nbytes is None:
        nbytes = (o if "bytes" in o else entry)["bytes"]
    o_value, b_value = rate_of(o, rate, nbytes, wrong, checked=True), rate_of(b, rate, nbytes)
    o_ms = None if o_value.number is None else o["ms"]
    return ctx.row(kernel, shape, baseline, o_value, b_value, ratio_of(o_ms, timing(b)), dtype,
                   verdicts)


def rate_of(row, rate: str, nbytes=None, wrong: str = "", checked: bool = False) -> Value:
    """A version's rate (GB/s of ``nbytes``, or its own TFLOP/s), with the range over the
    rounds where the record keeps one (``ms_min``, ``ms_max``); or why it has none."""
    failed = wrong or failure(row, checked)
    if failed:
        return Value(None, rate, failed)
    ms = row["ms"]
    value = bench.gbps(nbytes, ms) if rate == "GB/s" else row["tflops"]
    if "ms_min" in row and "ms_max" in row:
        return Value(value, rate, low=value * ms / row["ms_max"], high=value * ms / row["ms_min"])
    return Value(value, rate)


def summary(ctx: Context, kernel: str, shape: str, baseline: str, ratio, target: str = "") -> Row:
    """A row over a whole sweep: the geometric mean of the ratios, no single value."""
    return ctx.row(kernel, shape, baseline, None, None, ratio,
                   verdicts=[(target, by_ratio)] if target else ())
