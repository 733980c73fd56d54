"""ManiSkill's motion planners, in a process of their own (:mod:`sims.maniskill.planner_worker`).

ManiSkill's panda solutions plan with mplib, and every mplib release on PyPI (0.0.9 .. 0.2.1) is built
against numpy 1's ABI: it crashes (a segmentation fault in its first call) under the numpy 2 this
project needs. The planner therefore runs in a child process of the same interpreter with numpy 1.26
first on its path (:data:`NUMPY1_DIR`, installed by scripts/setup.sh with :data:`NUMPY1_INSTALL`);
the two sides exchange plain JSON, never numpy pickles.

    with PlannerProcess() as planner:
        plan = planner.plan("PickCube-v1", "solvePickCube", seed, state)   # -> Plan
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: numpy 1 for the planner process, a ``pip --target`` folder inside the venv
NUMPY1_DIR = Path(sys.prefix) / "mplib-numpy1"
#: the command that installs it (scripts/setup.sh runs it)
NUMPY1_INSTALL = f"{sys.executable} -m pip install --no-deps --upgrade --target {NUMPY1_DIR} numpy==1.26.4"
WORKER = Path(__file__).resolve().parent / "planner_worker.py"


class PlannerSetupError(RuntimeError):
    """The planner process cannot start here (mplib or its numpy 1 missing)."""


class SolutionError(RuntimeError):
    """A solution raised in the planner process (which keeps serving)."""


@dataclass(frozen=True)
class Plan:
    """One episode as ManiSkill's solution executed it (T control steps, ``pd_joint_pos``).

    Attributes:
        planned: the solution found every motion it asked for (False: a step of it failed to plan).
        success: the task succeeded at the end of the executed solution (in the planner's own env).
        qpos: float64 ``[T, 7]`` arm joint targets.
        gripper: float64 ``[T]`` gripper commands, ManiSkill's sign (+1 open, -1 closed).
        tcp: float64 ``[T, 7]`` tool pose (position, quaternion wxyz) at each joint target, root frame.
        root: float64 ``[7]`` the robot root's pose in the world.
        pos_scale: metres one unit of ``pd_ee_delta_pose`` position action moves.
        rot_scale: radians one unit of its rotation action turns (signed, as ManiSkill scales it).
    """

    planned: bool
    success: bool
    qpos: np.ndarray
    gripper: np.ndarray
    tcp: np.ndarray
    root: np.ndarray
    pos_scale: float
    rot_scale: float

    @property
    def length(self) -> int:
        return len(self.gripper)


def check_setup() -> None:
    """Raise :class:`PlannerSetupError` (saying what to install) unless the planner process can run."""
    import importlib.util

    missing = [m for m in ("mani_skill", "mplib") if importlib.util.find_spec(m) is None]
    if missing:
        raise PlannerSetupError(f"ManiSkill's motion planners need {missing}: pip install -e '.[maniskill]'")
    if not (NUMPY1_DIR / "numpy" / "__init__.py").is_file():
        raise PlannerSetupError(
            f"ManiSkill's motion planners run mplib, which crashes under numpy 2, in a process with numpy 1 "
            f"from {NUMPY1_DIR}, which is missing: run `{NUMPY1_INSTALL}` (scripts/setup.sh does)"
        )


class PlannerProcess:
    """A running planner process; :meth:`plan` sends it one episode. Close it (or use ``with``)."""

    def __init__(self) -> None:
        check_setup()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = os.pathsep.join([str(NUMPY1_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
        env.setdefault("OMP_NUM_THREADS", "1")
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-P", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def _log_tail(self, chars: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]

    def plan(self, env_id: str, solver: str, seed: int, state: dict[str, Any]) -> Plan:
        """Run ``solver`` (a function of ``mani_skill.examples.motionplanning.panda.solutions``) on
        ``env_id`` from ``state`` (ManiSkill's state dict of one env, numpy or lists) after a reset with
        ``seed``. :class:`SolutionError` if the solution raised, ``RuntimeError`` if the process died."""
        if self._proc.poll() is not None:
            raise RuntimeError(f"the planner process has exited ({self._proc.returncode}):\n{self._log_tail()}")
        request = {"env_id": env_id, "solver": solver, "seed": int(seed), "state": _lists(state)}
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            raise RuntimeError(f"the planner process died ({self._proc.returncode}):\n{self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise SolutionError(f"{solver} on {env_id} (seed {seed}) failed: {reply['error']}\n{reply['traceback']}")
        arr = {k: np.asarray(reply[k], np.float64) for k in ("qpos", "gripper", "tcp", "root")}
        if reply["length"] == 0:
            arr["qpos"], arr["tcp"] = np.zeros((0, 7)), np.zeros((0, 7))
        return Plan(
            reply["planned"], reply["success"], **arr, pos_scale=reply["pos_scale"], rot_scale=reply["rot_scale"]
        )

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> "PlannerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _lists(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _lists(v) for k, v in tree.items()}
    return np.asarray(tree.cpu() if hasattr(tree, "cpu") else tree, np.float64).tolist()


__all__ = [
    "NUMPY1_DIR",
    "NUMPY1_INSTALL",
    "Plan",
    "PlannerProcess",
    "PlannerSetupError",
    "SolutionError",
    "check_setup",
]
