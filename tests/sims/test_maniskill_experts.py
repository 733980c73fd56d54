"""ManiSkill's motion planners as the experts of suite ``maniskill`` (real ManiSkill scenes on CPU PhysX,
the planner process with mplib on numpy 1): the action conversion, a solved episode, and demonstrations
that embodied-collect writes and embodied-sft trains on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import sims

pytest.importorskip("mani_skill")
pytest.importorskip("mplib")

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True, scope="module")
def _planner_setup():
    from sims.maniskill.planner import PlannerSetupError, check_setup

    try:
        check_setup()
    except PlannerSetupError as err:
        pytest.skip(f"ManiSkill's planners cannot run here: {err}")


def test_ee_delta_action_inverts_maniskills_controller():
    """The action makes ManiSkill's PDEEPoseController aim at the target (its own maths, run forward)."""
    from mani_skill.utils.geometry.rotation_conversions import (
        euler_angles_to_matrix,
        matrix_to_quaternion,
        quaternion_apply,
        quaternion_invert,
        quaternion_multiply,
    )

    from sims.maniskill.experts import ee_delta_action

    def quat(axis, angle):
        axis = torch.as_tensor(axis, dtype=torch.float64) / np.linalg.norm(axis)
        return torch.cat([torch.cos(torch.tensor([angle / 2])), torch.sin(torch.tensor(angle / 2)) * axis])

    root = torch.stack([torch.cat([torch.tensor([-0.615, 0.1, 0.0]), quat([0, 0, 1], 0.3)])] * 2).double()
    tcp = torch.stack(
        [
            torch.cat([torch.tensor([0.0, 0.05, 0.2]), quat([0, 1, 0], np.pi)]),
            torch.cat([torch.zeros(3), quat([1, 1, 0], 2.5)]),
        ]
    ).double()
    cur_p = quaternion_apply(quaternion_invert(root[:, 3:]), tcp[:, :3] - root[:, :3])
    cur_q = quaternion_multiply(quaternion_invert(root[:, 3:]), tcp[:, 3:])
    target = torch.cat(
        [cur_p + torch.tensor([[0.03, -0.02, 0.05]]), quaternion_multiply(quat([1, 2, 3], 0.04), cur_q)], 1
    )
    action = ee_delta_action(target, tcp, root, 0.1, -0.1)
    assert action.shape == (2, 6) and action.abs().max() <= 1.0
    torch.testing.assert_close(action[:, :3], torch.tensor([[0.3, -0.2, 0.5]] * 2).double())
    delta_q = matrix_to_quaternion(euler_angles_to_matrix(action[:, 3:] * -0.1, "XYZ"))
    reached = quaternion_multiply(delta_q, cur_q)
    assert torch.allclose((reached * target[:, 3:]).sum(1).abs(), torch.ones(2, dtype=torch.float64), atol=1e-9)
    same = ee_delta_action(torch.cat([cur_p, cur_q], 1), tcp, root, 0.1, -0.1)
    assert same.abs().max() < 1e-9


def test_planner_process_starts_from_the_envs_state_and_survives_a_failing_solution():
    from sims.maniskill.planner import PlannerProcess, SolutionError

    env = sims.make("maniskill", task="pick_cube", num_envs=1, seed=0, cameras=(), sim_backend="physx_cpu")
    try:
        obs = env.reset(init_ids=[10001])
        env_id, seed, state = env.sim_state(0)
        with PlannerProcess() as planner:
            with pytest.raises(SolutionError, match="solveNothing"):
                planner.plan(env_id, "solveNothing", seed, state)
            plan = planner.plan(env_id, "solvePickCube", seed, state)
    finally:
        env.close()
    assert env_id == "PickCube-v1" and plan.planned and plan.success and plan.tcp.shape == (plan.length, 7)
    root = torch.as_tensor(plan.root[:3]).float()
    # its first target is next to the env's tool, its last at the env's goal (privileged: is_grasped, goal_pos),
    # within the screw motion's tolerance (PickCube's goal threshold is 25 mm)
    assert torch.dist(torch.as_tensor(plan.tcp[0, :3]).float() + root, obs["state"][0, :3]) < 0.02
    assert torch.dist(torch.as_tensor(plan.tcp[-1, :3]).float() + root, obs["privileged"][0, 1:4]) < 0.01
    assert set(plan.gripper.tolist()) == {1.0, -1.0} and plan.rot_scale == -0.1 and plan.pos_scale == 0.1


