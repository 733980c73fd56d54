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
import torch

BIN = Path(sys.executable).parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / script), *args], capture_output=True, text=True, env=env, timeout=600)


TINY_PIPELINE = [
    "sim.suite=goal",
    "tasks=[2,8]",
    "episodes_per_task=1",
    "sim.num_envs=2",
    "sim.image_size=32",
    "video_tasks=2",
    "policy.d_model=32",
    "policy.image_size=32",
    "policy.vision_channels=[8,16]",
    "policy.chunk_size=3",
    "policy.prefix_layers=1",
    "policy.expert_layers=1",
    "sft.steps=3",
    "sft.batch_size=4",
    "sft.warmup_steps=1",
    "rl.iterations=2",
    "rl.num_envs=2",
    "rl.chunks_per_iter=2",
    "rl.algo.critic_warmup=1",
    "rl.truncation=fail",
    "rl.max_episode_steps=6",
    "eval.episodes=2",
    "eval.num_envs=4",
    "eval.video_max=1",
    "eval.attempts=2",
    "eval.workers=1",
    "rl.runtime.num_env_runners=1",
    "eval.max_steps=30",
]
# Process start-ups were most of these runs' time: eval.workers=1 runs each evaluation in the pipeline's
# process (workers=K, the same episodes from K worker processes, is embodied-eval's: test_eval_harness.py),
# and the RL stage's Ray cluster runtime has one remote env runner holding both envs (several runners:
# test_train.py's cluster test); evaluation episodes stop at 30 steps (an untrained policy plays to the limit)


