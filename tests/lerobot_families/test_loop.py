"""Tiny LeRobot pi0, pi0.5 and SmolVLA through the whole platform on a suite: SFT on collected
demonstrations (and again from a LeRobot checkpoint folder), Flow-SDE PPO iterations on Ray RLlib, the
result loading back in LeRobot, evaluation, and serving over the websocket wire format."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "lerobot",
    reason="LeRobot is not installed here: these tests run in .venv-lerobot "
    "(bash scripts/setup.sh makes it; bash scripts/test.sh runs them there)",
)

import policies  # noqa: E402

BIN = Path(sys.executable).parent
VLM = {"pi0": ".paligemma.", "pi05": ".paligemma.", "smolvla": ".vlm."}
EXPERT = {"pi0": ".gemma_expert.", "pi05": ".gemma_expert.", "smolvla": ".lm_expert."}


def hydra_value(value) -> str:
    """A Python value as a Hydra command-line value (strings quoted: paths hold slashes)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return "'" + value + "'"
    return str(value)


@pytest.mark.parametrize("family", ["pi0", "pi05", "smolvla"])
def test_sft_rl_eval_and_serving(tmp_path, lerobot_tiny_dir, family):
    from conftest import compose

    from embodied.data.collect import collect_suite
    from embodied.runners.eval import EvalConfig, run
    from embodied.runners.sft import train
    from real_robot.policy_client import PolicyClient
    from real_robot.server import PolicyServer, ServerThread

    data = tmp_path / "data"
    collect_suite("goal", data, episodes_per_task=1, task_ids=[2], num_envs=1, image_size=32)
    from policies.lerobot.tiny import tiny_config

    tiny = [f"policy.{k}={hydra_value(v)}" for k, v in tiny_config(family, lerobot_tiny_dir).items()]
    summary = train(
        compose(
            "sft",
            f"data={data}",
            f"out={tmp_path / 'sft'}",
            f"policy={family}",
            *tiny,
            "steps=3",
            "batch_size=4",
            "log_every=1",
        )
    )
    ckpt = tmp_path / "sft" / "ckpt"
    sft = policies.load(ckpt)
    assert summary["family"] == family and sft.family == family
    assert sft.processor.stats["action_std"] != [1.0] * 7  # the dataset's statistics

    # fine-tuning from a LeRobot checkpoint folder (here: the SFT policy written in LeRobot's format)
    folder = policies.lerobot.export_lerobot(sft, tmp_path / "lerobot")
    again = train(
        compose("sft", f"data={data}", f"out={tmp_path / 'sft2'}", f"init={folder}", "steps=1", "batch_size=4")
    )
    assert again["family"] == family and policies.load(tmp_path / "sft2" / "ckpt").config == sft.config

    rl = tmp_path / "rl"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    # RL straight from the LeRobot checkpoint folder (a pretrained VLA as users bring it)
    proc = subprocess.run(
        [
            str(BIN / "embodied-train"),
            f"init={folder}",
            "algo=flow_sde",
            f"out={rl}",
            "suite=goal",
            "tasks=[2]",
            "num_envs=2",
            "image_size=32",
            "iterations=2",
            "chunks_per_iter=2",
            "max_episode_steps=8",
            "algo.minibatch_size=4",
            "algo.critic_warmup=0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(rl / "metrics.csv")))
    assert len(rows) == 2 and all(r["actor_updated"] == "1" and float(r["approx_kl"]) > 0 for r in rows)
    trained = policies.load(rl / "checkpoint" / "policy")
    moved = [k for k, v in trained.state_dict().items() if not np.array_equal(v.numpy(), sft.state_dict()[k].numpy())]
    assert any(EXPERT[family] in k for k in moved)
    assert not any(VLM[family] in k for k in moved)  # the VLM stays as SFT left it

    # the fine-tuned policy loads back in LeRobot itself and samples the same chunk from the same noise
    import torch

    from policies.lerobot.sizes import model_sizes

    exported = policies.lerobot.export_lerobot(trained, tmp_path / "rl_lerobot")
    with model_sizes(family, trained.config.model_sizes):
        theirs = trained.adapter.policy_class().from_pretrained(str(exported), local_files_only=True)
    o = {
        "rgb": torch.zeros(2, 2, 32, 32, 3, dtype=torch.uint8),
        "state": torch.zeros(2, 15),
        "instruction": ["put the bowl on the plate"] * 2,
    }
    noise = torch.randn(2, 4, trained.max_action_dim, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        trained.processor.unnormalize_actions(theirs.predict_action_chunk(trained.lerobot_batch(o), noise=noise)),
        trained.sample(o, mode="greedy", noise=noise).actions,
        atol=1e-5,
        rtol=0,
    )

    results = run(
        EvalConfig(
            checkpoint=str(rl / "checkpoint" / "policy"),
            suite="goal",
            tasks=[2],
            episodes=2,
            num_envs=2,
            max_steps=6,
            image_size=32,
            videos="none",
            out=str(tmp_path / "eval"),
        )
    )
    assert results["suites"]["goal"]["episodes"] == 2

    with ServerThread(PolicyServer(trained, max_message_bytes=1 << 20)) as port:
        client = PolicyClient(f"ws://127.0.0.1:{port}")
        spec = client.connect()
        assert spec.family == family
        obs = {
            "observation/state": np.zeros(15, np.float32),
            "prompt": "put the bowl on the plate",
            "observation/images/agentview": np.zeros((32, 32, 3), np.uint8),
            "observation/images/wrist": np.zeros((32, 32, 3), np.uint8),
        }
        actions, _ = client.infer(obs)
        client.close()
    assert actions.shape == (4, 7) and np.isfinite(actions).all() and np.abs(actions).max() <= 1.0
