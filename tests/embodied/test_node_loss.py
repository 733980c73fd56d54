"""Losing an env runner, or a whole Ray node, in the middle of RL training (real Ray, real MuJoCo,
processes really killed): training goes on with the current weights, no iteration lost or counted
twice, and a killed driver resumes from its checkpoint."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import policies

BIN = Path(sys.executable).parent
TINY = {"d_model": 32, "image_size": 32, "vision_channels": [8, 16], "chunk_size": 3, "prefix_layers": 1}
RUN = ["suite=goal", "tasks=[2,3]", "num_envs=2", "image_size=32", "chunks_per_iter=3", "algo.minibatch_size=4"]
STEPS_PER_ITERATION = 2 * 2 * 3 * 3  # 2 runners x 2 envs x 3 chunks x 3 steps


def _rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    return list(csv.DictReader(open(path))) if path.is_file() else []


def _wait_for(what: str, done, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not done():
        if proc.poll() is not None:
            raise AssertionError(
                f"embodied-train ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}"
            )
        if time.time() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _runner_nodes(stderr: str) -> list[str]:
    """The env runners' node id prefixes from the driver's placement line."""
    found = re.search(r"env runners on (.*?); learners", stderr)
    assert found, stderr[-3000:]
    return [part.split("/")[1] for part in found.group(1).split(", ")]


def test_a_restarted_env_runner_samples_its_share_with_the_current_weights(tmp_path):
    """An env runner's process killed between iterations: Ray restarts it (random weights, fresh envs);
    the next iteration waits for it, gives it the learner's weights and has it sample its share again.
    Its batch is then on-policy (the first minibatch's approx KL is ~0, as in every other iteration: a
    runner sampling with its restart's random weights gives ~0.4 here) and the iteration holds both
    runners' env steps."""
    import ray

    import sims
    from embodied.rllib import build_algorithm, make_env_config
    from embodied.rllib.startup import start_ray
    from embodied.runners.train import RuntimeConfig

    torch.manual_seed(0)
    policy = policies.make("flow", expert_layers=1, sampler="sde", **TINY)
    env_config = make_env_config(suite="goal", tasks=[2, 3], num_envs=2, image_size=32, chunks_per_iter=3)
    instructions = [t.instruction for t in sims.suites.tasks("goal")]
    started = start_ray(RuntimeConfig(name="cluster", num_env_runners=2), tmp_path)
    algo = build_algorithm(
        policy, instructions=instructions, env_config=env_config, rl={"minibatch_size": 4}, num_env_runners=2
    )
    try:
        rows = [algo.run_iteration(0), algo.run_iteration(1)]
        runner_tasks = algo.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, r.obs["task_id"].tolist()), local_env_runner=False
        )
        victim = next(p for p in algo.placement()["env_runners"] if p["worker_index"] == 2)
        os.kill(victim["pid"], signal.SIGKILL)
        rows += [algo.run_iteration(2), algo.run_iteration(3)]
        after = next(p for p in algo.placement()["env_runners"] if p["worker_index"] == 2)
    finally:
        algo.stop()
        if started:
            ray.shutdown()
    assert sorted(runner_tasks) == [(1, [2, 2]), (2, [3, 3])]  # each runner runs its share of the tasks
    assert after["pid"] != victim["pid"]
    assert [r["runner_restarts"] for r in rows] == [0.0, 0.0, 1.0, 0.0]
    assert [r["env_steps"] for r in rows] == [STEPS_PER_ITERATION] * 4
    assert all(r["fresh_episodes"] <= r["episodes"] for r in rows)  # each env's first episode since a reset
    assert all(r["approx_kl_first"] < 1e-6 and r["clip_fraction_first"] == 0.0 for r in rows)
    (recovery,) = algo.recoveries
    assert (recovery.iteration, recovery.worker_index) == (2, 2) and recovery.wait_s > 0


