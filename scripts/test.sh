#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
