"""The GPU measurements behind the notebooks' tables and plots, one module per topic.

Each experiment is a function that runs on a GPU and returns plain JSON-able results.
``./course record`` runs them and writes reference records (:mod:`helpers.records`);
in GPU mode a notebook runs the same function live through :func:`helpers.records.get`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

EXPERIMENTS: dict[str, Callable[..., dict]] = {}


def experiment(name: str):
    """Register ``fn`` as the experiment called ``name``."""

    def register(fn: Callable[..., dict]) -> Callable[..., dict]:
        if name in EXPERIMENTS and EXPERIMENTS[name] is not fn:
            raise ValueError(f"two experiments are called {name!r}")
        EXPERIMENTS[name] = fn
        return fn

    return register


def load_all() -> dict[str, Callable[..., dict]]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return EXPERIMENTS


def run(name: str, **options) -> dict:
    load_all()
    if name not in EXPERIMENTS:
        raise KeyError(f"no experiment {name!r}; there are: {', '.join(sorted(EXPERIMENTS))}")
    return EXPERIMENTS[name](**options)
