"""Scripted pick-and-place controller, batched over envs: waypoints through the EE controller.

It reads the privileged observation (cube pose, goal) and the proprioceptive state, and emits
end-effector delta actions ``[N, 7]``. A per-env phase machine: approach above the cube, descend,
close, lift; for placing, carry above the goal, lower, open and retreat.
"""

from __future__ import annotations

import numpy as np
import torch

from sims.mujoco.controller import EEDeltaConfig, quat_to_mat, rotation_error

APPROACH, DESCEND, GRASP, LIFT, CARRY, LOWER, RELEASE, RETREAT = range(8)


class PickPlaceExpert:
    """Waypoint expert for ``pick_cube`` (``place=False``) and ``place_cube`` (``place=True``).

    Call :meth:`reset` for envs whose episode restarted, then :meth:`act` each step.
    """

    def __init__(
        self,
        num_envs: int,
        *,
        place: bool,
        cfg: EEDeltaConfig = EEDeltaConfig(),
        gain: float = 1.0,
        pos_tol: float = 0.008,
    ):
        self.place = place
        self.cfg = cfg
        self.gain = gain
        self.pos_tol = pos_tol
        self.phase = np.zeros(num_envs, np.int64)
        self.timer = np.zeros(num_envs, np.int64)
        self.grasp_yaw = np.zeros(num_envs)

    def reset(self, mask: np.ndarray | torch.Tensor | None = None) -> None:
        idx = slice(None) if mask is None else np.asarray(mask.cpu() if isinstance(mask, torch.Tensor) else mask, bool)
        self.phase[idx] = APPROACH
        self.timer[idx] = 0

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        state = obs["state"].cpu().numpy().astype(np.float64)
        priv = obs["privileged"].cpu().numpy().astype(np.float64)
        tcp, tcp_quat = state[:, :3], state[:, 3:7]
        cube, cube_quat, goal = priv[:, :3], priv[:, 3:7], priv[:, 7:10]
        n = len(state)
        rot = quat_to_mat(tcp_quat)
        # Fingers close along the TCP y axis: align it with the cube face closest to it.
        cube_yaw = 2 * np.arctan2(cube_quat[:, 3], cube_quat[:, 0])
        tcp_y_yaw = np.arctan2(rot[:, 1, 1], rot[:, 0, 1])
        yaw = cube_yaw + np.round((tcp_y_yaw - cube_yaw) / (np.pi / 2)) * (np.pi / 2)
        track = self.phase <= DESCEND
        self.grasp_yaw[track] = yaw[track]

        target = tcp.copy()
        grip = np.full(n, -1.0)
        p = self.phase
        above = cube + np.array([0.0, 0.0, 0.08])
        carry_z = 0.16
        target[p == APPROACH] = above[p == APPROACH]
        target[p == DESCEND] = cube[p == DESCEND] + np.array([0.0, 0.0, 0.012])
        target[p == GRASP] = tcp[p == GRASP]
        grip[p >= GRASP] = 1.0
        lift_goal = goal if not self.place else np.concatenate([cube[:, :2], np.full((n, 1), carry_z)], 1)
        target[p == LIFT] = lift_goal[p == LIFT] + np.array([0.0, 0.0, 0.02 if not self.place else 0.0])
        over_goal = np.concatenate([goal[:, :2], np.full((n, 1), carry_z)], 1)
        target[p == CARRY] = over_goal[p == CARRY]
        target[p == LOWER] = goal[p == LOWER] + np.array([0.0, 0.0, 0.006])
        grip[p >= RELEASE] = -1.0
        target[p == RELEASE] = tcp[p == RELEASE]
        target[p == RETREAT] = over_goal[p == RETREAT]

        err = target - tcp
        dist = np.linalg.norm(err, axis=1)
        self.timer += 1
        advance = np.zeros(n, bool)
        advance |= (p == APPROACH) & (dist < 0.01)
        advance |= (p == DESCEND) & ((dist < self.pos_tol) | (self.timer > 30))
        advance |= (p == GRASP) & (self.timer > 6)
        advance |= (p == LIFT) & (dist < 0.02) & self.place
        advance |= (p == CARRY) & (dist < 0.015)
        advance |= (p == LOWER) & ((dist < self.pos_tol) | (self.timer > 30))
        advance |= (p == RELEASE) & (self.timer > 6)
        self.phase[advance] += 1
        self.timer[advance] = 0

        c, s = np.cos(self.grasp_yaw), np.sin(self.grasp_yaw)
        y_axis = np.stack([c, s, np.zeros(n)], 1)
        z_axis = np.tile([0.0, 0.0, -1.0], (n, 1))
        x_axis = np.cross(y_axis, z_axis)
        desired = np.stack([x_axis, y_axis, z_axis], axis=2)
        rot_err = rotation_error(rot, desired)

        action = np.zeros((n, 7))
        action[:, :3] = np.clip(self.gain * err / self.cfg.pos_scale, -1, 1)
        action[:, 3:6] = np.clip(rot_err / self.cfg.rot_scale, -1, 1)
        action[:, 6] = grip
        return torch.as_tensor(action, dtype=torch.float32)
