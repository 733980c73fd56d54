"""Reach: move the gripper's centre to a target in free space (a state-only sanity task)."""

from __future__ import annotations

import numpy as np

from sims.mujoco.scene import add_marker
from sims.mujoco.task import MujocoTask, Region


class Reach(MujocoTask):
    """Bring the TCP within ``tolerance`` of the green sphere."""

    name = "reach"
    instruction = "move the gripper to the green ball"
    max_steps = 50
    privileged_keys = (("goal_pos", 3), ("tcp_to_goal", 3))
    region = Region(x=(-0.2, 0.15), y=(-0.2, 0.2))
    z_range = (0.08, 0.35)
    tolerance = 0.03

    def build(self, spec) -> None:
        add_marker(spec, "reach_goal", 0.02, (0.1, 0.8, 0.2, 0.6))

    def bind(self, env) -> None:
        super().bind(env)
        self.mocap_id = env.model.body("reach_goal").mocapid[0]

    def sample_init(self, rng):
        return {"goal": np.array([*self.region.sample(rng), rng.uniform(*self.z_range)])}

    def apply_init(self, ids, inits):
        for i, init in zip(ids, inits):
            self.env.mocap_pos[i, self.mocap_id] = init["goal"]

    # numpy or torch on the Warp device alike (env.xp)
    def goal_pos(self, ids):
        return self.env.mocap_pos[ids, self.mocap_id]

    def success(self, ids):
        xp = self.env.xp
        return xp.linalg.vector_norm(self.env.tcp_pos()[ids] - self.goal_pos(ids), axis=1) < self.tolerance

    def privileged(self, ids):
        goal = self.goal_pos(ids)
        return self.env.xp.concat([goal, goal - self.env.tcp_pos()[ids]], axis=1)

    def dense_reward(self, ids):
        xp = self.env.xp
        return 1.0 - xp.tanh(5.0 * xp.linalg.vector_norm(self.env.tcp_pos()[ids] - self.goal_pos(ids), axis=1))