def test_expert_solves_pick_cube_through_the_registry():
    env = sims.make("maniskill", task="pick_cube", num_envs=1, seed=0, cameras=(), sim_backend="physx_cpu")
    with pytest.raises(ValueError, match="expert_gain=1"):
        sims.suites.expert("maniskill", gain=0.5, env=env)
    with pytest.raises(ValueError, match="pass env="):
        sims.suites.expert("maniskill")
    expert = sims.suites.expert("maniskill", env=env)
    try:
        obs = env.reset(init_ids=[10000])
        expert.reset()
        actions, success = [], False
        for _ in range(env.tasks[0].max_steps):
            act = expert.act(obs)
            actions.append(act)
            obs, _, _, _, info = env.step(act)
            if info["done"][0]:
                success = bool(info["success"][0])
                break
        plan = expert.plans[0]
        assert plan.planned and plan.success and success and not expert.failures
        acts = torch.cat(actions)
        assert acts.shape[1] == 7 and acts.abs().max() <= 1.0
        assert acts[0, 6] == -1.0 and (acts[:, 6] == 1.0).any()  # starts open, grasps (ours: +1 closed)
        assert len(acts) <= plan.length  # it succeeds within the planner's own motion
    finally:
        expert.close()
        env.close()


def test_expert_refuses_tasks_without_a_solution():
    env = sims.make("maniskill", suite="maniskill", num_envs=1, seed=0, cameras=(), sim_backend="physx_cpu")
    try:
        expert = sims.suites.expert("maniskill", env=env)
        with pytest.raises(ValueError, match="no motion-planning solution for \\['poke_cube'\\]"):
            expert.check_tasks([0, 5])
    finally:
        env.close()


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=900, check=False)


def test_collect_two_demonstrations_then_sft_reads_them(tmp_path):
    from embodied.data.lerobot_format import Dataset

    data = tmp_path / "demos"
    proc = _run(
        str(BIN / "embodied-collect"),
        "suite=maniskill",
        "tasks=[0]",
        "episodes_per_task=2",
        "cameras=[agentview]",
        "image_size=16",
        "num_envs=2",
        f"out={data}",
    )
    if proc.returncode != 0 and "vulkan" in proc.stderr.lower():
        pytest.skip(f"no usable Vulkan driver for ManiSkill's cameras: {proc.stderr[-500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((data / "summary.json").read_text())
    assert summary["tasks"][0]["name"] == "pick_cube" and summary["episodes"] == 2
    ds = Dataset(data)
    assert ds.num_episodes == 2 and ds.cameras == ["agentview"] and ds.info["embodied"]["action_mode"] == "ee_delta"
    for e in range(2):
        ep = ds.episode(e)
        assert ep["meta"]["success"] and ep["next.success"][-1] and not ep["next.success"][:-1].any()
        assert ep["rgb"].shape == (len(ep["action"]), 1, 16, 16, 3) and ep["observation.state"].shape[1] == 15
        assert np.abs(ep["action"]).max() <= 1.0 and ep["meta"]["init_id"] >= 10000  # training states only

    out = tmp_path / "sft"
    proc = _run(
        str(BIN / "embodied-sft"),
        f"data={data}",
        f"out={out}",
        "steps=3",
        "policy=flow",
        "policy.d_model=32",
        "policy.image_size=32",
        "policy.vision_channels=[8,16]",
        "policy.chunk_size=3",
        "policy.prefix_layers=1",
        "policy.expert_layers=1",
        "policy.cameras=[agentview]",
        "batch_size=4",
        "warmup_steps=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "sft.json").read_text())["steps"] == 3 and (out / "ckpt" / "model.safetensors").is_file()
