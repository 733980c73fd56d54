#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest.
# The tests run in TEST_WORKERS processes (pytest-xdist; default 2, one per core of the reference
# machine; 0 runs them in this process). Most tests are one single-threaded process start-up,
# simulation or tiny training each, so two at a time use both cores (a file stays on one worker:
# its module fixtures are built once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0
workers="${TEST_WORKERS:-2}"
parallel=()
[ "$workers" != "0" ] && parallel=(-n "$workers" --dist loadfile)
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@" tests
