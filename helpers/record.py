"""``./course record [NAME ...]``: run experiments on this GPU and write reference records.

With no names, every experiment runs. Commit the JSON files it writes: CPU-mode
notebooks draw their figures from them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

from . import experiments, records, runtime


def main(argv: list[str] | None = None) -> int:
    registry = experiments.load_all()
    known = sorted(registry)
    parser = argparse.ArgumentParser(prog="./course record", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"experiments to run (default: all): {known}")
    parser.add_argument("--out", type=Path, default=records.RECORDS_DIR,
                        help="folder for the JSON files (default: helpers/records)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the one experiment named, e.g. --option part=2/2 "
                             "--option earlier=helpers/records/matmul_shapes__H200.json; VALUE "
                             "is read as JSON where it parses (numbers), else as text")
    args = parser.parse_args(argv)
    if not runtime.is_gpu():
        print("./course record needs a CUDA GPU: records are real GPU measurements.",
              file=sys.stderr)
        return 2
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"unknown experiment(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    try:
        options = _options(args.option, args.names, registry)
    except ValueError as err:
        print(f"./course record: {err}", file=sys.stderr)
        return 2
    for name in args.names or known:
        start = time.perf_counter()
        try:
            rec = records.measure(name, **options)
        except ValueError as err:
            if not options:
                raise
            # An option the experiment refused (a part that cannot continue, say): its
            # message says which and why.
            print(f"./course record {name}: {err}", file=sys.stderr)
            return 2
        except runtime.NeedsGPUError as err:
            if args.names:                   # asked for by name: say so and fail
                raise
            # Everything was asked for, and this one needs more GPUs than this machine
            # has (expert parallelism): skip it, say why, measure the rest.
            print(f"{name}: skipped, {err}", file=sys.stderr, flush=True)
            continue
        path = records.write(rec, args.out)
        print(f"{name}: {path} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


def _options(given: list[str], names: list[str], known: dict) -> dict:
    """``--option NAME=VALUE`` as keyword arguments of the one experiment named."""
    if not given:
        return {}
    if len(names) != 1:
        raise ValueError(f"--option goes to one experiment; name exactly one, not {names or 'all'}")
    params = inspect.signature(known[names[0]]).parameters
    options = {}
    for text in given:
        name, eq, value = text.partition("=")
        if not eq or name not in params:
            raise ValueError(f"--option {text!r}: write NAME=VALUE with NAME one of "
                             f"{names[0]}'s arguments {sorted(params)}")
        if name in options:
            raise ValueError(f"--option {name} is given twice")
        try:
            options[name] = json.loads(value)
        except ValueError:
            options[name] = value
    return options


if __name__ == "__main__":
    sys.exit(main())
