"""embodied-train on Ray RLlib through the console script at tiny sizes (real MuJoCo, real Ray)."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose
from safetensors.torch import load_file

import policies
from embodied.runners.train import TrainError, train
from policies import CheckpointError, SpecMismatchError

BIN = Path(sys.executable).parent
TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)
RUN = ["suite=goal", "tasks=[2,3]", "num_envs=2", "image_size=32", "chunks_per_iter=3", "algo.minibatch_size=4"]


def _train(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(BIN / "embodied-train"), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(out / "metrics.csv")))


@pytest.mark.parametrize("algo,sampler", [("flow_sde", "sde"), ("flow_dsrl", "steer")])
def test_flow_sde_ppo_runs_checkpoints_and_resumes(tmp_path, algo, sampler):
    """PPO on a flow VLA (Flow-SDE; or DSRL, PPO on the steered initial noise of the fixed flow):
    metrics, checkpoint, resume."""
    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    proc = _train(f"init={init}", f"algo={algo}", f"out={out}", "iterations=2", "save_every=1", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == [1, 2] and int(rows[-1]["env_steps"]) == 2 * 2 * 3 * 3
    for key in (
        "entropy",
        "clip_fraction",
        "approx_kl",
        "value_loss",
        "explained_variance",
        "env_steps_per_s",
        "sim_s",
        "inference_s",
        "learn_s",
        "actor_updated",
        "advantage_std",
    ):
        assert rows[-1][key] != ""
    assert (out / "ray").is_dir() and not (out / ".checkpoint.tmp").exists()
    bundle = policies.load(out / "checkpoint" / "policy")
    assert bundle.config.sampler == sampler
    before, after = policies.load(init).state_dict(), bundle.state_dict()
    flow_changed = any(not (before[k] == after[k]).all() for k in before)
    assert flow_changed == (algo == "flow_sde")  # RL changed it; DSRL leaves the flow as SFT left it
    if algo == "flow_dsrl":  # the steering mean starts at exactly zero
        assert after["steer.head.weight"].abs().sum() > 0
    state = json.loads((out / "checkpoint" / "train_state" / "state.json").read_text())
    assert state["step"] == 2 and set(state["optimizers"]) == {"default_policy_actor", "default_policy_critic"}
    with open(out / "metrics.csv", "a") as fh:  # a row torn by a crash after its first digit ('3' of row 31)
        fh.write("1")
    proc = _train(f"init={init}", f"algo={algo}", f"out={out}", "iterations=3", "resume=true", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3] and int(rows[-1]["env_steps"]) == 3 * 2 * 3 * 3
    assert all(r["env_steps"] and r["success_rate"] for r in rows)
    summary = json.loads((out / "train.json").read_text())
    assert summary["env_steps"] == 54 and set(summary["time_split_s"]) == {"sim_s", "inference_s", "learn_s", "wait_s"}
    # this run's one iteration (18 env steps), not the lifetime total
    assert abs(summary["env_steps_per_s"] - float(rows[-1]["env_steps_per_s"])) < 0.5


def test_greedy_probe_scores_the_policy_as_evaluation_does_while_it_trains(tmp_path):
    """``greedy_every``: every K iterations and after the last the greedy policy plays the run's training
    states with the evaluation's harness (the protocol's states with init_pool=protocol), its success in
    metrics.csv beside the sampled one's. Under a frozen actor (lr=0) every probe plays the same episodes:
    same states, same initial noise, same weights."""
    from embodied.eval.greedy_probe import read_probes, score_greedy

    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    proc = _train(
        f"init={init}",
        f"out={out}",
        "iterations=3",
        "greedy_every=2",
        "greedy_states=2",
        "init_pool=protocol",
        "algo.lr=0",
        *RUN,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [r["greedy_episodes"] for r in rows] == ["", "4", "4"]  # iteration 2, then the last
    assert all(0.0 <= float(rows[i]["greedy_success_rate"]) <= 1.0 for i in (1, 2))
    probes = read_probes(out)
    assert sorted(probes) == [2, 3]
    for recs in probes.values():
        assert sorted((r["task"], r["init_id"]) for r in recs) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    played = [sorted((r["task"], r["init_id"], r["success"], r["length"]) for r in probes[it]) for it in (2, 3)]
    assert played[0] == played[1]
    # the probe ran in the env runners' own envs (no second copy of the scenes), and played exactly what
    # the evaluation's harness plays in envs of its own with the same weights
    assert "greedy probe at iteration 2: 4 episodes in the runners" in proc.stdout
    own = score_greedy(init, suite="goal", tasks=[2, 3], states=2, first_state=0, num_envs=2, image_size=32, seed=0)
    assert sorted((r["task"], r["init_id"], r["success"], r["length"]) for r in own) == played[0]
    proc = _train(
        f"init={init}", f"out={tmp_path / 'bad'}", "greedy_states=51", "greedy_every=1", "init_pool=protocol", *RUN
    )
    assert proc.returncode != 0 and "protocol pool has 50 states per task" in proc.stderr


def test_resume_after_sigkill(tmp_path):
    """SIGKILL mid-run: the last complete checkpoint survives and resume=true finishes the run."""
    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    args = [
        str(BIN / "embodied-train"),
        f"init={init}",
        "algo=flow_noise",
        f"out={out}",
        "iterations=400",
        "save_every=1",
        *RUN,
    ]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            state = out / "checkpoint" / "train_state" / "state.json"
            if state.is_file() and json.loads(state.read_text())["step"] >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("no checkpoint within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the run may have gone on past the step seen above before the kill landed
    killed_at = json.loads((out / "checkpoint" / "train_state" / "state.json").read_text())["step"]
    target = killed_at + 2
    proc = _train(f"init={init}", "algo=flow_noise", f"out={out}", f"iterations={target}", "resume=true", *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, target + 1))
    assert policies.load(out / "checkpoint" / "policy").config.sampler == "noise"


def test_loaded_optimizer_state_keeps_the_configured_learning_rate():
    """A run resumed or continued at another algo.lr steps at the new rate from its first update; the
    moments (Adam's step count and averages) come from the saved state."""
    from embodied.rllib.learner import load_keeping_lr

    w = torch.nn.Parameter(torch.ones(3))
    saved_opt = torch.optim.AdamW([w], lr=1e-5, weight_decay=0.0)
    w.grad = torch.ones(3)
    saved_opt.step()
    saved = saved_opt.state_dict()
    v = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([v], lr=5e-6, weight_decay=0.0)
    load_keeping_lr(opt, saved)
    assert opt.param_groups[0]["lr"] == 5e-6
    assert torch.equal(opt.state[v]["exp_avg"], saved["state"][0]["exp_avg"])
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=5e-6, weight_decay=0.0)
    plain.load_state_dict(saved)
    assert plain.param_groups[0]["lr"] == 1e-5  # what torch alone does


