"""Lesson 05's second record (``records.get("fusion_more")``) as tables: the five-op
softmax's kernels under the profiler, the two softmax spellings under ``torch.compile``,
and a matmul's epilogue fused or not.

Each function returns a list of dicts for :func:`helpers.plots.fusion.format_rows`.
"""

from __future__ import annotations

from ..experiments.fusion_more import SPELLINGS

MiB = 2**20
NAIVE, KEEPDIM = SPELLINGS          # the two spellings' row names, in that order


def _ms(entry: dict, name: str) -> float:
    return next(r for r in entry["rows"] if r["name"] == name)["ms"]


def profile_rows(entry: dict, copy_gbps: float | None = None) -> list[dict]:
    """The five-op softmax's kernels as the profiler timed them, with the bytes each one's
    aten op must move, the bandwidth that makes and, given the copy bandwidth, the time
    those bytes would take at it."""
    rows = []
    for k in entry["kernels"]:
        row = {"#": k["position"], "aten op": k.get("op", "?"), "kernel": k["name"],
               "us": k["us"], "MiB moved": k["bytes"] / MiB if "bytes" in k else float("nan"),
               "GB/s": k.get("gbps", float("nan"))}
        if copy_gbps:
            row["us at copy rate"] = k["bytes"] / copy_gbps / 1e3 if "bytes" in k else float("nan")
        rows.append(row)
    return rows


def profile_summary(entry: dict) -> dict:
    """Kernel time against the whole call: what launches and gaps between kernels add."""
    return {"kernels_us": entry["sum_kernel_us"], "span_us": entry["span_us"],
            "do_bench_us": 1e3 * entry["naive"]["ms"], "fused_us": 1e3 * entry["fused"]["ms"],
            "gaps_us": entry["span_us"] - entry["sum_kernel_us"]}


def spelling_rows(rec) -> list[dict]:
    """Per row length: both compiled spellings against torch.softmax and the fused kernel,
    and what Inductor generated for each (loops over the row, online-softmax reduction)."""
    rows = []
    for e in rec.results["spellings"]:
        code = e["code"]
        rows.append({"N": e["n"],
                     "[:, None] us": 1e3 * _ms(e, NAIVE), "keepdim us": 1e3 * _ms(e, KEEPDIM),
                     "torch.softmax us": 1e3 * _ms(e, "torch.softmax"),
                     "fused Triton us": 1e3 * _ms(e, "fused Triton"),
                     "loops [:, None]": code[NAIVE].get("row_loops", "?"),
                     "loops keepdim": code[KEEPDIM].get("row_loops", "?"),
                     "online keepdim": code[KEEPDIM].get("online_softmax", "?")})
    return rows


EPILOGUE = {
    "cuBLAS alone": "cuBLAS",
    "cuBLAS, then F.leaky_relu (2 kernels)": "cuBLAS + act",
    "Triton alone (no activation)": "Triton",
    "Triton, then F.leaky_relu (2 kernels)": "Triton + act",
    "Triton, leaky_relu in the epilogue (1 kernel)": "fused",
    "F.leaky_relu alone (the extra pass over C)": "act pass",
}


def _apart(a: dict, b: dict) -> str:
    """"yes" when two versions' rounds do not overlap (every round of one faster than every
    round of the other): their difference is outside the spread of the rounds."""
    return "yes" if a["ms_max"] < b["ms_min"] or b["ms_max"] < a["ms_min"] else "no"


def epilogue_rows(rec) -> list[dict]:
    """Per size, in microseconds: each version, then what the activation costs as a second
    kernel and as an epilogue (each against the Triton product alone, medians), the second
    kernel as a percentage of the product, and for each cost whether it lies outside the
    spread of the rounds (the two versions' rounds do not overlap)."""
    rows = []
    for e in rec.results["epilogue"]:
        by = {EPILOGUE[r["name"]]: r for r in e["rows"]}
        us = {short: 1e3 * r["ms"] for short, r in by.items()}
        rows.append({"n": e["n"], **{f"{k} us": us[k] for k in EPILOGUE.values()},
                     "2nd kernel adds": us["Triton + act"] - us["Triton"],
                     "% of product": 100 * (us["Triton + act"] - us["Triton"]) / us["Triton"],
                     "2nd: beyond spread": _apart(by["Triton + act"], by["Triton"]),
                     "epilogue adds": us["fused"] - us["Triton"],
                     "epilogue: beyond spread": _apart(by["fused"], by["Triton"])})
    return rows
