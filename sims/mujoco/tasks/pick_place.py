"""Cube tasks: lift a cube, and pick a cube and place it on a target pad."""

from __future__ import annotations

import numpy as np

from sims.mujoco.arrays import xp_of
from sims.mujoco.scene import add_box, add_marker
from sims.mujoco.task import MujocoTask, Region, free_joint_qpos, free_joint_qvel, yaw_quat

CUBE_HALF = 0.02


def _at_height(pos, z: float):
    """Positions ``[N, 3]`` (numpy or torch) moved to height ``z`` (a new array)."""
    xp = xp_of(pos)
    return xp.concat([pos[:, :2], xp.full_like(pos[:, 2:], z)], axis=1)


class PickCube(MujocoTask):
    """Pick up the cube and lift it ``lift_height`` metres above the table."""

    name = "pick_cube"
    instruction = "pick up the red cube"
    max_steps = 80
    privileged_keys = (("cube_pos", 3), ("cube_quat", 4), ("goal_pos", 3))
    cube_region = Region(x=(-0.12, 0.12), y=(-0.15, 0.15))
    lift_height = 0.1

    def build(self, spec) -> None:
        add_box(spec, "cube", (CUBE_HALF,) * 3, (0.85, 0.1, 0.1, 1.0))

    def bind(self, env) -> None:
        super().bind(env)
        m = env.model
        self.cube_qpos = free_joint_qpos(m, "cube_joint")
        self.cube_qvel = free_joint_qvel(m, "cube_joint")
        self.cube_body = m.body("cube").id

    def sample_init(self, rng):
        return {"cube_xy": self.cube_region.sample(rng), "cube_yaw": np.array(rng.uniform(-np.pi, np.pi))}

    def apply_init(self, ids, inits):
        qpos = self.env.qpos
        for i, init in zip(ids, inits):
            qpos[i, self.cube_qpos] = np.concatenate([init["cube_xy"], [CUBE_HALF], yaw_quat(float(init["cube_yaw"]))])
        self.env.qvel[np.ix_(ids, np.arange(self.cube_qvel.start, self.cube_qvel.stop))] = 0.0

    # The predicates and rewards below run on numpy arrays or on torch tensors on the Warp device
    # (env.xp: the namespace of the fields they read).
    def cube_pos(self, ids):
        return self.env.qpos[ids, self.cube_qpos.start : self.cube_qpos.start + 3]

    def goal_pos(self, ids):
        return _at_height(self.cube_pos(ids), CUBE_HALF + self.lift_height)

    def success(self, ids):
        return self.cube_pos(ids)[:, 2] > CUBE_HALF + self.lift_height

    def privileged(self, ids):
        q = self.env.qpos[ids][:, self.cube_qpos]
        return self.env.xp.concat([q[:, :3], q[:, 3:7], self.goal_pos(ids)], axis=1)

    def dense_reward(self, ids):
        xp = self.env.xp
        reach = xp.linalg.vector_norm(self.env.tcp_pos()[ids] - self.cube_pos(ids), axis=1)
        lift = xp.clip((self.cube_pos(ids)[:, 2] - CUBE_HALF) / self.lift_height, 0.0, 1.0)
        return 0.3 * (1.0 - xp.tanh(10.0 * reach)) + 0.7 * lift


class PlaceCube(PickCube):
    """Pick up the cube and place it on the green pad, then let go."""

    name = "place_cube"
    instruction = "put the red cube on the green pad"
    max_steps = 120
    pad_radius = 0.04
    cube_region = Region(x=(-0.12, 0.12), y=(-0.15, -0.02))
    goal_region = Region(x=(-0.12, 0.12), y=(0.06, 0.15))

    def build(self, spec) -> None:
        super().build(spec)
        add_marker(spec, "goal_pad", self.pad_radius, (0.1, 0.75, 0.2, 1.0), flat=True)

    def bind(self, env) -> None:
        super().bind(env)
        self.mocap_id = env.model.body("goal_pad").mocapid[0]

    def sample_init(self, rng):
        init = super().sample_init(rng)
        init["goal_xy"] = self.goal_region.sample(rng)
        return init

    def apply_init(self, ids, inits):
        super().apply_init(ids, inits)
        for i, init in zip(ids, inits):
            self.env.mocap_pos[i, self.mocap_id] = [*init["goal_xy"], 0.0005]

    def goal_pos(self, ids):
        return _at_height(self.env.mocap_pos[ids, self.mocap_id], CUBE_HALF)

    def success(self, ids):
        xp = self.env.xp
        cube = self.cube_pos(ids)
        on_pad = xp.linalg.vector_norm(cube[:, :2] - self.goal_pos(ids)[:, :2], axis=1) < self.pad_radius
        resting = cube[:, 2] < CUBE_HALF + 0.005
        released = self.env.gripper_width()[ids] > 2 * CUBE_HALF + 0.01
        return on_pad & resting & released

    def dense_reward(self, ids):
        xp = self.env.xp
        cube = self.cube_pos(ids)
        reach = xp.linalg.vector_norm(self.env.tcp_pos()[ids] - cube, axis=1)
        to_goal = xp.linalg.vector_norm(cube[:, :2] - self.goal_pos(ids)[:, :2], axis=1)
        return (
            0.2 * (1.0 - xp.tanh(10.0 * reach))
            + 0.5 * (1.0 - xp.tanh(5.0 * to_goal))
            + 0.3 * xp.astype(self.success(ids), reach.dtype)
        )
