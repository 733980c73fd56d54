"""embodied-train (runtime=local) through the console script at tiny sizes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import policies

BIN = Path(sys.executable).parent
TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)
RUN = ["suite=goal", "tasks=[2,3]", "num_envs=2", "image_size=32", "chunks_per_iter=3", "minibatch_size=4"]


def _train(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "embodied-train"), *args], capture_output=True, text=True, env=env, timeout=600)


def test_flow_sde_ppo_runs_checkpoints_and_resumes(tmp_path):
    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    proc = _train(f"init={init}", "algo=flow_sde", f"out={out}", "iterations=2", "save_every=1", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["iteration"]) for r in rows] == [1, 2] and int(rows[-1]["env_steps"]) == 2 * 2 * 3 * 3
    for key in ("entropy", "clip_fraction", "approx_kl", "value_loss", "explained_variance", "env_steps_per_s"):
        assert rows[-1][key] != ""
    bundle = policies.load(out / "ckpt")
    assert bundle.config.sampler == "sde"
    before = policies.load(init)
    assert any(not (a == b).all() for a, b in zip(before.parameters(), bundle.parameters()))  # RL changed it
    proc = _train(f"init={init}", "algo=flow_sde", f"out={out}", "iterations=3", "resume=true", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3] and int(rows[-1]["env_steps"]) == 3 * 2 * 3 * 3
    assert json.loads((out / "train_state" / "state.json").read_text())["step"] == 3


def test_token_ppo_and_configuration_errors(tmp_path):
    ar = policies.save(policies.make("autoregressive", decoder_layers=1, **TINY), tmp_path / "ar")
    proc = _train(f"init={ar}", "algo=ppo", f"out={tmp_path / 'ppo'}", "iterations=1", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = [
        ((f"init={ar}", "algo=flow_sde"), "trains a flow policy, but the policy is autoregressive"),
        ((f"init={ar}", "algo=ppo", "runtime=cluster"), "only runtime=local"),
        ((f"init={ar}", "algo=grpo", "group_size=3"), "multiple of group_size"),
        ((f"init={ar}", "algo=sac"), "unknown algo"),
        ((f"init={tmp_path / 'nothing'}",), "no checkpoint bundle"),
    ]
    for i, (args, message) in enumerate(cases):
        proc = _train(*args, f"out={tmp_path / str(i)}", *RUN)
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        assert proc.returncode != 0 and message in last, (args, last)


def test_token_grpo_runs_on_groups(tmp_path):
    ar = policies.save(policies.make("autoregressive", decoder_layers=1, **TINY), tmp_path / "ar")
    out = tmp_path / "grpo"
    proc = _train(f"init={ar}", "algo=grpo", f"out={out}", "iterations=1", "suite=goal", "tasks=[1]", "num_envs=4",
                  "group_size=2", "image_size=32", "chunks_per_iter=2", "minibatch_size=4")
    assert proc.returncode != 0 and "must cover the step limit" in proc.stderr
    # close_the_drawer has a 220-step limit: 74 chunks of 3 cover it
    proc = _train(f"init={ar}", "algo=grpo", f"out={out}", "iterations=1", "suite=goal", "tasks=[1]", "num_envs=4",
                  "group_size=2", "image_size=32", "chunks_per_iter=74", "minibatch_size=16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 1 and int(rows[0]["episodes"]) >= 4
