"""The loop on real LIBERO in our batched simulator, at tiny size on one exported libero_spatial task:
the scripted expert collects a demonstration, SFT trains on it, embodied-eval scores the policy and
embodied-train runs Flow-SDE PPO on the same scenes (real MuJoCo, real Ray)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_libero_venv

import policies
import sims
from embodied.data.collect import collect_suite
from embodied.data.training import load_demonstrations
from sims.libero import scenes

pytestmark = needs_libero_venv  # the scene export runs in the reference venv

BIN = Path(sys.executable).parent
TINY = [
    "policy.d_model=32",
    "policy.image_size=32",
    "policy.vision_channels=[8,16]",
    "policy.chunk_size=4",
    "policy.prefix_layers=1",
    "policy.expert_layers=1",
]


def _run(command: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", **{scenes.CACHE_ENV: str(cache)})
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, env=env, timeout=600)


def test_collect_sft_eval_and_train_on_libero_spatial(libero_exported, tmp_path, monkeypatch):
    cache = libero_exported[0]
    monkeypatch.setenv(scenes.CACHE_ENV, str(cache))
    # the expert's demonstration from the first training state (25; the held-out states are the sampled 50..99)
    data = tmp_path / "data"
    result = collect_suite("libero_spatial", data, episodes_per_task=1, task_ids=[0], num_envs=1, image_size=32)
    assert result.episodes == 1 and result.tasks[0]["success_rate"] == 1.0
    info = json.loads((data / "meta" / "info.json").read_text())
    assert info["embodied"]["init_ids_from"] == 25 and info["embodied"]["action_mode"] == "osc_pose"
    assert info["features"]["observation.state"]["names"] == list(sims.libero.STATE_NAMES)
    demos = load_demonstrations(data, chunk_size=4, image_size=32, cameras=["agentview", "wrist"])
    assert demos.state.shape[1] == 8 and demos.actions.shape[-1] == 7
    assert float(demos.actions[..., 6].max()) == 1.0  # the gripper closed on the bowl

    # SFT sizes the policy's state from the data (LIBERO's 8-D state); in-process, as the evaluations
    from conftest import compose

    from embodied.runners.eval import EvalConfig, EvalError, run
    from embodied.runners.sft import train

    train(compose("sft", f"data={data}", f"out={tmp_path / 'sft'}", "steps=2", "batch_size=8", *TINY))
    ckpt = tmp_path / "sft" / "ckpt"
    assert policies.load(ckpt).config.state_dim == 8

    # evaluation on held-out states, episodes cut short (a quick check, said in the report)
    out = tmp_path / "eval"
    results = run(
        EvalConfig(
            checkpoint=str(ckpt),
            suite="libero_spatial",
            tasks=[0],
            episodes=2,
            num_envs=2,
            max_steps=6,
            image_size=32,
            videos="none",
            out=str(out),
        )
    )
    suite = results["suites"]["libero_spatial"]
    assert suite["episodes"] == 2 and results["env_steps"] == 12
    assert "cut at 6 steps" in (out / "report.md").read_text()
    # the same with the visual meshes as the reference draws them (the policy saw decimated ones)
    full = run(
        EvalConfig(
            checkpoint=str(ckpt),
            suite="libero_spatial",
            tasks=[0],
            episodes=2,
            num_envs=2,
            max_steps=6,
            image_size=32,
            videos="none",
            meshes="full",
            out=str(tmp_path / "full"),
        )
    )
    assert full["env_steps"] == 12 and full["config"]["meshes"] == "full"
    assert "meshes=full" in (tmp_path / "full" / "report.md").read_text()
    with pytest.raises(EvalError, match="meshes must be one of"):
        run(EvalConfig(checkpoint=str(ckpt), suite="libero_spatial", meshes="coarse", out=str(tmp_path / "bad")))
    with pytest.raises(EvalError, match="real LIBERO's suites only"):
        run(EvalConfig(checkpoint=str(ckpt), suite="spatial", meshes="full", out=str(tmp_path / "bad")))
    with pytest.raises(EvalError, match="within real LIBERO's 100 init states"):  # 50 official, 50 sampled
        run(
            EvalConfig(
                checkpoint=str(ckpt), suite="libero_spatial", first_state=90, episodes=11, out=str(tmp_path / "bad")
            )
        )

    # Flow-SDE PPO on the same scenes, starting from the training states
    rl = tmp_path / "rl"
    proc = _run(
        "embodied-train",
        f"init={ckpt}",
        "algo=flow_sde",
        f"out={rl}",
        "suite=libero_spatial",
        "tasks=[0]",
        "num_envs=2",
        "image_size=32",
        "iterations=1",
        "chunks_per_iter=2",
        "max_episode_steps=8",
        "algo.minibatch_size=4",
        cache=cache,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(rl / "metrics.csv")))
    assert len(rows) == 1 and int(rows[0]["env_steps"]) == 2 * 2 * 4
    assert policies.load(rl / "checkpoint" / "policy").config.state_dim == 8


def test_the_libero_expert_follows_each_env_through_regrouping(libero_exported, monkeypatch):
    """The suite expert of a LIBERO env acts per env and keeps each env's phase across a partial reset."""
    monkeypatch.setenv(scenes.CACHE_ENV, str(libero_exported[0]))
    with sims.make("mujoco", suite="libero_spatial", num_envs=2, cameras=(), tasks=[0]) as env:
        expert = sims.suites.expert("libero_spatial", num_envs=2, env=env)
        env.reset(init_ids=[25, 26])
        expert.reset()
        for _ in range(5):
            env.step(expert.act())
        phases = expert._expert(0).count.copy()
        assert (phases > 0).all()
        import numpy as np

        expert.reset(np.array([True, False]))
        assert expert._expert(0).count.tolist() == [0, phases[1]]
        assert expert(None).shape == (2, 1, 7)
    with sims.make("mujoco", suite="libero_10", num_envs=1, cameras=()) as env:
        expert = sims.suites.expert("libero_10", env=env)
        # two-predicate goals: none; one object into a region: the pick-and-place expert
        with pytest.raises(ValueError, match=r"no scripted expert for libero_10 task\(s\) \[0, 9\]"):
            expert.check_tasks([0, 5, 9])