@pytest.fixture
def two_node_cluster(monkeypatch):
    """A Ray cluster of two nodes on this machine (a head with 1 CPU and a worker node with 2, each
    its own raylet and object store), joined by address as `ray start` nodes would be."""
    import shutil
    import tempfile

    import ray._private.utils
    from ray.cluster_utils import Cluster

    # the helper records its address in /tmp/ray for a later bare `ray.init()`; nothing here needs it
    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)

    temp = tempfile.mkdtemp(prefix="rayc")  # short: Ray's socket paths must stay under 108 bytes
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False, temp_dir=temp))
    try:
        cluster.add_node(num_cpus=2)
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_cluster_runtime_with_two_remote_env_runners_and_a_remote_learner(tmp_path, two_node_cluster):
    """On a two-node Ray cluster: the 2 env runners and the learner (1 CPU each) cannot fit one node,
    so they run on both. Also the separate critic on privileged state: its input statistics are
    kept on the remote learner, its weights reach the remote runners and come back in the checkpoint."""
    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    proc = _train(
        f"init={init}",
        f"out={out}",
        "runtime=cluster",
        f"runtime.address={two_node_cluster.address}",
        "runtime.num_env_runners=2",
        "runtime.num_learners=1",
        "iterations=2",
        "algo.critic=privileged",
        "algo.critic_hidden=[32,32]",
        *RUN,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    placement = json.loads((out / "train.json").read_text())["placement"]
    actors = placement["env_runners"] + placement["learners"]
    assert len(placement["env_runners"]) == 2 and len(placement["learners"]) == 1
    assert len({a["node_id"] for a in actors}) == 2 and len({a["pid"] for a in actors}) == 3
    assert placement["driver"]["pid"] not in {a["pid"] for a in actors}
    assert "placement on 2 Ray node(s)" in proc.stderr
    critic = load_file(str(out / "checkpoint" / "critic.safetensors"))
    assert int(critic["norm.count"]) == 2 * 2 * 2 * 3  # every chunk of both iterations (2 runners x 2 envs x 3)
    assert critic["mlp.0.weight"].shape[0] == 32 and float(critic["norm.var"][-1]) > 0  # the time input varies
    state = json.loads((out / "checkpoint" / "train_state" / "state.json").read_text())
    assert set(state["optimizers"]) == {"default_policy_actor", "default_policy_critic"}
    with pytest.raises(TrainError, match="trained with algo.critic=privileged: resume with the same"):
        train(compose("train", f"init={init}", f"out={out}", "iterations=3", "resume=true", *RUN))
    rows = _rows(out)
    # two runners x 2 envs x 3 chunks x 3 steps per iteration
    assert [int(r["env_steps"]) for r in rows] == [36, 72]
    runtime = json.loads((out / "train.json").read_text())["runtime"]
    assert runtime["num_env_runners"] == 2 and runtime["num_learners"] == 1
    before = policies.load(init)
    after = policies.load(out / "checkpoint" / "policy")  # the remote learner's weights came back
    assert any(not (a == b).all() for a, b in zip(before.parameters(), after.parameters()))


def test_configuration_errors(tmp_path):
    """Bad combinations stop at start-up with one line (token PPO itself runs in the warm-up test)."""
    ar = policies.save(policies.make("autoregressive", decoder_layers=1, **TINY), tmp_path / "ar")
    joint = policies.save(policies.make("flow", expert_layers=1, action_dim=8, **TINY), tmp_path / "joint")
    flow = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "flow")
    # the command line prints the reason as its last line
    proc = _train(f"out={tmp_path / 'cli'}", *RUN, f"init={joint}")
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert (
        proc.returncode != 0 and last.startswith("embodied-train: ") and "8-D actions but the env expects 7-D" in last
    )
    cases = [
        ((f"init={ar}", "algo=flow_sde"), "trains a flow policy, but the policy is autoregressive"),
        ((f"init={ar}", "algo=grpo", "algo.group_size=3"), "multiple of its group_size"),
        ((f"init={ar}", "algo=grpo", "algo.value_clip=0.2"), "has no critic"),
        ((f"init={ar}", "algo=grpo", "algo.critic_warmup=2"), "no critic to warm up"),
        ((f"init={ar}", "algo=grpo", "algo.critic=privileged"), "applies to PPO only"),
        ((f"init={ar}", "algo=ppo", "algo.critic=oracle"), "choose one of policy, privileged"),
        ((f"init={ar}", "algo=ppo", "algo.critic=privileged", "algo.critic_hidden=[]"), "layer widths >= 1"),
        ((f"init={ar}", "algo=ppo", "iterations=2", "algo.critic_warmup=2"), "must lie in 0..iterations-1"),
        ((f"init={ar}", "algo=ppo", "truncation=never"), "choose bootstrap or fail"),
        ((f"init={ar}", "algo=ppo", "runtime.num_env_runners=1"), "runtime=local runs in one process"),
        ((f"init={ar}", "algo=ppo", "runtime=cluster", "runtime.num_env_runners=0"), "num_env_runners >= 1"),
        ((f"init={tmp_path / 'nothing'}",), "no checkpoint bundle"),
        ((f"init={ar}", "algo=ppo", "suite=nowhere"), "unknown suite"),
        ((f"init={ar}", "algo=ppo", "device=tpu"), "choose cpu or cuda"),
        ((f"init={ar}", "algo=ppo", "runtime=cluster", "runtime.num_gpus_per_learner=1"), "set device=cuda"),
        ((f"init={ar}", "algo=ppo", "runtime.num_gpus_per_env_runner=0.5"), "applies to remote env runners"),
        ((f"init={ar}", "algo=flow_sde", "algo.temperature=0.5"), "token VLA's sampling temperature"),
        ((f"init={ar}", "algo=grpo", "algo.temperature=0"), "temperature must be > 0"),
        ((f"init={ar}", "algo=ppo", "algo.lr=-1e-5"), "must be >= 0"),
        ((f"init={ar}", "algo=ppo", "algo.minibatch_size=0"), "algo.minibatch_size=0 must be >= 1"),
        ((f"init={ar}", "algo=ppo", "init_states=5"), "continues episodes across iterations"),
        ((f"init={ar}", "algo=grpo", "algo.group_size=2", "algo.grpo_weighting=token"), "choose episode or chunk"),
        ((f"init={ar}", "algo=grpo", "algo.group_size=2", "algo.grpo_keep=all"), "choose success or return"),
        ((f"init={ar}", "algo=grpo", "algo.group_size=2", "init_states=0"), "init_states must be >= 1"),
        ((f"init={ar}", "algo=flow_grpo", "algo.group_size=2"), "trains a flow policy, but the policy is autoreg"),
        (
            (f"init={joint}", "algo=flow_grpo", "algo.group_size=2", "algo.critic_warmup=2"),
            "algo=flow_grpo has no critic to warm up",
        ),
        (
            (f"init={joint}", "algo=flow_grpo", "algo.group_size=2", "algo.temperature=0.5"),
            "token VLA's sampling temperature",
        ),
        ((f"init={joint}", "algo=flow_fpo", "algo.group_size=2", "algo.ent_coef=0.01"), "no closed-form entropy"),
        ((f"init={ar}", "algo=grpo", "algo.group_size=2", "algo.neg_adv_scale=2"), "must lie in \\[0, 1\\]"),
        ((f"init={flow}", "algo=flow_noise", "algo.sde_steps=2"), "picks Flow-SDE's stochastic step"),
        ((f"init={flow}", "algo=flow_sde", "algo.sde_steps=0"), "sde_steps must be >= 1"),
        ((f"init={flow}", "algo=flow_sde", "algo.sde_steps=99"), "sde_steps must lie in 1..num_steps"),
        ((f"init={flow}", "algo=flow_sde", "algo.sampler=sde_ful"), "not a flow sampler \\(did you mean 'sde_full'"),
        ((f"init={flow}", "algo=flow_sde", "algo.sampler=ode"), "without a log-probability to train on"),
        ((f"init={ar}", "algo=ppo", "algo.sampler=sde"), "picks a flow VLA's rollouts; algo=ppo trains"),
        ((f"init={flow}", "algo=flow_sde", "algo.sampler=noise", "algo.sde_steps=2"), "picks Flow-SDE's"),
    ]
    if not torch.cuda.is_available():
        cases += [
            ((f"init={ar}", "algo=ppo", "device=cuda"), "torch sees no CUDA device"),
            # after Ray's start: the GPUs asked for are not in the cluster (Ray would wait forever)
            (
                (
                    f"init={ar}",
                    "algo=ppo",
                    "runtime=cluster",
                    "runtime.num_env_runners=1",
                    "runtime.num_gpus_per_env_runner=1",
                ),
                "asks for 1 GPUs .* but the Ray cluster has 0",
            ),
        ]
    for i, (args, message) in enumerate(cases):  # in-process: the same checks, without a start-up each
        with pytest.raises((TrainError, CheckpointError, SpecMismatchError), match=message):
            train(compose("train", f"out={tmp_path / str(i)}", *RUN, *args))
    with pytest.raises(Exception, match="sac"):
        compose("train", f"init={ar}", "algo=sac", f"out={tmp_path / 'sac'}", *RUN)