@pytest.mark.slow
def test_training_goes_on_when_a_node_is_lost_and_resumes_after_the_driver_is_killed(tmp_path):
    """embodied-train on two Ray nodes (a 2-CPU head with the driver, a 1-CPU worker node): Ray's default
    policy fills the driver's node to half its CPUs before spreading, so one env runner runs on each
    node and the head keeps a CPU free. The worker node's processes are all SIGKILLed mid-training:
    its runner comes back on the head with the current weights, and metrics.csv goes on with every
    iteration once, each with both runners' env steps. Then the driver is SIGKILLed and resume=true
    (on the one node left) continues from its checkpoint."""
    from embodied.rllib.local_cluster import local_cluster

    init = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "sft")
    out = tmp_path / "rl"
    log = tmp_path / "train.log"
    args = [
        str(BIN / "embodied-train"),
        f"init={init}",
        f"out={out}",
        "save_every=1",
        *RUN,
        "runtime=cluster",
        "runtime.num_env_runners=2",
        "runtime.learner_threads=1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with local_cluster(tmp_path / "ray", head_cpus=2, worker_cpus=1) as cluster:
        head = cluster.head_id
        cmd = args + [f"runtime.address={cluster.address}", "iterations=400"]
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            _wait_for("two iterations", lambda: len(_rows(out)) >= 2, proc, log)
            nodes = _runner_nodes(log.read_text())
            assert sorted(nodes) == sorted([cluster.head_id[:8], cluster.worker_id[:8]])
            lost_at = len(_rows(out))
            cluster.kill_worker_node()
            _wait_for(
                "recovery and two iterations after it",
                lambda: any(float(r["runner_restarts"]) for r in _rows(out)) and len(_rows(out)) >= lost_at + 3,
                proc,
                log,
            )
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver; Ray ends its actors with it
            proc.wait()
        recoveries = [json.loads(line) for line in (out / "runner_recoveries.jsonl").read_text().splitlines()]
        assert [(r["worker_index"], r["node_id"]) for r in recoveries] == [
            (nodes.index(cluster.worker_id[:8]) + 1, cluster.head_id)
        ]
        assert recoveries[0]["lost_node_id"] == cluster.worker_id
        assert "back on" in log.read_text() and "sampling its share again" in log.read_text()
        killed_at = json.loads((out / "checkpoint" / "train_state" / "state.json").read_text())["step"]
        target = killed_at + 2
        proc = subprocess.run(
            args + [f"runtime.address={cluster.address}", f"iterations={target}", "resume=true"],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, target + 1))
    assert [int(r["env_steps"]) for r in rows] == [STEPS_PER_ITERATION * (i + 1) for i in range(target)]
    assert sum(float(r["runner_restarts"]) for r in rows) == 1  # the recovery's iteration was kept
    assert all(float(r["approx_kl_first"]) < 1e-6 for r in rows)  # every batch sampled by the learner's weights
    summary = json.loads((out / "train.json").read_text())
    assert {p["node_id"] for p in summary["placement"]["env_runners"]} == {head}


@pytest.mark.slow
def test_a_runner_with_no_free_cpu_to_come_back_on_stops_the_run_with_what_to_do(tmp_path):
    """One CPU per node: the runner of a lost node has nowhere to restart. The iteration waits
    runner_restart_timeout_s, then stops with what to do, and the algorithm stops at once (RLlib's
    stop would otherwise wait forever on the runner)."""
    import ray

    import sims
    from embodied.rllib import build_algorithm, make_env_config
    from embodied.rllib.local_cluster import local_cluster
    from embodied.rllib.recovery import RunnerLostError

    policy = policies.make("flow", expert_layers=1, sampler="sde", **TINY)
    env_config = make_env_config(suite="goal", tasks=[2, 3], num_envs=2, image_size=32, chunks_per_iter=3)
    instructions = [t.instruction for t in sims.suites.tasks("goal")]
    with local_cluster(tmp_path / "ray", head_cpus=1, worker_cpus=1) as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            algo = build_algorithm(
                policy,
                instructions=instructions,
                env_config=env_config,
                rl={"minibatch_size": 4},
                num_env_runners=2,
                runner_restart_timeout_s=3,
            )
            try:
                algo.run_iteration(0)
                cluster.kill_worker_node()
                with pytest.raises(RunnerLostError, match="has not come back .* Add a node .*resume=true"):
                    algo.run_iteration(1)
            finally:
                algo.stop()
        finally:
            ray.shutdown()


def test_runner_restart_timeout_must_be_positive(tmp_path):
    from conftest import compose

    from embodied.runners.train import TrainError, train

    with pytest.raises(TrainError, match="runner_restart_timeout_s must be > 0"):
        train(
            compose(
                "train",
                f"out={tmp_path / 'bad'}",
                "policy=flow",
                *RUN,
                "runtime=cluster",
                "runtime.runner_restart_timeout_s=0",
            )
        )