def test_the_main_job_takes_a_libero_suite():
    """The pipeline's configuration accepts real LIBERO's suites (their task list needs no export)."""
    from conftest import compose

    from embodied.runners.pipeline import PipelineError, check_config

    cfg = compose("pipeline", "out=x", "sim.suite=libero_spatial", "tasks=[0,1]")
    check_config(cfg)
    # RL's training episodes keep the suite's own step limit there (60, the main job's, on our suites)
    assert cfg.rl.max_episode_steps is None
    assert compose("pipeline", "out=x").rl.max_episode_steps == 60
    assert compose("pipeline", "out=x", "sim.suite=libero_goal", "rl.max_episode_steps=200").rl.max_episode_steps == 200
    with pytest.raises(PipelineError, match="libero_spatial"):
        check_config(compose("pipeline", "out=x", "sim.suite=libero_spacial"))
    assert sims.suites.heldout_states("spatial") == sims.suites.heldout_states("libero_spatial") == (50, 50)


def test_grpo_groups_on_libero_start_from_its_training_states():
    from embodied.rllib.env_runner import group_initial_states

    _, inits = group_initial_states(0, 30, 0, 30, [0], None, suite="libero_spatial")
    assert sorted(set(inits)) == list(range(25, 50))  # the 25 training states, cycled
    _, inits = group_initial_states(0, 4, 0, 4, [0], None, protocol=True, suite="libero_spatial")
    assert inits == [0, 1, 2, 3]


def test_collect_repeats_training_states_only_with_dart_noise(libero_exported, tmp_path, monkeypatch):
    """Real LIBERO has 25 training states per task: more demonstrations than that are refused without
    noise (the expert and the physics are deterministic: repeats would be copies) and, with DART noise,
    come from the same states again, each with its own noise."""
    import numpy as np

    from embodied.data.lerobot_format import Dataset

    monkeypatch.setenv(scenes.CACHE_ENV, str(libero_exported[0]))
    with pytest.raises(ValueError, match="action_noise > 0"):
        collect_suite("libero_spatial", tmp_path / "refused", episodes_per_task=26, task_ids=[0])
    monkeypatch.setattr(sims.suites, "num_training_states", lambda suite: 1)  # one training state: 25
    data = tmp_path / "data"
    result = collect_suite(
        "libero_spatial", data, episodes_per_task=2, task_ids=[0], num_envs=2, image_size=32, action_noise=0.1
    )
    assert result.episodes == 2
    episodes = [json.loads(line) for line in (data / "meta" / "embodied" / "episodes.jsonl").read_text().splitlines()]
    assert [e["init_id"] for e in episodes] == [25, 25]
    ds = Dataset(data)
    first, second = (ds.episode(e, images=False)["observation.state"] for e in (0, 1))
    assert np.array_equal(first[0], second[0])  # the same initial state ...
    n = min(len(first), len(second))
    assert not np.allclose(first[:n], second[:n])  # ... and other trajectories