def test_fresh_state_only_policy_is_told_to_set_policy_state_dim(tmp_path):
    """A new policy (no init=) sized with the default 15-D state on an env whose state is wider: the fix is
    policy.state_dim=<the env's width>, not another env."""
    import sims

    with sims.make("mujoco", suite="goal", num_envs=1, cameras=(), state_obs="privileged") as env:
        width = int(env.observation_spec["state"].shape[0])
    assert width != 15
    args = ("policy=flow", "policy.cameras=[]", "policy.state_obs=privileged", "policy.expert_layers=1")
    with pytest.raises(TrainError, match=f"set policy.state_dim={width}$"):
        train(compose("train", f"out={tmp_path / 'bad'}", *RUN, *args))


def test_each_runner_runs_a_contiguous_share_of_the_tasks():
    from embodied.rllib.env_runner import env_tasks

    tasks = list(range(10))
    # 40 envs over LIBERO's 10 tasks on 2 runners: 4 envs per task, tasks 0-4 on one runner and 5-9 on the other
    assert env_tasks(0, 20, 40, tasks) == [t for t in range(5) for _ in range(4)]
    assert env_tasks(20, 20, 40, tasks) == [t for t in range(5, 10) for _ in range(4)]
    assert env_tasks(0, 40, 40, tasks) == env_tasks(0, 20, 40, tasks) + env_tasks(20, 20, 40, tasks)
    assert env_tasks(0, 5, 5, [1, 8]) == [1, 1, 1, 8, 8]  # uneven: the counts differ by one at most
    assert env_tasks(0, 2, 2, [2, 3]) == [2, 3]
    with pytest.raises(ValueError, match="out of range"):
        env_tasks(20, 30, 40, tasks)


