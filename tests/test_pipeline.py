"""CLI smoke runs of the main job and of embodied-collect at tiny sizes, through the console scripts."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BIN = Path(sys.executable).parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / script), *args], capture_output=True, text=True, env=env, timeout=600)


TINY_PIPELINE = ["sim.suite=goal", "tasks=[2,8]", "episodes_per_task=1", "sim.num_envs=2", "sim.image_size=32",
                 "video_tasks=2", "policy.d_model=32", "policy.image_size=32", "policy.vision_channels=[8,16]",
                 "policy.chunk_size=3", "policy.prefix_layers=1", "policy.expert_layers=1", "sft.steps=3",
                 "sft.batch_size=4", "sft.warmup_steps=1", "rl.iterations=2", "rl.num_envs=2", "rl.chunks_per_iter=2",
                 "rl.critic_warmup=1", "rl.truncation=fail", "rl.max_episode_steps=6", "eval.episodes=2",
                 "eval.num_envs=4", "eval.video_max=1", "eval.attempts=2"]


def test_pipeline_end_to_end_at_tiny_size(tmp_path, capsys):
    """collect -> SFT -> eval -> Flow-SDE PPO on RLlib -> eval -> report, then a rerun skips every stage."""
    out = tmp_path / "run"
    proc = _run("embodied-pipeline", f"out={out}", *TINY_PIPELINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["stages_done"] == ["collect", "sft", "eval_sft", "rl", "eval_rl"]
    collect = results["collect"]
    assert collect["episodes"] == 2 and [t["task"] for t in collect["tasks"]] == [2, 8]
    assert collect["expert_success_rate"] >= 0.9 and collect["video_frames"] > 20
    assert results["sft"]["steps"] == 3 and (out / "sft" / "ckpt" / "model.safetensors").is_file()
    assert results["rl"]["iterations"] == 2 and results["rl"]["env_steps"] > 0
    assert (out / "rl" / "checkpoint" / "policy" / "model.safetensors").is_file()
    rl_rows = list(csv.DictReader(open(out / "rl" / "metrics.csv")))
    assert [r["actor_updated"] for r in rl_rows] == ["0", "1"]  # rl.critic_warmup=1 reached embodied-train
    for key in ("eval_sft", "eval_rl"):
        assert results[key]["episodes"] == 4 and 0.0 <= results[key]["success_rate"] <= 1.0
        assert results[key]["videos"] and all((out / v).is_file() for v in results[key]["videos"])
    cmp = results["eval_rl"]["comparison"]  # compared with the SFT evaluation, per task and paired over states
    assert cmp["tasks"] and cmp["paired"]["states"] == 4 and all(t["paired"]["states"] == 2 for t in cmp["tasks"])
    for key in ("eval_sft", "eval_rl"):  # eval.attempts=2: pass@1 <= pass@2, pass@1 the rate over both attempts
        p1, p2 = results[key]["pass_at_k"]
        assert 0.0 <= p1 <= p2 <= 1.0 and p1 == pytest.approx(cmp["paired"]["before" if key == "eval_sft" else "now"])
    report = (out / "report.md").read_text()
    assert "| 2 put_the_cube_on_the_plate |" in report and "RL - SFT:" in report and "Paired over the 4 initial states (2 episodes" in report
    assert "pass@1..K" in report
    assert (out / "plots" / "pipeline.png").stat().st_size > 1000
    assert (out / ".hydra" / "config.yaml").is_file() and (out / "data" / "meta" / "info.json").is_file()
    # in-process from here (the same config the command builds, without another start-up)
    from conftest import compose
    from embodied.runners.pipeline import PipelineError, run

    rerun = run(compose("pipeline", f"out={out}", *TINY_PIPELINE))
    assert "done in a previous run" in capsys.readouterr().out
    assert rerun["stages_done"] == results["stages_done"] and rerun["eval_rl"] == results["eval_rl"]
    # another configuration into the same folder refuses instead of mixing runs
    with pytest.raises(PipelineError, match="another configuration"):
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "episodes_per_task=2"))
    # a folder from before a config field existed resumes while the field keeps its default
    stored = json.loads((out / "results.json").read_text())
    del stored["config"]["action_noise"]
    (out / "results.json").write_text(json.dumps(stored))
    assert run(compose("pipeline", f"out={out}", *TINY_PIPELINE))["stages_done"] == results["stages_done"]
    with pytest.raises(PipelineError, match="another configuration"):
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "action_noise=0.1"))
    with pytest.raises(PipelineError, match="use policy=flow"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "policy=autoregressive"))
    with pytest.raises(PipelineError, match="rl.critic_warmup=2 must lie in 0..rl.iterations-1"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.iterations=2", "rl.critic_warmup=2"))
    with pytest.raises(PipelineError, match="rl.truncation='never'"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.truncation=never"))
    with pytest.raises(PipelineError, match="rl.critic='oracle': choose one of policy, privileged"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.critic=oracle"))
    with pytest.raises(PipelineError, match="action_noise=-0.1"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "action_noise=-0.1"))


def test_collect_writes_a_dataset_readable_without_our_code(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "ds"
    proc = _run("embodied-collect", "suite=dynamic", "episodes_per_task=2", f"out={out}", "tasks=[0,3]",
                "image_size=32", "num_envs=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [t["task"] for t in summary["tasks"]] == [0, 3]
    assert all(set(t) >= {"suite", "task", "name", "episodes", "success_rate"} for t in summary["tasks"])
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 4
    data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert data.num_rows == info["total_frames"]
    assert {"observation.state", "action", "next.reward", "next.done", "next.success", "episode_index",
            "task_index", "timestamp"} <= set(data.column_names)
    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [e["length"] for e in episodes] == np.bincount(data.column("episode_index").to_numpy()).tolist()
    assert all(e["success"] for e in episodes)
    # every episode ends with done=True at its last step, and only there
    done = data.column("next.done").to_numpy()
    assert done.sum() == 4 and all(done[e["dataset_to_index"] - 1] for e in episodes)
    for cam in ("agentview", "wrist"):
        assert (out / "videos" / f"observation.images.{cam}" / "chunk-000" / "file-000.mp4").stat().st_size > 0


def test_dataset_reader_round_trip(tmp_path):
    import sims
    from embodied.data.collect import collect_suite
    from embodied.data.lerobot_format import Dataset

    result = collect_suite("goal", tmp_path / "ds", episodes_per_task=1, task_ids=[2, 8], num_envs=2, image_size=32)
    ds = Dataset(result.root)
    assert ds.num_episodes == 2 and ds.cameras == ["agentview", "wrist"]
    ep = ds.episode(1)
    t = ep["meta"]["length"]
    assert ep["observation.state"].shape == (t, 15) and ep["action"].shape == (t, 7)
    assert ep["rgb"].shape == (t, 2, 32, 32, 3)
    assert ep["instruction"] in {s.instruction for s in sims.suites.tasks("goal")}
    # the decoded frames are the rendered ones up to video compression
    with sims.make("mujoco", suite="goal", num_envs=1, image_size=32) as env:
        obs = env.reset(task_ids=[ep["meta"]["suite_task_index"]], init_ids=[ep["meta"]["init_id"]])
        np.testing.assert_allclose(obs["state"][0].numpy(), ep["observation.state"][0], atol=1e-6)
        err = np.abs(obs["rgb"][0].numpy().astype(float) - ep["rgb"][0].astype(float)).mean()
        assert err < 12.0
    assert ds.stats["action"]["count"] == [len(ds)]


def _replay_states(ep: dict) -> np.ndarray:
    """The states ``[T, 15]`` that replaying the episode's recorded actions open loop visits."""
    import sims
    import torch

    with sims.make("mujoco", suite="goal", num_envs=1, cameras=()) as env:
        obs = env.reset(task_ids=[ep["meta"]["suite_task_index"]], init_ids=[ep["meta"]["init_id"]])
        states = []
        for action in ep["action"]:
            states.append(obs["state"][0].numpy())
            obs, *_ = env.step(torch.as_tensor(action)[None])
    return np.stack(states)


