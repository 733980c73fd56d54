"""embodied-sft through the console script at tiny sizes: checkpoints, metrics, resume, evaluation."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import policies

BIN = Path(sys.executable).parent
TINY = [
    "policy.d_model=32",
    "policy.image_size=32",
    "policy.vision_channels=[8,16]",
    "policy.chunk_size=3",
    "policy.prefix_layers=1",
    "batch_size=8",
    "log_every=2",
]


def _sft(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "embodied-sft"), *args], capture_output=True, text=True, env=env, timeout=600)


def test_sft_trains_checkpoints_and_resumes(demos, tmp_path):
    out = tmp_path / "run"
    proc = _sft(f"data={demos}", f"out={out}", "steps=6", "save_every=3", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_state" / "state.json").read_text())["step"] == 6
    policy = policies.load(out / "ckpt")
    assert policy.family == "flow" and policy.config.chunk_size == 3
    assert policy.processor.stats["action_std"] != [1.0] * 7  # statistics come from the dataset
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    assert any((out / "tb").iterdir())
    # as a run killed after its last save leaves them: a row past step 6, then one torn mid-write
    with open(out / "metrics.csv", "a", newline="") as fh:
        fh.write("8,0.5,1.0e-04,9.9\r\n1")
    # resume continues the step counter and the metrics from step 6
    proc = _sft(f"data={demos}", f"out={out}", "steps=10", "resume=true", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8, 10]
    assert all(v not in ("", None) for r in rows for v in r.values()) and rows[3]["loss"] != "0.5"
    assert json.loads((out / "sft.json").read_text())["steps"] == 10
    # without resume, an existing run is not overwritten
    proc = _sft(f"data={demos}", f"out={out}", "steps=10", *TINY)
    assert proc.returncode != 0 and "resume=true" in proc.stderr


def test_sft_autoregressive_with_evaluation(demos, tmp_path):
    out = tmp_path / "ar"
    proc = _sft(
        f"data={demos}",
        f"out={out}",
        "policy=autoregressive",
        "steps=2",
        "eval.suite=goal",
        "augment_shift=2",
        "policy.vision_keypoints=2",
        "eval.tasks=[1,2]",
        "eval.episodes_per_task=1",
        "eval.num_envs=2",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "eval.json").read_text())
    assert [t["task"] for t in result["tasks"]] == [1, 2] and 0.0 <= result["success_rate"] <= 1.0
    assert result["image_size"] == 32  # rendered like the dataset's frames
    loaded = policies.load(out / "ckpt")
    assert loaded.family == "autoregressive" and loaded.config.vision_keypoints == 2


def test_sft_state_only_policy_sized_from_the_data(demos, tmp_path):
    out = tmp_path / "state"
    proc = _sft(
        f"data={demos}",
        f"out={out}",
        "policy.cameras=[]",
        "policy.state_obs=privileged",
        "steps=2",
        "eval.suite=goal",
        "eval.tasks=[2]",
        "eval.episodes_per_task=1",
        "eval.num_envs=1",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    policy = policies.load(out / "ckpt")
    import sims

    with sims.make("mujoco", suite="goal", num_envs=1, cameras=(), state_obs="privileged") as env:
        assert policy.config.state_dim == env.observation_spec["state"].shape[0] > 15
        policy.check_env(env)
    assert policy.config.cameras == [] and not any(k.startswith("prefix.vision") for k in policy.state_dict())
    assert len(policy.processor.stats["state_mean"]) == policy.config.state_dim
    assert json.loads((out / "eval.json").read_text())["tasks"][0]["episodes"] == 1


def test_sft_errors_are_clear(tmp_path):
    from conftest import compose

    from embodied.runners.sft import train

    proc = _sft(f"data={tmp_path / 'missing'}", f"out={tmp_path / 'x'}", *TINY)
    assert proc.returncode != 0 and "meta/info.json is missing" in proc.stderr.strip().splitlines()[-1]
    with pytest.raises(Exception, match="bogus"):  # the same checks in-process
        compose("sft", f"data={tmp_path}", f"out={tmp_path / 'y'}", "policy.bogus=1")
    with pytest.raises(ValueError, match="augment_shift"):
        train(compose("sft", f"data={tmp_path}", f"out={tmp_path / 'z'}", "augment_shift=-1", *TINY))


def test_sft_continues_a_policy_on_more_data_keeping_its_statistics(demos, tmp_path):
    """init + extra_data + stats_from=init: every dataset's steps are trained on, and the normalisation is the
    bundle's (a continued policy's network sees what it saw), not the data's."""
    from conftest import compose

    from embodied.runners.sft import train

    first = tmp_path / "first"
    assert _sft(f"data={demos}", f"out={first}", "steps=2", *TINY).returncode == 0
    bundle = policies.load(first / "ckpt")
    bundle.processor.stats["action_mean"] = [0.25] * len(bundle.processor.stats["action_mean"])
    policies.save(bundle, tmp_path / "init")
    out = tmp_path / "more"
    proc = _sft(
        f"data={demos}",
        f"extra_data=[{demos}]",
        f"init={tmp_path / 'init'}",
        "stats_from=init",
        f"out={out}",
        "steps=2",
        "batch_size=8",
        "log_every=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    once, twice = (json.loads((d / "sft.json").read_text()) for d in (first, out))
    assert twice["samples"] == 2 * once["samples"] and twice["episodes"] == 2 * once["episodes"]
    assert policies.load(out / "ckpt").processor.stats["action_mean"] == [0.25] * 7
    with pytest.raises(ValueError, match="init=... too"):
        train(compose("sft", f"data={demos}", f"out={tmp_path / 'z'}", "stats_from=init", *TINY))
