"""The experts of suite ``maniskill``: ManiSkill's own motion-planning solutions
(``mani_skill.examples.motionplanning.panda.solutions``, on mplib), driving our batched env.

At the first :meth:`ManiSkillExpert.act` of an episode, the solution of env ``i``'s task runs on a
single-env CPU ManiSkill instance in ``pd_joint_pos`` started from that env's state
(:meth:`~sims.maniskill.env.ManiSkillVecEnv.sim_state`), in the planner process of
:mod:`sims.maniskill.planner`; it gives the joint target and gripper command of every control step.
The env keeps its action space, ``pd_ee_delta_pose`` (7-D in ``[-1, 1]``): at step ``k`` the expert
commands the end-effector delta from the tool's pose now to the tool's pose at the solution's joint
target ``k``, which is what the delta controller turns back into (nearly) that joint target, so the
env replays the solution's motion, closed loop: a step that falls short is made up at the next.
The demonstrations are thus in the action space every policy of the suite acts in.

    expert = sims.suites.expert("maniskill", env=env)     # env = sims.make("maniskill", suite="maniskill", ...)
    obs = env.reset(task_ids=..., init_ids=...); expert.reset()
    while ...: obs, *_ , info = env.step(expert.act(obs)); expert.reset(info["done"])
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np
import torch

from sims.maniskill.planner import Plan, PlannerProcess, SolutionError, check_setup
from sims.registry import Registry

#: our task name -> its ManiSkill panda solution (a function of mani_skill.examples.motionplanning.panda.solutions)
SOLUTIONS: Registry[str] = Registry(
    "ManiSkill motion-planning solution",
    {
        "pick_cube": "solvePickCube",
        "push_cube": "solvePushCube",
        "stack_cube": "solveStackCube",
        "pull_cube": "solvePullCube",
        "peg_insertion_side": "solvePegInsertionSide",
    },
)


def ee_delta_action(
    target: torch.Tensor, tcp: torch.Tensor, root: torch.Tensor, pos_scale: float, rot_scale: float
) -> torch.Tensor:
    """The ``pd_ee_delta_pose`` arm action ``[N, 6]`` (in ``[-1, 1]``, rotation norm <= 1) that sets the
    controller's target to ``target``: float ``[N, 7]`` tool poses (position, quaternion wxyz) in the robot's
    root frame, from ``tcp [N, 7]``, the tool's poses in the world, and ``root [N, 7]``, the root's pose in
    the world. The inverse of ManiSkill's ``PDEEPoseController``: position delta in the root frame,
    rotation ``delta * current`` with the delta as XYZ Euler angles, both divided by the action scales."""
    from mani_skill.utils.geometry.rotation_conversions import (
        matrix_to_euler_angles,
        quaternion_apply,
        quaternion_invert,
        quaternion_multiply,
        quaternion_to_matrix,
    )

    root_inv = quaternion_invert(root[:, 3:])
    pos = quaternion_apply(root_inv, tcp[:, :3] - root[:, :3])
    quat = quaternion_multiply(root_inv, tcp[:, 3:])
    dpos = ((target[:, :3] - pos) / pos_scale).clamp(-1.0, 1.0)
    dquat = quaternion_multiply(target[:, 3:], quaternion_invert(quat))
    drot = matrix_to_euler_angles(quaternion_to_matrix(dquat), "XYZ") / rot_scale
    norm = drot.norm(dim=1, keepdim=True)
    drot = torch.where(norm > 1.0, drot / norm.clamp_min(1e-12), drot)  # as the controller clips it
    return torch.cat([dpos, drot], 1)


class ManiSkillExpert:
    """ManiSkill's motion planners for every env of a ``maniskill`` env: ``act(obs) -> [N, 7]`` actions,
    ``expert(obs) -> [N, 1, 7]`` chunks, ``reset(done_mask)`` when episodes start (a planner runs at the
    next ``act`` of each). Each ``act`` advances every env's plan by one control step.

    Attributes:
        plans: the current plan of each env (None until its first ``act``), with the planner's own
            verdict (``plan.success``) beside the env's.
        failures: ``(task name, seed, message)`` of the solutions that raised; those envs hold still.
    """

    def __init__(self, env: Any, gain: float = 1.0):
        if gain != 1.0:
            raise ValueError(
                f"expert_gain={gain}: ManiSkill's planners time their own trajectories (joint velocity and "
                "acceleration limits); use expert_gain=1 with suite maniskill"
            )
        if not hasattr(env, "sim_state"):
            raise ValueError(f"ManiSkillExpert drives a sims.make('maniskill', ...) env, not {type(env).__name__}")
        if env.sim_backend != "physx_cpu":
            # a GPU scene builds each env's randomised geometry (PegInsertionSide's peg) from its own seed
            raise ValueError(
                "ManiSkill's planners replay on CPU scenes: make the env with sim_backend='physx_cpu' "
                "(a suite env, as embodied-collect makes, is one)"
            )
        check_setup()
        self.env, self.num_envs = env, env.num_envs
        self.plans: list[Plan | None] = [None] * self.num_envs
        self.failures: list[tuple[str, int, str]] = []
        self._step = np.zeros(self.num_envs, np.int64)
        self._planner: PlannerProcess | None = None

    def check_tasks(self, task_ids: Sequence[int]) -> None:
        """``ValueError`` naming the tasks among ``task_ids`` (indices of ``env.tasks``) that ManiSkill
        has no solution for."""
        missing = [self.env.tasks[t].name for t in task_ids if self.env.tasks[t].name not in SOLUTIONS]
        if missing:
            raise ValueError(
                f"ManiSkill has no motion-planning solution for {missing}; tasks with one: {SOLUTIONS.names()}"
            )

    def reset(self, mask: Any = None) -> None:
        """Forget the plans of the envs in ``mask`` (bool ``[N]``; None: all): they plan again at the next act."""
        m = np.ones(self.num_envs, bool) if mask is None else np.asarray(torch.as_tensor(mask).cpu(), bool)
        for i in np.flatnonzero(m):
            self.plans[i] = None
        self._step[m] = 0

    def _plan(self, i: int, task: str) -> Plan:
        if self._planner is None:
            self._planner = PlannerProcess()
            weakref.finalize(self, self._planner.close)
        env_id, seed, state = self.env.sim_state(i)
        try:
            return self._planner.plan(env_id, SOLUTIONS.lookup(task), seed, state)
        except SolutionError as err:  # this env holds still; its episode fails and is retried elsewhere
            self.failures.append((task, seed, str(err).splitlines()[0]))
            empty = np.zeros((0, 7))
            return Plan(False, False, empty, np.zeros(0), empty, np.array([0, 0, 0, 1.0, 0, 0, 0]), 1.0, 1.0)

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """float32 ``[N, 7]``: the arm's end-effector delta towards each plan's next tool pose, the plan's gripper."""
        task_ids = obs["task_id"].cpu().numpy()
        targets, roots = np.zeros((self.num_envs, 7)), np.zeros((self.num_envs, 7))
        grip, hold = np.full(self.num_envs, -1.0), np.zeros(self.num_envs, bool)
        scales = (1.0, 1.0)
        for i in range(self.num_envs):
            if self.plans[i] is None:
                self.plans[i] = self._plan(i, self.env.tasks[int(task_ids[i])].name)
            plan = self.plans[i]
            roots[i], scales = plan.root, (plan.pos_scale, plan.rot_scale)
            if plan.length == 0:
                hold[i] = True
                continue
            k = min(int(self._step[i]), plan.length - 1)
            targets[i], grip[i] = plan.tcp[k], -plan.gripper[k]  # ManiSkill: +1 open; ours: +1 closed
        self._step += 1
        tcp = obs["state"][:, :7].cpu().double()
        arm = ee_delta_action(torch.as_tensor(targets), tcp, torch.as_tensor(roots), *scales)
        arm[torch.as_tensor(hold)] = 0.0
        return torch.cat([arm, torch.as_tensor(grip)[:, None]], 1).float()

    def __call__(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.act(obs)[:, None, :]

    def close(self) -> None:
        """Stop the planner process (it also stops when the expert is garbage-collected)."""
        if self._planner is not None:
            self._planner.close()
            self._planner = None


__all__ = ["ManiSkillExpert", "SOLUTIONS", "ee_delta_action"]