def test_collect_with_action_noise_records_the_experts_clean_actions(tmp_path):
    """DART: the executed actions carry noise, the dataset holds the expert's action at each visited state."""
    from embodied.data.collect import collect_suite
    from embodied.data.lerobot_format import Dataset

    eps = {}
    for noise in (0.0, 0.1):
        result = collect_suite("goal", tmp_path / f"ds{noise}", episodes_per_task=1, task_ids=[2], num_envs=1,
                             cameras=(), action_noise=noise)
        ds = Dataset(result.root)
        assert ds.info["embodied"]["action_noise"] == noise and ds.episodes[0]["success"]
        eps[noise] = ds.episode(0, images=False)
    clean, noisy = eps[0.0], eps[0.1]
    # without noise the recorded actions are the executed ones: replaying them retraces the episode
    np.testing.assert_allclose(_replay_states(clean), clean["observation.state"], atol=1e-5)
    # with noise the states drift from where the clean actions alone lead, yet the expert still succeeds
    drift = np.abs(_replay_states(noisy)[:, :3] - noisy["observation.state"][:, :3]).max()
    assert drift > 5e-3
    assert not np.allclose(noisy["observation.state"][: len(clean["action"])][:, :3],
                           clean["observation.state"][: len(noisy["action"])][:, :3], atol=1e-3)
    with pytest.raises(ValueError, match="action_noise"):
        collect_suite("goal", tmp_path / "bad", episodes_per_task=1, task_ids=[2], num_envs=1, cameras=(),
                      action_noise=-0.1)
