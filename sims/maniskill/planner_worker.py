"""The motion-planning process: runs ManiSkill's own panda solutions (``mani_skill.examples.motionplanning``,
on mplib) for :mod:`sims.maniskill.planner`, one request per episode.

It runs as ``python -P planner_worker.py`` with numpy 1 first on ``PYTHONPATH``: every mplib release
on PyPI is built against numpy 1's ABI and crashes under numpy 2, which the main process uses. So it
imports nothing of this project, and talks JSON lines: a request on stdin

    {"env_id": "PickCube-v1", "solver": "solvePickCube", "seed": 7, "state": {ManiSkill state dict, batch 1}}

and a reply on stdout (everything else the libraries print goes to stderr)

    {"planned": true, "success": true, "length": T, "qpos": [T x 7], "gripper": [T], "tcp": [T x 7],
     "root": [7], "pos_scale": 0.1, "rot_scale": -0.1}

``qpos`` and ``gripper`` are the joint targets and gripper commands the solution executed (ManiSkill's
``pd_joint_pos``: gripper +1 open, -1 closed); ``tcp`` the tool pose (position, quaternion wxyz) at each
joint target, in the robot's root frame; ``root`` the root's pose in the world; ``pos_scale`` and
``rot_scale`` the metres and radians one unit of ``pd_ee_delta_pose`` action moves.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import gymnasium as gym
import numpy as np


class _StartFrom(gym.Wrapper):
    """The solutions reset the env themselves: this reset puts the episode's state back after ManiSkill's
    seeded reset, and every executed action is recorded."""

    def __init__(self, env: gym.Env, seed: int, state: dict[str, Any]):
        super().__init__(env)
        self.start_seed, self.state, self.actions = seed, state, []

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        out = self.env.reset(seed=self.start_seed, options=options)
        self.env.unwrapped.set_state_dict(self.state)
        self.actions = []
        return out

    def step(self, action: Any) -> Any:
        self.actions.append(np.asarray(action, np.float64).reshape(-1))
        return self.env.step(action)


def _as_arrays(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        k: _as_arrays(v) if isinstance(v, dict) else torch.as_tensor(v, dtype=torch.float32) for k, v in state.items()
    }


def _tcp_at_targets(env: gym.Env, qpos: np.ndarray) -> np.ndarray:
    """``[T, 7]`` tool poses (p, q wxyz) in the root frame at the joint targets ``qpos [T, 7]``."""
    agent = env.unwrapped.agent
    model = agent.robot._objs[0].create_pinocchio_model()
    tcp = agent.tcp._objs[0].index  # the link's index in its articulation, as the pinocchio model numbers it
    full = agent.robot.get_qpos().cpu().numpy()[0].astype(np.float64)
    out = np.zeros((len(qpos), 7))
    for t, q in enumerate(qpos):
        full[: len(q)] = q
        model.compute_forward_kinematics(full)
        pose = model.get_link_pose(tcp)
        out[t, :3], out[t, 3:] = pose.p, pose.q
    return out


def plan(envs: dict[str, gym.Env], req: dict[str, Any]) -> dict[str, Any]:
    from mani_skill.examples.motionplanning.panda import solutions

    env_id = req["env_id"]
    if env_id not in envs:
        envs[env_id] = gym.make(
            env_id, obs_mode="none", control_mode="pd_joint_pos", sim_backend="physx_cpu", render_backend="none"
        )
    env = _StartFrom(envs[env_id], int(req["seed"]), _as_arrays(req["state"]))
    res = getattr(solutions, req["solver"])(env, seed=int(req["seed"]))
    actions = np.asarray(env.actions).reshape(len(env.actions), -1)
    agent = env.unwrapped.agent
    arm = agent._controller_configs["pd_ee_delta_pose"]["arm"]
    planned = not (isinstance(res, int) and res == -1)
    return {
        "planned": planned,
        "success": bool(planned and res[-1]["success"].item()),
        "length": len(actions),
        "qpos": actions[:, :7].tolist(),
        "gripper": actions[:, -1].tolist(),
        "tcp": _tcp_at_targets(env, actions[:, :7]).tolist(),
        "root": agent.robot.pose.raw_pose[0].cpu().numpy().tolist(),
        "pos_scale": float(np.max(arm.pos_upper)),
        "rot_scale": float(np.min(arm.rot_lower)),  # ManiSkill scales rotations by rot_lower (signed)
    }


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the libraries' prints (planner status, warnings) go to stderr, not into the replies
    sys.stdout = sys.stderr
    envs: dict[str, gym.Env] = {}
    for line in sys.stdin:
        try:
            reply = plan(envs, json.loads(line))
        except Exception as err:  # the parent reports it; the process keeps serving
            reply = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
