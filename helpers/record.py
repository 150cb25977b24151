"""``./course record [NAME ...]``: run experiments on this GPU and write reference records.

With no names, every experiment runs. Commit the JSON files it writes: CPU-mode
notebooks draw their figures from them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import experiments, records, runtime


def main(argv: list[str] | None = None) -> int:
    known = sorted(experiments.load_all())
    parser = argparse.ArgumentParser(prog="./course record", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"experiments to run (default: all): {known}")
    parser.add_argument("--out", type=Path, default=records.RECORDS_DIR,
                        help="folder for the JSON files (default: helpers/records)")
    args = parser.parse_args(argv)
    if not runtime.is_gpu():
        print("./course record needs a CUDA GPU: records are real GPU measurements.",
              file=sys.stderr)
        return 2
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"unknown experiment(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    for name in args.names or known:
        start = time.perf_counter()
        try:
            rec = records.measure(name)
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


if __name__ == "__main__":
    sys.exit(main())