def test_only_each_envs_first_episode_since_a_reset_counts_as_fresh():
    from embodied.rllib.env_runner import fresh_episodes

    ended = np.zeros(3, np.int64)
    # env 0 succeeds fast twice, env 2 fails once (its long episode), env 1 ends nothing yet
    assert fresh_episodes(ended, [0, 2, 0], [True, False, True]) == [True, False]
    assert fresh_episodes(ended, [1, 0], [True, False]) == [True]  # env 1's first; env 0's third
    assert ended.tolist() == [3, 1, 1]


def test_group_initial_states_new_or_from_a_fixed_pool():
    from embodied.rllib.env_runner import group_initial_states
    from sims.protocol import TRAIN_INIT_OFFSET

    def draw(pool, runners=1):  # 3 iterations of 4 groups split over the runners, tasks 1 and 8
        out = []
        for it in range(3):
            for r in range(runners):
                tasks, inits = group_initial_states(it, 4, r * 4 // runners, 4 // runners, [1, 8], pool)
                out += list(zip(tasks, inits))
        return out

    fresh = draw(None)
    assert [t for t, _ in fresh] == [1, 8] * 6 and len(set(fresh)) == 12  # a new state for every group
    assert min(i for _, i in fresh) >= TRAIN_INIT_OFFSET  # never an evaluation state
    assert draw(None, runners=2) == fresh  # the same groups however the envs are split
    pooled = draw(2)
    assert sorted(set(pooled)) == [(t, TRAIN_INIT_OFFSET + k) for t in (1, 8) for k in (0, 1)]
    assert pooled[:4] == pooled[4:8] == pooled[8:]  # 4 groups per iteration cycle the 2 x 2 pool
    protocol = [group_initial_states(it, 4, 0, 4, [1, 8], None, protocol=True) for it in range(30)]
    inits = {i for _, ids in protocol for i in ids}
    assert inits == set(range(50))  # the protocol's 50 states, in turn, and none other


def test_token_grpo_runs_on_groups(tmp_path):
    ar = policies.save(policies.make("autoregressive", decoder_layers=1, **TINY), tmp_path / "ar")
    out = tmp_path / "grpo"
    proc = _train(
        f"init={ar}",
        "algo=grpo",
        f"out={out}",
        "iterations=1",
        "suite=goal",
        "tasks=[1]",
        "num_envs=4",
        "algo.group_size=2",
        "image_size=32",
        "chunks_per_iter=2",
        "algo.minibatch_size=4",
    )
    assert proc.returncode != 0 and "must cover the step limit" in proc.stderr
    # a 30-step training limit: 10 chunks of 3 cover it
    proc = _train(
        f"init={ar}",
        "algo=grpo",
        f"out={out}",
        "iterations=2",
        "suite=goal",
        "tasks=[1]",
        "num_envs=4",
        "algo.group_size=2",
        "image_size=32",
        "chunks_per_iter=10",
        "max_episode_steps=30",
        "algo.minibatch_size=16",
        "algo.temperature=0.7",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert policies.load(out / "checkpoint" / "policy").config.temperature == 0.7  # rollouts sampled at 0.7
    rows = _rows(out)
    assert len(rows) == 2 and all(int(r["episodes"]) == 4 for r in rows)  # each env's first episode
    assert all(r["groups_kept"] != "" for r in rows)


@pytest.mark.parametrize(
    "algo,sampler,task,extra",
    [
        ("flow_grpo", "sde", 1, ()),
        ("flow_fpo", "fpo", 1, ()),
        ("flow_dsrl_grpo", "steer", 1, ()),
        ("flow_grpo", "sde", 2, ("reward_type=shaped", "algo.grpo_keep=return", "algo.grpo_std_norm=false")),
    ],
)  # 2: put the cube on the plate
def test_flow_grpo_runs_on_groups(tmp_path, algo, sampler, task, extra):
    """GRPO on a flow VLA: Flow-SDE (or FPO: ODE; or DSRL: ODE from steered noise) rollouts in groups of
    shared initial states, no critic. With shaped rewards and ``grpo_keep=return`` the untrained
    policy's all-failure groups, whose rollouts got to different places, are kept and trained on."""
    flow = policies.save(policies.make("flow", expert_layers=1, sampler="ode", **TINY), tmp_path / "flow")
    out = tmp_path / "fgrpo"
    proc = _train(
        f"init={flow}",
        f"algo={algo}",
        f"out={out}",
        "iterations=2",
        "suite=goal",
        f"tasks=[{task}]",
        "num_envs=4",
        "algo.group_size=2",
        "image_size=32",
        "chunks_per_iter=10",
        "max_episode_steps=30",
        "algo.minibatch_size=null",
        "algo.epochs=2",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert policies.load(out / "checkpoint" / "policy").config.sampler == sampler  # the rollouts' sampler
    rows = _rows(out)
    assert len(rows) == 2 and all(int(r["episodes"]) == 4 for r in rows)  # each env's first episode
    assert all(r["groups_kept"] != "" and r["value_loss"] in ("", "0", "0.0") for r in rows)
    # minibatch_size=null: one step on the whole batch per epoch (none when every group was dropped)
    assert all(float(r["minibatches"]) == (2 if float(r["groups_kept"]) else 0) for r in rows)
    if extra:
        assert all(float(r["groups_kept"]) >= 1 and float(r["success_rate"]) == 0 for r in rows)
    if sampler == "steer":  # DSRL trains the steering module and leaves the flow as it was
        import torch

        before, after = policies.load(flow).state_dict(), policies.load(out / "checkpoint" / "policy").state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert any(k.startswith("steer.") for k in after)


def test_in_process_algorithm_warmup_then_updates(tmp_path):
    """In-process ChunkRL (real Ray, local runner and learner, no overlap), the update path of
    ``embodied-train``: on a token VLA the warm-up iteration changes the value head and nothing else,
    the next one trains the actor; ``minibatch_size=None`` is one step per epoch on the whole batch
    (6 chunks). On a state-only flow VLA (privileged state, no cameras) the same, in even minibatches
    (6 chunks in 2 of 3, 2 epochs) with finite statistics; the typed configs reach the runner and the
    learner as given, and the default ``freeze_prefix`` leaves the observation encoder as it was."""
    import math

    import ray
    import torch

    import sims
    from embodied.algorithms.batch import AdvantageConfig
    from embodied.algorithms.loss import LossConfig
    from embodied.algorithms.sampling import EnvRunnerSettings
    from embodied.algorithms.update import UpdateConfig
    from embodied.rllib import build_algorithm
    from embodied.rllib.startup import start_ray
    from embodied.runners.train import RuntimeConfig

    torch.manual_seed(0)
    instructions = [t.instruction for t in sims.suites.tasks("goal")]
    settings = EnvRunnerSettings(
        suite="goal",
        tasks=[2],
        num_envs=2,
        image_size=32,
        chunks_per_iter=3,
        reward_type="dense",
        advantages=AdvantageConfig(name="ppo"),
    )
    with sims.make("mujoco", suite="goal", num_envs=1, cameras=(), state_obs="privileged") as env:
        width = int(env.observation_spec["state"].shape[0])
    cases = [
        (
            policies.make("autoregressive", decoder_layers=1, **TINY),
            UpdateConfig(critic_warmup=1, minibatch_size=None, epochs=1),
            LossConfig(),
            1.0,
        ),
        (
            policies.make(
                "flow",
                **{**TINY, "cameras": [], "state_dim": width, "state_obs": "privileged"},
                sampler="sde",
                expert_layers=1,
            ),
            UpdateConfig(critic_warmup=1, minibatch_size=4, epochs=2, target_kl=None),
            LossConfig(ent_coef=0.01, kl_coef=0.1, ratio="per_dim"),
            4.0,
        ),
    ]
    started = start_ray(RuntimeConfig(), tmp_path)
    algo = None
    try:
        with pytest.raises(TypeError, match="loss must be an embodied.algorithms.loss.LossConfig"):
            build_algorithm(cases[0][0], instructions=instructions, env_runner=settings, loss={"clip": 0.1})
        for policy, update, loss, minibatches in cases:
            algo = build_algorithm(policy, instructions=instructions, env_runner=settings, update=update, loss=loss)
            assert algo._on_learners(lambda learner: (learner.config.update, learner.config.loss)) == [(update, loss)]
            assert algo.env_runner_group.local_env_runner.settings == settings  # as made, not rebuilt

            def snapshot() -> dict[str, torch.Tensor]:  # the local learner hands out its live tensors
                return {k: v.clone() for k, v in algo.policy_state().items()}

            before = snapshot()
            row = algo.run_iteration(0)
            assert row["actor_updated"] == 0.0 and row["advantage_std"] > 0 and row["env_steps"] == 2 * 3 * 3
            assert row["minibatches"] == minibatches and row["rows"] == 6
            assert math.isnan(row["grad_cos_first"])  # the warm-up steps no actor: no actor gradient
            warm = snapshot()
            changed = {k for k in before if not torch.equal(before[k], warm[k])}
            assert changed and all(k.startswith("value_mlp.") for k in changed), sorted(changed)[:5]
            row = algo.run_iteration(1)
            assert row["actor_updated"] == 1.0 and row["minibatches"] == minibatches
            assert row["epochs_run"] == update.epochs and row["kl_stop"] == 0.0
            for key in (
                "policy_loss",
                "value_loss",
                "entropy",
                "clip_fraction",
                "approx_kl",
                "approx_kl_first",
                "explained_variance",
            ):
                assert math.isfinite(row[key]), (key, row[key])
            # the first two minibatches' actor gradients compared where an epoch has two (disjoint rows)
            if update.minibatch_size is None:
                assert math.isnan(row["grad_cos_first"])
            else:
                assert -1.0 <= row["grad_cos_first"] <= 1.0 and row["grad_cos_first"] != 0.0
            after = snapshot()
            trained = {k for k in after if not torch.equal(warm[k], after[k])}
            assert any(not k.startswith("value_mlp.") for k in trained)
            assert not any(k.startswith("prefix.") for k in trained)  # freeze_prefix (the default)
            algo.stop()
            algo = None
    finally:
        if algo is not None:
            algo.stop()
        if started:
            ray.shutdown()


def test_kl_rollback_ends_the_iteration_on_weights_measured_within_the_target(tmp_path):
    """``kl_rollback``: a step so large that the next minibatch measures its approx KL beyond
    ``target_kl`` is undone with the one after it, so the actor ends the iteration on the weights
    that sampled the batch (the only ones measured within the target); the critic keeps its steps.
    Without it, the early stop keeps both steps."""
    import ray
    import torch

    import sims
    from embodied.algorithms.batch import AdvantageConfig
    from embodied.algorithms.sampling import EnvRunnerSettings
    from embodied.algorithms.update import UpdateConfig
    from embodied.rllib import build_algorithm
    from embodied.rllib.startup import start_ray
    from embodied.runners.train import RuntimeConfig

    instructions = [t.instruction for t in sims.suites.tasks("goal")]
    settings = EnvRunnerSettings(
        suite="goal",
        tasks=[2],
        num_envs=2,
        image_size=32,
        chunks_per_iter=4,
        reward_type="dense",
        advantages=AdvantageConfig(name="flow_sde"),
    )
    with sims.make("mujoco", suite="goal", num_envs=1, cameras=(), state_obs="privileged") as env:
        width = int(env.observation_spec["state"].shape[0])
    started = start_ray(RuntimeConfig(), tmp_path)
    try:
        for rollback in (True, False):
            torch.manual_seed(0)
            policy = policies.make(
                "flow",
                **{**TINY, "cameras": [], "state_dim": width, "state_obs": "privileged"},
                sampler="sde",
                expert_layers=1,
            )
            algo = build_algorithm(
                policy,
                instructions=instructions,
                env_runner=settings,
                update=UpdateConfig(lr=3e-2, minibatch_size=4, epochs=2, target_kl=1e-6, kl_rollback=rollback),
            )
            try:
                before = {k: v.clone() for k, v in algo.policy_state().items()}
                row = algo.run_iteration(0)
                after = algo.policy_state()
            finally:
                algo.stop()
            # the first minibatch is on-policy (KL ~0), its lr 3e-2 step throws the second one far beyond 1e-6
            assert (row["minibatches"], row["kl_stop"], row["kl_rollback"]) == (2.0, 1.0, float(rollback))
            moved = {k for k in before if not torch.equal(before[k], after[k])}
            assert any(k.startswith("value_mlp.") for k in moved)
            actor_moved = [k for k in moved if not k.startswith("value_mlp.")]
            assert (not actor_moved) if rollback else actor_moved, actor_moved[:5]
    finally:
        if started:
            ray.shutdown()


def test_a_new_sampler_trains_under_an_existing_algorithm(tmp_path):
    """A sampler is one registered class (policies/flow/samplers.py); ``algo.sampler=NAME`` then trains
    with it under an existing algorithm: its chunks carry its extras and its log-probability, which the
    learner recomputes. Here every denoising step gets a fixed Gaussian noise around the ODE step."""
    from policies.flow import sde
    from policies.flow.samplers import SAMPLERS, ChainSampler, register_sampler

    class FixedNoiseSampler(ChainSampler):
        name = "fixed_noise_test"

        def gaussian(self, policy, x, t, feats, v, dt):
            return sde.ode_step(x, v, dt), torch.full_like(x, 0.1)

    register_sampler(FixedNoiseSampler)
    try:
        init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
        out = tmp_path / "rl"
        train(compose("train", f"init={init}", f"out={out}", "iterations=1", "algo.sampler=fixed_noise_test", *RUN))
        (row,) = list(csv.DictReader(open(out / "metrics.csv")))
        assert float(row["env_steps"]) == 2 * 3 * 3 and float(row["approx_kl_first"]) < 1e-6  # on-policy, recomputed
        entropy = 3 * 7 * 5 * (0.5 + 0.5 * math.log(2 * math.pi * 0.01))  # H x A x K steps of std 0.1
        assert abs(float(row["entropy"]) - entropy) < 1e-3
        assert policies.load(out / "checkpoint" / "policy").config.sampler == "fixed_noise_test"
    finally:
        SAMPLERS._entries.pop(FixedNoiseSampler.name)  # other tests of this process see the registry as shipped
