#!/usr/bin/env bash
# Exports the LIBERO scene cache (the input of the batched LIBERO backend) and checks it:
#
#   bash scripts/libero_export.sh [CACHE] [SUITE ...]    (default CACHE runs/libero_cache, the five suites)
#
# 1. the exporter in the reference venv .venv-libero (robosuite 1.4, mujoco 2.3.7) writes
#    CACHE/v1/<suite>/<index>_<task>/ per task (resumes: complete task folders are skipped);
# 2. every scene is loaded in the main venv's MuJoCo 4 and its body poses compared with mujoco
#    2.3.7's (after loading and after 200 substeps at rest), with box-box contacts that respond as
#    2.3.7's do (--box-contacts reference) -> CACHE/check.json, and with MuJoCo 4's own
#    -> CACHE/check-native.json (for information: its failures do not set the exit status).
# Needs .venv (bash scripts/setup.sh makes both venvs). See sims/libero/scenes.py. Exit status:
# 1 if a task failed to export or a scene exceeded the tolerances with reference box contacts.
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE="${1:-runs/libero_cache}"
shift || true
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(libero_spatial libero_object libero_goal libero_10 libero_90)
mkdir -p "$CACHE"
start=$(date +%s)
.venv/bin/python -m sims.libero.scenes export --cache "$CACHE" --suites "${SUITES[@]}" 2>"$CACHE/export.err" \
  | tee -a "$CACHE/export.log"
export_rc=${PIPESTATUS[0]}
echo "export: rc $export_rc, $(( $(date +%s) - start )) s (stderr in $CACHE/export.err)"
.venv/bin/python -m sims.libero.scenes check --cache "$CACHE" --suites "${SUITES[@]}" --box-contacts reference \
  --json "$CACHE/check.json"
check_rc=$?
echo "native box-box contacts (MuJoCo 4's own depth):"
.venv/bin/python -m sims.libero.scenes check --cache "$CACHE" --suites "${SUITES[@]}" --json "$CACHE/check-native.json"
exit $(( export_rc || check_rc ))