def test_pipeline_end_to_end_at_tiny_size(tmp_path, capsys):
    """collect -> SFT -> eval -> Flow-SDE PPO on RLlib -> eval -> report, then a rerun skips every stage."""
    out = tmp_path / "run"
    # the key of the old rl layout still works, with a deprecation message naming the new one
    old_keys = ["rl.critic_warmup=1" if a == "rl.algo.critic_warmup=1" else a for a in TINY_PIPELINE]
    proc = _run("embodied-pipeline", f"out={out}", *old_keys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rl.critic_warmup= is deprecated" in proc.stderr and "use rl.algo.critic_warmup=1" in proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["rl"]["algo"]["critic_warmup"] == 1
    assert results["stages_done"] == ["collect", "sft", "eval_sft", "rl", "eval_rl"]
    collect = results["collect"]
    assert collect["episodes"] == 2 and [t["task"] for t in collect["tasks"]] == [2, 8]
    assert collect["expert_success_rate"] >= 0.9 and collect["video_frames"] > 20
    assert results["sft"]["steps"] == 3 and (out / "sft" / "ckpt" / "model.safetensors").is_file()
    assert results["rl"]["iterations"] == 2 and results["rl"]["env_steps"] > 0
    assert (out / "rl" / "checkpoint" / "policy" / "model.safetensors").is_file()
    rl_rows = list(csv.DictReader(open(out / "rl" / "metrics.csv")))
    assert [r["actor_updated"] for r in rl_rows] == ["0", "1"]  # rl.critic_warmup=1 reached embodied-train
    assert [r["policy_lag"] for r in rl_rows] == ["0", "0"]  # on-policy: every batch trained by its sampler
    assert all(r["approx_kl_first"] != "" and r["epochs_run"] != "" for r in rl_rows)
    for key in ("eval_sft", "eval_rl"):
        assert results[key]["episodes"] == 4 and 0.0 <= results[key]["success_rate"] <= 1.0
        assert results[key]["videos"] and all((out / v).is_file() for v in results[key]["videos"])
    cmp = results["eval_rl"]["comparison"]  # compared with the SFT evaluation, per task and paired over states
    assert cmp["tasks"] and cmp["paired"]["states"] == 4 and all(t["paired"]["states"] == 2 for t in cmp["tasks"])
    for key in ("eval_sft", "eval_rl"):  # eval.attempts=2: pass@1 <= pass@2, pass@1 the rate over both attempts
        p1, p2 = results[key]["pass_at_k"]
        assert 0.0 <= p1 <= p2 <= 1.0 and p1 == pytest.approx(cmp["paired"]["before" if key == "eval_sft" else "now"])
    report = (out / "report.md").read_text()
    assert (
        "| 2 put_the_cube_on_the_plate |" in report
        and "RL - SFT:" in report
        and "Paired over the 4 initial states (2 episodes" in report
    )
    assert "pass@1..K" in report
    assert (out / "plots" / "pipeline.png").stat().st_size > 1000
    assert (out / ".hydra" / "config.yaml").is_file() and (out / "data" / "meta" / "info.json").is_file()
    # in-process from here (the same config the command builds, without another start-up)
    from conftest import compose

    from embodied.runners.pipeline import PipelineError, run

    rerun = run(compose("pipeline", f"out={out}", *TINY_PIPELINE))
    assert "done in a previous run" in capsys.readouterr().out
    assert rerun["stages_done"] == results["stages_done"] and rerun["eval_rl"] == results["eval_rl"]
    # stages= only chooses what runs: fewer (or, later, more) stages go on in the same folder
    assert (
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "stages=[collect,sft,eval_sft]"))["stages_done"]
        == results["stages_done"]
    )
    # rl.control=true adds the frozen-actor control to the finished run: the same RL stage with algo.lr=0
    control = run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "rl.control=true"))
    assert control["stages_done"] == results["stages_done"] + ["rl_control", "eval_control"]
    assert control["eval_rl"] == results["eval_rl"] and control["eval_control"]["episodes"] == 4
    from safetensors.torch import load_file

    sft_w = load_file(str(out / "sft" / "ckpt" / "model.safetensors"))
    ctl_w = load_file(str(out / "rl_control" / "checkpoint" / "policy" / "model.safetensors"))
    rl_w = load_file(str(out / "rl" / "checkpoint" / "policy" / "model.safetensors"))
    actor = [k for k in sft_w if k.startswith(("expert.", "velocity."))]
    assert actor and all(torch.equal(sft_w[k], ctl_w[k]) for k in actor)  # lr=0: the actor never moved
    assert any(not torch.equal(sft_w[k], rl_w[k]) for k in actor)  # the RL run's did
    assert all(torch.equal(sft_w[k], rl_w[k]) for k in sft_w if k.startswith("prefix."))  # the encoder is frozen
    assert control["rl_vs_control"]["paired"]["states"] == 4
    assert "Frozen-actor control" in (out / "report.md").read_text()
    assert "RL - control" in (out / "report.md").read_text()
    # init_from=: another RL of the same SFT start, the stages before RL copied instead of run again
    fork = tmp_path / "fork"
    local = [a for a in TINY_PIPELINE if not a.startswith("rl.runtime.")] + ["runtime@rl.runtime=local"]
    forked = run(compose("pipeline", f"out={fork}", *local, f"init_from={out}", "rl.algo.lr=3e-5"))
    assert "collect, sft, eval_sft: copied from" in capsys.readouterr().out
    assert forked["init_from"] == {"run": str(out), "stages": ["collect", "sft", "eval_sft"]}
    assert forked["stages_done"] == ["collect", "sft", "eval_sft", "rl", "eval_rl"]
    assert forked["sft"] == results["sft"] and forked["eval_sft"] == results["eval_sft"]
    assert (fork / "sft" / "ckpt" / "model.safetensors").read_bytes() == (
        out / "sft" / "ckpt" / "model.safetensors"
    ).read_bytes()
    assert (fork / "videos" / "collect.mp4").is_file() and (fork / "data" / "meta" / "info.json").is_file()
    assert forked["config"]["rl"]["algo"]["lr"] == 3e-5 and forked["eval_rl"]["comparison"]["paired"]["states"] == 4
    assert f"Stages collect, sft, eval_sft were copied from the run `{out}`" in (fork / "report.md").read_text()
    assert run(compose("pipeline", f"out={fork}", *local, "rl.algo.lr=3e-5"))["stages_done"] == forked["stages_done"]
    # continue_rl=true: the first run's RL carried on from its checkpoint at other rl.* settings, its frozen
    # control copied along; a run that dies after the copy resumes from its own folder (the copied
    # checkpoint kept, nothing copied again)
    import embodied.runners.pipeline_stages as pipeline_module

    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    cont = tmp_path / "cont"
    carry = compose(
        "pipeline", f"out={cont}", *local, f"init_from={out}", "continue_rl=true", "rl.iterations=3", "rl.algo.lr=1e-5"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline_module, "stage_rl", crash)
        with pytest.raises(RuntimeError, match="killed"):
            run(carry)
    assert json.loads((cont / "results.json").read_text())["init_from"]["rl_from_iteration"] == 2
    carried = run(carry)
    assert "RL carried on from its iteration 2" in capsys.readouterr().out
    assert carried["init_from"] == {
        "run": str(out),
        "stages": ["collect", "sft", "eval_sft", "rl_control", "eval_control"],
        "rl_from_iteration": 2,
    }
    assert set(carried["stages_done"]) == set(control["stages_done"]) and carried["config"]["rl"]["algo"]["lr"] == 1e-5
    assert carried["eval_control"] == control["eval_control"] and carried["rl_control"]["iterations"] == 2
    assert carried["rl"]["iterations"] == 3 and carried["rl_vs_control"]["paired"]["states"] == 4
    first_rows = list(csv.DictReader(open(out / "rl" / "metrics.csv")))
    rows = list(csv.DictReader(open(cont / "rl" / "metrics.csv")))
    assert [r["iteration"] for r in rows] == ["1", "2", "3"] and rows[:2] == first_rows
    report = (cont / "report.md").read_text()
    assert "RL carried that run's RL on from its iteration 2" in report and "The control ran 2 iterations" in report
    with pytest.raises(PipelineError, match="its RL is at iteration 2 already; set rl.iterations above 2"):
        run(compose("pipeline", f"out={tmp_path / 'other'}", *local, f"init_from={fork}", "continue_rl=true"))
    with pytest.raises(PipelineError, match="continue_rl=true carries another run's RL on: name that run"):
        run(compose("pipeline", f"out={tmp_path / 'other'}", *local, "continue_rl=true"))
    with pytest.raises(PipelineError, match="differs from this one in episodes_per_task, seed; only rl"):
        run(
            compose(
                "pipeline",
                f"out={tmp_path / 'other'}",
                *TINY_PIPELINE,
                f"init_from={out}",
                "seed=1",
                "episodes_per_task=2",
            )
        )
    with pytest.raises(PipelineError, match="no pipeline run there"):
        run(compose("pipeline", f"out={tmp_path / 'other'}", *TINY_PIPELINE, f"init_from={tmp_path / 'none'}"))
    # another configuration into the same folder refuses instead of mixing runs
    with pytest.raises(PipelineError, match="another configuration"):
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "episodes_per_task=2"))
    # a folder from before a config field existed, at the top or nested (the policy group's, rl.algo's),
    # resumes, and starts another run, while the field keeps its default; at another value it differs
    stored = json.loads((out / "results.json").read_text())
    del (
        stored["config"]["action_noise"],
        stored["config"]["policy"]["sde_steps"],
        stored["config"]["rl"]["algo"]["sde_steps"],
    )
    (out / "results.json").write_text(json.dumps(stored))
    assert run(compose("pipeline", f"out={out}", *TINY_PIPELINE))["stages_done"] == control["stages_done"]
    with pytest.raises(PipelineError, match="another configuration"):
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "rl.algo.sde_steps=2"))
    with pytest.raises(PipelineError, match="differs from this one in policy.sde_steps"):
        run(compose("pipeline", f"out={tmp_path / 'other'}", *TINY_PIPELINE, f"init_from={out}", "policy.sde_steps=2"))
    with pytest.raises(PipelineError, match="another configuration"):
        run(compose("pipeline", f"out={out}", *TINY_PIPELINE, "action_noise=0.1"))
    with pytest.raises(PipelineError, match="use policy=flow"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "policy=autoregressive"))
    with pytest.raises(PipelineError, match="rl.algo.critic_warmup=2 must lie in 0..rl.iterations-1"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.iterations=2", "rl.algo.critic_warmup=2"))
    with pytest.raises(PipelineError, match="rl.truncation='never'"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.truncation=never"))
    with pytest.raises(PipelineError, match="rl.init_states='held': choose random or protocol"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.init_states=held"))
    with pytest.raises(PipelineError, match="rl.algo.critic='oracle': choose one of policy, privileged"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.algo.critic=oracle"))
    with pytest.raises(PipelineError, match="rl.algo.name='ppo': the pipeline's flow VLA trains with"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "algo@rl.algo=ppo"))
    with pytest.raises(PipelineError, match="runtime=local"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "runtime@rl.runtime=local", "rl.runtime.num_env_runners=2"))
    with pytest.raises(PipelineError, match="action_noise=-0.1"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "action_noise=-0.1"))
    with pytest.raises(PipelineError, match="split evenly between rl.runtime.num_env_runners=3"):
        run(compose("pipeline", f"out={tmp_path / 'bad'}", "rl.num_envs=4", "rl.runtime.num_env_runners=3"))


def test_rl_seed_is_the_rl_stages_own(tmp_path, monkeypatch):
    """rl.seed seeds the RL stages (RL and its control) alone; unset, they take the run's seed."""
    from conftest import compose

    import embodied.runners.train as train_module
    from embodied.runners.pipeline import stage_rl

    seeds = []
    summary = dict.fromkeys(("algo", "iterations", "env_steps", "wall_s", "env_steps_per_s", "time_split_s"), 0)
    monkeypatch.setattr(train_module, "train", lambda cfg: seeds.append(cfg.seed) or summary)
    stage_rl(compose("pipeline", f"out={tmp_path}", "seed=3", "rl.seed=7"), tmp_path)
    stage_rl(compose("pipeline", f"out={tmp_path}", "seed=3", "rl.seed=7"), tmp_path, "rl_control", control=True)
    stage_rl(compose("pipeline", f"out={tmp_path}", "seed=3"), tmp_path)
    assert seeds == [7, 7, 3]


def test_rl_stage_composes_embodied_train_groups_and_old_keys_still_work(capsys):
    """rl.algo / rl.runtime are embodied-train's config groups (an algo's YAML values arrive); the old
    layout's keys are rewritten with a deprecation message, and a results.json config of the old layout
    reads as the same run as today's default."""
    from dataclasses import asdict

    from conftest import compose

    from embodied.config import rewrite_moved_keys
    from embodied.runners.pipeline import MOVED_RL_KEYS, PipelineConfig, moved_rl_override, run_identity, upgrade_config
    from embodied.runs import same_config

    cfg = compose("pipeline")
    assert cfg.rl.algo.name == "flow_sde" and cfg.rl.algo.lr == 1e-5 and cfg.rl.algo.epochs == 2
    assert cfg.rl.runtime.name == "cluster" and cfg.rl.runtime.num_env_runners == 2
    local = compose("pipeline", "algo@rl.algo=flow_noise", "runtime@rl.runtime=local")
    assert local.rl.algo.name == "flow_noise" and local.rl.algo.lr == 1e-5  # the pipeline's lr for every algo
    assert local.rl.runtime.name == "local" and local.rl.runtime.num_env_runners == 0
    argv = ["out=o", "rl.algo=flow_noise", "rl.lr=3e-6", "rl.env_runners=0", "++rl.overlap=true", "rl.iterations=5"]
    new = rewrite_moved_keys("embodied-pipeline", argv, MOVED_RL_KEYS, moved_rl_override)
    assert new == [
        "out=o",
        "algo@rl.algo=flow_noise",
        "rl.algo.lr=3e-6",
        "runtime@rl.runtime=local",
        "rl.runtime.num_env_runners=0",
        "rl.runtime.overlap=true",
        "rl.iterations=5",
    ]
    err = capsys.readouterr().err
    assert err.count("is deprecated") == 4 and "rl.lr= is deprecated" in err and "use rl.algo.lr=3e-6" in err
    moved = compose("pipeline", *new[1:])
    assert (moved.rl.algo.name, moved.rl.algo.lr, moved.rl.runtime.name, moved.rl.runtime.overlap) == (
        "flow_noise",
        3e-6,
        "local",
        True,
    )
    old = {k: v for k, v in asdict(cfg).items() if k != "rl"} | {
        "rl": {
            "algo": "flow_sde",
            "iterations": cfg.rl.iterations,
            "num_envs": cfg.rl.num_envs,
            "chunks_per_iter": 16,
            "max_episode_steps": 60,
            "truncation": "fail",
            "lr": 1e-05,
            "critic_warmup": 4,
            "critic": "policy",
            "reward_type": "sparse",
            "overlap": False,
            "env_runners": 2,
            "save_every": 10,
            "init_states": "random",
            "control": False,
        }
    }
    # as a resume compares them (the runtime's learner threads, 1 then, change the wall time, not the run)
    assert same_config(run_identity(upgrade_config(old)), run_identity(asdict(cfg)), PipelineConfig)
    assert not same_config(
        run_identity(upgrade_config(old | {"rl": old["rl"] | {"lr": 3e-6}})), run_identity(asdict(cfg)), PipelineConfig
    )
    assert upgrade_config(asdict(cfg)) == asdict(cfg)


def test_protocol_training_is_also_scored_on_held_out_states(tmp_path):
    """rl.init_states=protocol: each policy is evaluated on the protocol's states and on states 50.., the
    RL one compared with the SFT one on both."""
    from conftest import compose

    from embodied.runners.pipeline import run

    out = tmp_path / "proto"
    # one attempt per state (pass@k is the end-to-end test's): one wave per evaluation instead of two
    tiny = [a for a in TINY_PIPELINE if not a.startswith("rl.runtime.")]  # runtime=local: no env runners
    res = run(
        compose(
            "pipeline",
            f"out={out}",
            *tiny,
            "tasks=[8]",
            "rl.init_states=protocol",
            "eval.heldout_episodes=3",
            "runtime@rl.runtime=local",
            "video_tasks=0",
            "eval.videos=none",
            "eval.attempts=1",
        )
    )
    assert res["stages_done"] == ["collect", "sft", "eval_sft", "eval_sft_heldout", "rl", "eval_rl", "eval_rl_heldout"]

    def states(stage: str) -> set[int]:
        lines = (out / stage / "episodes.jsonl").read_text().splitlines()
        return {json.loads(line)["init_id"] for line in lines}

    assert states("eval_sft") == states("eval_rl") == {0, 1}
    assert states("eval_sft_heldout") == states("eval_rl_heldout") == {50, 51, 52}
    assert res["eval_rl_heldout"]["comparison"]["paired"]["states"] == 3
    assert res["eval_rl"]["comparison"]["paired"]["states"] == 2
    report = (out / "report.md").read_text()
    assert "### Held-out initial states" in report and "Paired over the 3 held-out states, RL - SFT" in report


def test_collect_writes_a_dataset_readable_without_our_code(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "ds"
    proc = _run(
        "embodied-collect",
        "suite=dynamic",
        "episodes_per_task=2",
        f"out={out}",
        "tasks=[0,3]",
        "image_size=32",
        "num_envs=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [t["task"] for t in summary["tasks"]] == [0, 3]
    assert all(set(t) >= {"suite", "task", "name", "episodes", "success_rate"} for t in summary["tasks"])
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 4
    data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert data.num_rows == info["total_frames"]
    assert {
        "observation.state",
        "action",
        "next.reward",
        "next.done",
        "next.success",
        "episode_index",
        "task_index",
        "timestamp",
    } <= set(data.column_names)
    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [e["length"] for e in episodes] == np.bincount(data.column("episode_index").to_numpy()).tolist()
    # our per-episode fields sit beside LeRobot's columns (LeRobot appends rows of its columns only)
    extra = [json.loads(line) for line in (out / "meta" / "embodied" / "episodes.jsonl").read_text().splitlines()]
    assert [e["episode_index"] for e in extra] == [e["episode_index"] for e in episodes]
    assert all(e["success"] for e in extra) and {"stats/action/mean", "stats/action/q99"} <= set(episodes[0])
    # every episode ends with done=True at its last step, and only there
    done = data.column("next.done").to_numpy()
    assert done.sum() == 4 and all(done[e["dataset_to_index"] - 1] for e in episodes)
    for cam in ("agentview", "wrist"):
        assert (out / "videos" / f"observation.images.{cam}" / "chunk-000" / "file-000.mp4").stat().st_size > 0


def test_an_interrupted_evaluation_is_not_a_finished_stage(tmp_path):
    """Ctrl-C during an evaluation: the pipeline stops with exit 130, keeps the episodes played so far and
    does not count the stage as done (a resumed run finishes it rather than reporting a partial rate)."""
    import signal
    import time

    out = tmp_path / "run"
    args = [*TINY_PIPELINE, "eval.episodes=40", "eval.attempts=1", "stages=[collect,sft,eval_sft]"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [str(BIN / "embodied-pipeline"), f"out={out}", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    episodes = out / "eval_sft" / "episodes.jsonl"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and not (episodes.is_file() and episodes.stat().st_size):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-3000:]
    assert "interrupted; finished stages and episodes are kept" in err.decode()
    results = json.loads((out / "results.json").read_text())
    assert results["stages_done"] == ["collect", "sft"] and "eval_sft" not in results
    assert 0 < len(episodes.read_text().splitlines()) < 80
