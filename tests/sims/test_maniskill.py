"""ManiSkill3 adapter (CPU PhysX, Vulkan rendering on lavapipe): the VecEnv contract on real tasks."""

from __future__ import annotations

import pytest
import torch

import sims

pytest.importorskip("mani_skill")


@pytest.fixture(autouse=True, scope="module")
def _vulkan():
    """ManiSkill renders through Vulkan; without a driver that has VK_KHR_external_semaphore_fd
    (scripts/setup.sh installs one from bookworm-backports) these tests cannot run here."""
    try:
        sims.make("maniskill", task="pick_cube", num_envs=1, cameras=("agentview",), image_size=16).close()
    except RuntimeError as err:
        if "vulkan" in str(err).lower() or "render" in str(err).lower():
            pytest.skip(f"no usable Vulkan driver for ManiSkill: {err}")
        raise


def test_maniskill_suite_follows_the_vecenv_contract():
    from sims.maniskill.env import TASKS

    env = sims.make("maniskill", suite="maniskill", num_envs=3, seed=0, cameras=("agentview",), image_size=48)
    assert len(env.tasks) == len(TASKS) >= 5 and env.tasks[0].instruction and env.control_hz == 20.0
    obs = env.reset(task_ids=[0, 1, 3], init_ids=[0, 1, 2])
    assert obs["rgb"].shape == (3, 1, 48, 48, 3) and obs["rgb"].dtype == torch.uint8 and obs["rgb"].float().std() > 0
    assert obs["state"].shape == (3, 15) and obs["task_id"].tolist() == [0, 1, 3]
    again = env.reset(task_ids=[0, 1, 3], init_ids=[0, 1, 2])
    assert torch.equal(obs["state"], again["state"]) and torch.equal(obs["privileged"], again["privileged"])
    up = torch.zeros(3, 7)
    up[:, 2] = 1.0
    z0 = obs["state"][:, 2].clone()
    for _ in range(5):
        obs, reward, term, trunc, info = env.step(up, active=torch.tensor([True, True, False]))
    assert (obs["state"][:2, 2] > z0[:2] + 0.02).all() and torch.equal(obs["state"][2], again["state"][2])
    assert info["elapsed"].tolist() == [5, 5, 0] and reward.shape == (3,)
    env.close()


def test_maniskill_step_limit_resets_and_chunks():
    env = sims.make("maniskill", task="push_cube", num_envs=2, seed=0, cameras=(), max_steps=4)
    env.reset()
    res = env.step_chunk(torch.zeros(2, 6, 7))
    assert res.truncated.all() and res.executed[:, :4].all() and not res.executed[:, 4:].any()
    assert res.episode["length"].tolist() == [4, 4]
    with pytest.raises(ValueError, match="unknown ManiSkill task"):
        sims.make("maniskill", task="open_drawer", num_envs=1)
    with pytest.raises(ValueError, match="no camera"):
        sims.make("maniskill", task="pick_cube", num_envs=1, cameras=("wrist",))
    env.close()


def test_maniskill_suite_in_embodied_train_and_eval(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import policies

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="1")
    init = policies.save(
        policies.make(
            "flow",
            expert_layers=1,
            d_model=32,
            image_size=32,
            vision_channels=[8, 16],
            chunk_size=3,
            prefix_layers=1,
            cameras=["agentview"],
        ),
        tmp_path / "init",
    )
    train = subprocess.run(
        [
            str(bin_dir / "embodied-train"),
            f"init={init}",
            f"out={tmp_path / 'rl'}",
            "suite=maniskill",
            "tasks=[0,1]",
            "num_envs=2",
            "image_size=32",
            "chunks_per_iter=2",
            "algo.minibatch_size=4",
            "iterations=1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    ev = subprocess.run(
        [
            str(bin_dir / "embodied-eval"),
            f"checkpoint={tmp_path / 'rl' / 'checkpoint' / 'policy'}",
            "suite=maniskill",
            "tasks=[1]",
            "episodes=2",
            "num_envs=2",
            "image_size=32",
            "videos=none",
            f"out={tmp_path / 'ev'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["suites"]["maniskill"]["tasks"][0]["name"] == "push_cube" and res["suites"]["maniskill"]["episodes"] == 2


def test_sim_benchmark_gpu_backends_section(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "b"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "embodied-bench"),
            "bench=sim",
            f"out={out}",
            "num_envs=[2]",
            "num_threads=[1]",
            "repeats=1",
            "steps=3",
            "cameras=[]",
            "rollout=false",
            "workload_suites=[]",  # the RL workload table has its own test (tests/benchmarks/test_bench.py)
            "gpu_backends=[maniskill]",
            "gpu_num_envs=[2]",
            "gpu_steps=3",
            "gpu_repeats=1",
            "gpu_image_size=32",
            "warmup_steps=1",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "sim.json").read_text())["gpu_backends"]
    assert [(r["backend"], r["camera"]) for r in rows] == [("maniskill", False), ("maniskill", True)]
    assert all(r["env_steps_per_s"] > 0 for r in rows)
