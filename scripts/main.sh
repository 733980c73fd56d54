#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded default (MuJoCo on CPU).
# Extra arguments are Hydra overrides, e.g. `bash scripts/main.sh num_envs=16 out=runs/x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/embodied-pipeline "$@"
