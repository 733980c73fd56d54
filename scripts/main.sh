#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded default (MuJoCo on CPU).
# Extra arguments are Hydra overrides, e.g. `bash scripts/main.sh num_envs=16 out=runs/x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# One torch thread unless told otherwise: the thread count changes the order of floating-point sums,
# so the same job on a machine with another number of cores would train another SFT policy.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/embodied-pipeline "$@"
