#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest.
# The tests run in TEST_WORKERS processes (pytest-xdist; default 2, one per core of the reference
# machine; 0 runs them in this process). Most tests are one single-threaded process start-up,
# simulation or tiny training each, so two at a time use both cores (a file stays on one worker:
# its module fixtures are built once).
# Then the LeRobot families' tests (tests/lerobot_families) run in .venv-lerobot, where LeRobot is installed;
# without that environment they are reported as not run, with the reason.
# First the linters (.pre-commit-config.yaml: ruff check, ruff format --check, codespell, the versions pinned
# in pyproject.toml's test extra); LINT=0 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${LINT:-1}" != "0" ]; then
  echo "[test] linters"
  if ! .venv/bin/pre-commit run --all-files --show-diff-on-failure; then
    echo "[test] the linters failed: '.venv/bin/ruff format . && .venv/bin/ruff check --fix .' fixes most of it" >&2
    exit 1
  fi
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0
workers="${TEST_WORKERS:-2}"
parallel=()
[ "$workers" != "0" ] && parallel=(-n "$workers" --dist loadfile)
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider "${parallel[@]}" --ignore=tests/lerobot_families "$@" tests || status=$?
if [ -x .venv-lerobot/bin/python ]; then
  echo "[test] the LeRobot families, in .venv-lerobot"
  lerobot_status=0
  # test by test (--dist load): three of its tests are one parametrised family loop, most of its time
  lerobot_parallel=()
  [ "$workers" != "0" ] && lerobot_parallel=(-n "$workers" --dist load)
  HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q -p no:cacheprovider "${lerobot_parallel[@]}" "$@" tests/lerobot_families || lerobot_status=$?
  # 5: the arguments selected none of these tests
  [ "$lerobot_status" -ne 0 ] && [ "$lerobot_status" -ne 5 ] && status=$lerobot_status
else
  echo "[test] tests/lerobot_families not run: .venv-lerobot is absent (scripts/setup.sh makes it where CPython 3.12 exists)"
fi
exit "$status"
