"""A record-shaped fixture for lesson 08's tables, figures and checks: made-up times,
never written to helpers/records. The shapes, token counts, FLOPs, dispatch counts and
padding are computed the way the experiment computes them (a real skewed routing, on the
CPU); only the times are invented, from round rates picked so that the targets come out
met except the one :func:`record` names."""

from __future__ import annotations

import torch

from helpers import records
from helpers.experiments import moe as experiment
from helpers.kernels import moe

BLOCK_M = 64
# Made-up TFLOP/s per version and shape key.
RATES = {"few_large": {experiment.OURS: 560.0, experiment.OURS_SORTED: 580.0,
                       experiment.LOOP: 500.0, experiment.DENSE: 620.0},
         "many_small": {experiment.OURS: 450.0, experiment.OURS_SORTED: 470.0,
                        experiment.LOOP: 40.0, experiment.DENSE: 600.0}}
GMM_RATE = 430.0                       # row-major only; the column-major layout "refused"


def _timed(name: str, flops: float, rate: float) -> dict:
    ms = flops / (rate * 1e9)
    return {"name": name, "ms": ms, "tflops": rate}


def _counts(copies: int, experts: int) -> list[int]:
    counts = [copies // experts] * experts
    for e in range(copies % experts):
        counts[e] += 1
    return counts


def _experts(cfg, key, tokens) -> dict:
    s = experiment.shape_of(cfg, key)
    copies = tokens * s.top_k
    flops = moe.expert_flops(copies, s.hidden, s.width)
    summary = experiment.load_summary(_counts(copies, s.experts), BLOCK_M)
    versions = [_timed(n, flops, r) for n, r in RATES[key].items()]
    versions.insert(3, _timed(experiment.GMM["row-major"], flops, GMM_RATE))
    versions.insert(4, {"name": experiment.GMM["column-major"],
                        "unavailable": "RuntimeError: (fixture) layout refused"})
    return {"shape": key, "tokens": tokens, "copies": copies, "flops": flops, **summary,
            "versions": versions}


def _layer(entry: dict) -> dict:
    ours = entry["versions"][0]["ms"] * 1.25
    loop = ours * (6.0 if entry["shape"] == "many_small" else 1.1)
    return {**{k: entry[k] for k in ("shape", "tokens", "copies", "flops")},
            "versions": [{"name": experiment.OURS, "ms": ours},
                         {"name": experiment.LOOP, "ms": loop}]}


def _kernels(names_us, launches) -> dict:
    rows = [{"name": n, "calls": 1.0, "cuda_us": us} for n, us in names_us]
    return {"kernels": rows, "kernel_count": len(rows), "launches": float(launches),
            "total_us": sum(us for _, us in names_us)}


def _profile(key: str, cfg: dict) -> dict:
    E = cfg["shapes"][key]["experts"]
    us = (20.0, 15.0, 60.0, 700.0, 350.0, 40.0)
    stages = [{"stage": st, "cpu_us": 50.0, "cuda_us": u, "ms": u * 1.1e-3}
              for st, u in zip(experiment.STAGES, us)]
    ours = _kernels([("grouped_gemm_kernel", 1050.0), ("combine_kernel", 40.0),
                     ("nvjet_gemm", 20.0)], 14)
    loop = _kernels([("nvjet_gemm", 2000.0), ("index_add", 300.0)], 10 * E)
    return {"shape": key, "tokens": cfg["profile_tokens"], "repeats": 3, "stages": stages,
            experiment.OURS: ours, experiment.LOOP: loop}


def _imbalance(cfg: dict) -> dict:
    im = cfg["imbalance"]
    s = experiment.shape_of(cfg, im["shape"])
    T = im["tokens"]
    logits = experiment.router_logits(T, s.hidden, s.experts, seed=701)
    out = {**im, "copies": T * s.top_k, "levels": [], "block_m": BLOCK_M}
    for strength in im["strengths"]:
        _, ids = experiment.skewed_route(logits, s.top_k, strength, im["hot"])
        counts = torch.bincount(ids.reshape(-1), minlength=s.experts)
        lv = {"strength": strength, **experiment.load_summary(counts, BLOCK_M),
              "versions": [{"name": experiment.OURS, "ms": 1.0 + 0.01 * strength},
                           {"name": experiment.LOOP, "ms": 6.0 - 0.5 * strength}],
              "capacity": []}
        for f in im["capacity_factors"]:
            cap = moe.capacity(T, s.top_k, s.experts, f)
            dropped = int((counts - cap).clamp(min=0).sum())
            lv["capacity"].append({"factor": f, "capacity": cap, "dropped": dropped,
                                   "name": experiment.OURS, "ms": 0.9, "tflops": 1.0})
        out["levels"].append(lv)
    return out


def _checks(cfg: dict) -> list[dict]:
    out = []
    for key in cfg["shapes"]:
        rows = [{"name": n, "max_error": 0.01, "ok": True}
                for n in (experiment.OURS, experiment.OURS_SORTED, experiment.LOOP,
                          experiment.GMM["row-major"])]
        out.append({"shape": key, "tokens": cfg["shapes"][key]["tokens"][0], "dtype": "bf16",
                    "tolerance": [0.06, 0.06], "experts": rows,
                    "layer": [{"name": n, "max_error": 0.01, "ok": True}
                              for n in experiment.LAYER_VERSIONS]})
    return out


def record() -> records.Record:
    """The fixture: every target met but ``experts vs dense`` at E=128 (450 of 600 TFLOP/s,
    0.75x), and ``experts vs _grouped_mm`` at E=8 is 560/430 = 1.3x."""
    cfg = experiment.sizes()
    experts = [_experts(cfg, k, t) for k in cfg["shapes"] for t in cfg["shapes"][k]["tokens"]]
    results = {"config": cfg, "torch_has_grouped_mm": True,
               "gmm_layouts": {k: {"row-major": "ok", "column-major": "RuntimeError: (fixture)"}
                               for k in cfg["shapes"]},
               "checks": _checks(cfg), "experts": experts,
               "layer": [_layer(e) for e in experts],
               "profile": {k: _profile(k, cfg) for k in cfg["shapes"]},
               "imbalance": _imbalance(cfg), "seconds": 1.0}
    provenance = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_key": "H100-SXM", "date": "test fixture",
                  "torch": "-", "triton": "-"}
    return records.Record("moe", provenance, results)
