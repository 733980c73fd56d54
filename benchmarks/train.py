"""Training throughput benchmark (``embodied-bench bench=train``): RL end to end on Ray RLlib.

For each runtime in ``runtimes`` (a *case*): ``local-sequential`` (one process: sample, then
learn), ``local-overlap`` (one process: sampling of iteration k+1 in a thread while the learner
updates on iteration k), ``cluster-sequential`` (``cluster_env_runners`` remote env runners as Ray
actors sharing the ``num_envs`` envs, the learner in the driver: the same envs stepped and rendered
in parallel processes, sampling then learning: the main job's runtime) and ``cluster-overlap``
(the same runners sampling iteration k+1 while the driver learns on k). Every case builds the same algorithm (same
policy weights, suite, tasks, envs, chunks per iteration, hyper-parameters) with
:func:`embodied.rllib.build_algorithm` and runs ``warmup`` untimed iterations then ``iterations``
timed ones. The cases run one after the other, ``rounds`` times in alternation (A B A B ...) so
slow drifts of the machine hit them alike.

Per iteration: env steps, wall time (from the start of the iteration's wait for its samples to the
end of the learner update and weight sync), sim / inference time inside the env runners, learner
time, time the driver spent waiting for samples. Quoted: medians over the timed iterations of all
rounds of env-steps/s end to end, and of each part of the time split. Each case's speedup is its
median env-steps/s over ``local-sequential``'s; ``overlap_speedup`` is overlap over sequential on the
same runtime (``local``: local-overlap / local-sequential, ``cluster``: cluster-overlap /
cluster-sequential). An overlapped batch is trained one update after it was sampled: each case
reports its largest ``policy_lag`` (0 sequential, 1 overlapped). The target (``>=
target_overlap_speedup``, default 1.5) is reported per case, never asserted. The update schedule
is the main job's (``epochs`` shuffled passes of ``minibatch_size``-chunk minibatches).

The policy is the default flow VLA (random weights) unless ``init`` names a bundle; throughput
does not depend on the weights' values beyond episode lengths, which the per-iteration env-step
counts absorb. Outputs: ``<out>/train.json`` (config, machine, per case the per-iteration samples
and medians, the speedup and target) and ``<out>/train.csv`` (one row per case).
"""

from __future__ import annotations

import csv
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from benchmarks.config import BenchConfig, BenchError
from embodied.algorithms.update import UpdateConfig
from embodied.runs import machine_info, write_json

CASES = ("local-sequential", "local-overlap", "cluster-sequential", "cluster-overlap")
TIMES = ("sim_s", "inference_s", "learn_s", "wait_s", "iteration_s")


@dataclass
class TrainBenchConfig(BenchConfig):
    """``bench=train``: env-steps/s of RL training end to end, sequential versus overlapped."""

    init: Optional[str] = None  # a flow bundle to start from (default: the default flow policy)
    algo: str = "flow_sde"  # flow_sde | flow_sde_full | flow_noise
    suite: str = "goal"
    tasks: list[int] = field(default_factory=lambda: [8])  # the main job's default task
    num_envs: int = 10  # envs in total (split over the runners of the cluster case)
    image_size: int = 64
    chunks_per_iter: int = 8
    max_episode_steps: Optional[int] = 60
    minibatch_size: int = UpdateConfig.minibatch_size  # chunks per gradient step
    epochs: int = UpdateConfig.epochs  # shuffled passes over each iteration's batch
    runtimes: list[str] = field(default_factory=lambda: list(CASES))  # cases
    cluster_env_runners: int = 2  # env runners of the cluster cases
    warmup: int = 1  # untimed iterations per case and round
    iterations: int = 5  # timed iterations per case and round
    rounds: int = 2  # alternations of the cases
    target_overlap_speedup: float = 1.5  # overlap / sequential on one runtime; reported, never asserted


SCHEMA = TrainBenchConfig


def _policy(cfg: TrainBenchConfig) -> Any:
    import policies

    if cfg.init:
        policy = policies.load(cfg.init)
    else:
        policy = policies.make("flow")
    if policy.family != "flow":
        raise BenchError(f"bench=train times the flow VLA's RL; {cfg.init} holds a {policy.family} policy")
    policy.config.sampler = {"flow_sde": "sde", "flow_sde_full": "sde_full", "flow_noise": "noise"}[cfg.algo]
    return policy


