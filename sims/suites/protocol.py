"""The fixed evaluation protocol: initial state ``k`` of a task is a pure function of
(suite, task name, k) through :meth:`MujocoTask.init_rng`; the env draws it the same way."""

from __future__ import annotations

from typing import Any

from sims.protocol import ROBOT_INIT_NOISE


def initial_state(task: Any, init_id: int) -> dict[str, Any]:
    """Plain-data description of initial state ``init_id`` (what ``reset(init_ids=...)`` applies)."""
    rng = task.init_rng(init_id)
    joints = rng.uniform(-ROBOT_INIT_NOISE, ROBOT_INIT_NOISE, size=7)
    init = task.sample_init(rng)
    return {
        "init_id": init_id,
        "robot_joint_offsets": [float(v) for v in joints],
        "placement": {k: [float(v) for v in xyz] for k, xyz in sorted(init["placement"].items())},
        "velocity": {k: [float(v) for v in vel] for k, vel in sorted(init["velocity"].items())},
        "carriage_phase": {k: float(v) for k, v in sorted(init["carriage_phase"].items())},
    }
