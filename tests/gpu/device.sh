#!/usr/bin/env bash
# Run the course's GPU steps on a machine that has torch and triton but no Jupyter
# (the course's lent GPU machine). Jupyter's wheels travel in .whl/, downloaded on a
# networked machine (README, "Reference records"); they go to /tmp/site.
#
#   bash tests/gpu/device.sh record [NAME ...]    reference records -> $OUT (or helpers/records)
#                                                 (export COURSE_GIT_COMMIT=<the tree's commit>
#                                                 first: a copied tree cannot vouch for its own)
#   bash tests/gpu/device.sh notebooks [PATH ...] every notebook top to bottom, compiled (nbval-lax)
#   bash tests/gpu/device.sh pytest [ARGS ...]    the test suite in GPU mode
#   bash tests/gpu/device.sh grade [ARGS ...]     ./course grade, in GPU mode
#   bash tests/gpu/device.sh leaderboard [ARGS ...] ./course leaderboard, in GPU mode
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -d .whl ] && ! python3 -c 'import nbval' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
cmd="${1:-}"; [ $# -gt 0 ] && shift
case "$cmd" in
  record)    python3 -m helpers.record --out "${OUT:-helpers/records}" "$@" ;;
  notebooks) [ $# -gt 0 ] || set -- notebooks solutions
             python3 -m pytest -q -p no:cacheprovider --nbval-lax "$@" ;;
  pytest)    python3 -m pytest -q -p no:cacheprovider "$@" ;;
  grade)     python3 -m helpers.grading.grader "$@" ;;
  leaderboard) python3 -m helpers.grading.leaderboard "$@" ;;
  *) echo "unknown step ${cmd:-(none)}: use record, notebooks, pytest, grade or leaderboard" \
       "(see the header)" >&2; exit 2 ;;
esac