def _run_case(cfg: TrainBenchConfig, case: str, policy: Any, round_index: int) -> list[dict[str, float]]:
    import sims
    from embodied.rllib import build_algorithm, make_env_config

    cluster = case.startswith("cluster")
    env_config = make_env_config(
        suite=cfg.suite,
        tasks=cfg.tasks,
        num_envs=cfg.num_envs,
        image_size=cfg.image_size,
        chunks_per_iter=cfg.chunks_per_iter,
        max_steps=cfg.max_episode_steps,
    )
    rl = dict(
        lr=UpdateConfig.lr,
        critic_lr=UpdateConfig.critic_lr,
        num_epochs=cfg.epochs,
        minibatch_size=cfg.minibatch_size,
        overlap=case.endswith("overlap"),
    )
    if cluster:  # the same envs in total, split over the runner processes
        env_config["num_envs"] = max(cfg.num_envs // cfg.cluster_env_runners, 1)
    algo = build_algorithm(
        policy,
        instructions=[t.instruction for t in sims.suites.tasks(cfg.suite)],
        env_config=env_config,
        rl=rl,
        num_env_runners=cfg.cluster_env_runners if cluster else 0,
        seed=cfg.seed + round_index,
    )
    rows = []
    try:
        total = cfg.warmup + cfg.iterations
        algo.stop_iteration = total
        for it in range(total):
            row = algo.run_iteration(it)
            if it >= cfg.warmup:
                row["env_steps_per_s"] = row["env_steps"] / row["iteration_s"]
                rows.append(row)
    finally:
        algo.stop()
    return rows


def run(cfg: TrainBenchConfig, out: Path) -> dict[str, Any]:
    import torch

    import sims
    from embodied.rllib.startup import start_ray
    from embodied.runners.train import RuntimeConfig

    unknown = [c for c in cfg.runtimes if c not in CASES]
    if unknown or not cfg.runtimes:
        raise BenchError(f"runtimes {cfg.runtimes}: choose from {list(CASES)}")
    if cfg.algo not in ("flow_sde", "flow_sde_full", "flow_noise"):
        raise BenchError(f"algo={cfg.algo!r}: choose flow_sde, flow_sde_full or flow_noise")
    if cfg.suite not in sims.suites.names():
        raise BenchError(f"unknown suite {cfg.suite!r}; choose from {sims.suites.names()}")
    if cfg.iterations < 1 or cfg.rounds < 1:
        raise BenchError("iterations and rounds must be >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    policy = _policy(cfg)
    needs_cluster = any(c.startswith("cluster") for c in cfg.runtimes)
    started = start_ray(RuntimeConfig(num_env_runners=cfg.cluster_env_runners if needs_cluster else 0), out)
    samples: dict[str, list[dict[str, float]]] = {c: [] for c in cfg.runtimes}
    t0 = time.perf_counter()
    try:
        for r in range(cfg.rounds):
            for case in cfg.runtimes:
                print(f"[bench train] round {r + 1}/{cfg.rounds}: {case}", flush=True)
                samples[case] += _run_case(cfg, case, policy, r)
    finally:
        if started:
            import ray

            ray.shutdown()
    cases: dict[str, Any] = {}
    for case, rows in samples.items():
        cases[case] = {
            "iterations": len(rows),
            "env_steps_per_s": round(statistics.median(r["env_steps_per_s"] for r in rows), 1),
            "env_steps_per_iteration": statistics.median(r["env_steps"] for r in rows),
            "time_split_s": {k: round(statistics.median(r[k] for r in rows), 3) for k in TIMES},
            "policy_lag": max(float(r.get("policy_lag", 0.0)) for r in rows),
            "samples": [{k: round(float(r[k]), 4) for k in ("env_steps", "env_steps_per_s", *TIMES)} for r in rows],
        }
    speedups = {
        rt: round(cases[f"{rt}-overlap"]["env_steps_per_s"] / cases[f"{rt}-sequential"]["env_steps_per_s"], 3)
        for rt in ("local", "cluster")
        if f"{rt}-overlap" in cases and f"{rt}-sequential" in cases
    }
    speedup = speedups.get("local", speedups.get("cluster"))
    if "local-sequential" in cases:  # throughput of every case relative to the sequential loop
        for c in cases.values():
            c["vs_local_sequential"] = round(c["env_steps_per_s"] / cases["local-sequential"]["env_steps_per_s"], 3)
    result = {
        "config": asdict(cfg),
        "machine": machine_info(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "policy": {
            "family": policy.family,
            "sampler": policy.config.sampler,
            "init": cfg.init,
            "parameters": sum(p.numel() for p in policy.parameters()),
        },
        "cases": cases,
        "overlap_speedup": speedup,
        "overlap_speedup_by_runtime": speedups,
        "target": {
            "overlap_speedup": cfg.target_overlap_speedup,
            "met": None if speedup is None else speedup >= cfg.target_overlap_speedup,
            "met_by_runtime": {rt: v >= cfg.target_overlap_speedup for rt, v in speedups.items()},
            "met_by": sorted(
                c
                for c, v in cases.items()
                if c.endswith("overlap") and v.get("vs_local_sequential", 0) >= cfg.target_overlap_speedup
            ),
        },
    }
    write_json(out / "train.json", result)
    with open(out / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "iterations", "env_steps_per_s", "env_steps_per_iteration", "policy_lag", *TIMES])
        for case, c in cases.items():
            w.writerow(
                [
                    case,
                    c["iterations"],
                    c["env_steps_per_s"],
                    c["env_steps_per_iteration"],
                    c["policy_lag"],
                    *(c["time_split_s"][k] for k in TIMES),
                ]
            )
    print(f"{'case':<18} {'env-steps/s':>12} {'sim s':>7} {'infer s':>8} {'learn s':>8} {'wait s':>7} {'iter s':>7}")
    for case, c in cases.items():
        t = c["time_split_s"]
        print(
            f"{case:<18} {c['env_steps_per_s']:>12.1f} {t['sim_s']:>7.2f} {t['inference_s']:>8.2f} "
            f"{t['learn_s']:>8.2f} {t['wait_s']:>7.2f} {t['iteration_s']:>7.2f}"
        )
    for case, c in cases.items():
        if case != "local-sequential" and "vs_local_sequential" in c:
            print(f"{case} / local-sequential: {c['vs_local_sequential']:.2f}x")
    for rt, v in speedups.items():
        print(
            f"{rt}: overlap / sequential {v:.2f}x (target >= {cfg.target_overlap_speedup}; policy lag "
            f"{cases[rt + '-overlap']['policy_lag']:g} against {cases[rt + '-sequential']['policy_lag']:g})"
        )
    return result
