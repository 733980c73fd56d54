"""Test session set-up: pick MuJoCo's offscreen GL platform before any test module imports
mujoco (MuJoCo fixes its GL backend at import time)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sims.mujoco  # noqa: E402,F401  (selects EGL, or OSMesa where EGL is missing)
