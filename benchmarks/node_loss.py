"""Losing a Ray node mid-training, then the driver: how long RL takes to get going again.

    .venv/bin/python benchmarks/node_loss.py --out runs/node_loss
    .venv/bin/python benchmarks/node_loss.py --out runs/node_loss --iterations 30 --node-loss-at 8 --driver-kill-at 16 -- num_envs=8

A two-node Ray cluster on this machine (:mod:`embodied.rllib.local_cluster`: a 2-CPU head that
holds the driver, a 1-CPU worker node) runs ``embodied-train runtime=cluster
runtime.num_env_runners=2`` (one env runner on each node) on a tiny random flow VLA. After
``--node-loss-at`` iterations every process of the worker node is SIGKILLed; after
``--driver-kill-at`` the driver is SIGKILLed; ``resume=true`` then finishes ``--iterations`` on the
head alone. Extra arguments after ``--`` go to every ``embodied-train`` call. Ray notices a lost node
by missed health checks: ``--health-check-period-ms`` / ``--health-check-failure-threshold`` set them.

Reported (``OUT/node_loss.json``, and a Markdown section on stdout): the node-loss recovery time
(from the kill to the lost runner sampling again on the head with the current weights), when the
driver saw the loss, the iteration that absorbed it against the median iteration, iterations
before and after; the driver's resume (start to first new iteration, iterations redone since the
checkpoint); and whether ``metrics.csv`` runs 1..N once each with ``env_steps`` rising by the same
amount every iteration.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
TINY = {
    "d_model": 32,
    "image_size": 32,
    "vision_channels": [8, 16],
    "chunk_size": 3,
    "prefix_layers": 1,
    "expert_layers": 1,
}
RUN = [
    "suite=goal",
    "tasks=[2,3]",
    "num_envs=4",
    "image_size=32",
    "chunks_per_iter=8",
    "algo.minibatch_size=16",
    "save_every=1",
    "runtime=cluster",
    "runtime.num_env_runners=2",
    "runtime.learner_threads=1",
]


def read_rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    return list(csv.DictReader(open(path))) if path.is_file() else []


def wait_until(what: str, done: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float) -> float:
    """Poll ``done`` until true; the unix time it was first seen true."""
    deadline = time.time() + timeout
    while not done():
        if proc.poll() is not None:
            raise SystemExit(f"node_loss: embodied-train ended (rc {proc.returncode}) before {what}; see {log}")
        if time.time() > deadline:
            raise SystemExit(f"node_loss: no {what} within {timeout:.0f} s; see {log}")
        time.sleep(0.2)
    return time.time()


def continuity(rows: list[dict[str, str]]) -> dict[str, Any]:
    """Whether the iterations run 1..N once each, and the env steps each iteration added (fewer than
    envs x chunks x chunk size where an episode ended inside a chunk; half of it would be one runner's)."""
    its = [int(r["iteration"]) for r in rows]
    steps = [int(r["env_steps"]) for r in rows]
    added = [b - a for a, b in zip([0] + steps, steps)]
    return {
        "iterations": its[-1] if its else 0,
        "iterations_once_each": its == list(range(1, len(its) + 1)),
        "env_steps_added_min": min(added, default=0),
        "env_steps_added_max": max(added, default=0),
        "env_steps_added": added,
    }


def run(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    import policies
    from embodied.rllib.local_cluster import local_cluster

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rl, log = out / "rl", out / "train.log"
    init = policies.save(policies.make("flow", **TINY), out / "sft")
    base = [str(BIN / "embodied-train"), f"init={init}", f"out={rl}", *RUN, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    system = {
        k: v
        for k, v in (
            ("health_check_period_ms", args.health_check_period_ms),
            ("health_check_failure_threshold", args.health_check_failure_threshold),
        )
        if v
    }
    with local_cluster(out / "ray", head_cpus=2, worker_cpus=1, system_config=system) as cluster:
        head, worker = cluster.head_id, cluster.worker_id
        first = base + [f"runtime.address={cluster.address}", "iterations=100000"]
        with open(log, "w") as fh:
            proc = subprocess.Popen(first, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_until(
                f"{args.node_loss_at} iterations",
                lambda: len(read_rows(rl)) >= args.node_loss_at,
                proc,
                log,
                args.timeout,
            )
            before = len(read_rows(rl))
            node_killed_at = time.time()
            pids = cluster.kill_worker_node()
            wait_until(
                f"{args.driver_kill_at} iterations",
                lambda: len(read_rows(rl)) >= args.driver_kill_at,
                proc,
                log,
                args.timeout,
            )
            seen = len(read_rows(rl))
            driver_killed_at = time.time()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        checkpoint = json.loads((rl / "checkpoint" / "train_state" / "state.json").read_text())["step"]
        resume = base + [f"runtime.address={cluster.address}", f"iterations={args.iterations}", "resume=true"]
        with open(log, "a") as fh:
            proc = subprocess.Popen(resume, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        resumed_at = time.time()
        first_new = wait_until(
            "an iteration after resuming", lambda: len(read_rows(rl)) > checkpoint, proc, log, args.timeout
        )
        if proc.wait(timeout=args.timeout) != 0:
            raise SystemExit(f"node_loss: the resumed run failed; see {log}")
    rows = read_rows(rl)
    recoveries = [json.loads(line) for line in (rl / "runner_recoveries.jsonl").read_text().splitlines()]
    hit = [r for r in rows if float(r["runner_restarts"] or 0)]
    normal = [float(r["iteration_s"]) for r in rows if not float(r["runner_restarts"] or 0)]
    rec = recoveries[0]
    return {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "train_command": " ".join(shlex.quote(a) for a in first[1:]),
        "machine": _machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nodes": {"head": head, "worker": worker},
        "worker_pids_killed": len(pids),
        "ray_system_config": system,
        "node_loss": {
            "iterations_before": before,
            "loss_seen_s": round(rec["lost_at"] - node_killed_at, 2),
            "recovery_s": round(rec["back_at"] - node_killed_at, 2),
            "runner": rec["worker_index"],
            "back_on_head": rec["node_id"] == head,
            "lost_from_worker": rec["lost_node_id"] == worker,
            "iteration": int(hit[0]["iteration"]) if hit else None,
            "iteration_s": float(hit[0]["iteration_s"]) if hit else None,
            "iteration_env_steps": continuity(rows)["env_steps_added"][int(hit[0]["iteration"]) - 1] if hit else None,
            "median_iteration_s": round(statistics.median(normal), 3) if normal else None,
            "iterations_after_before_driver_kill": seen - before,
        },
        "driver_kill": {
            "iterations_seen": seen,
            "checkpoint": checkpoint,
            "redone": seen - checkpoint,
            "resume_to_first_iteration_s": round(first_new - resumed_at, 2),
            "killed_to_first_iteration_s": round(first_new - driver_killed_at, 2),
        },
        "recoveries": recoveries,
        "continuity": continuity(rows),
        "approx_kl_first_max": max(float(r["approx_kl_first"]) for r in rows),
    }


def _machine() -> dict[str, Any]:
    from embodied.runs import machine_info

    return machine_info()


def markdown(result: dict[str, Any]) -> str:
    loss, drv, cont = result["node_loss"], result["driver_kill"], result["continuity"]
    return "\n".join(
        [
            f"| node lost after iteration | {loss['iterations_before']} |",
            "|---|---|",
            f"| driver saw the loss (s after the kill) | {loss['loss_seen_s']} |",
            f"| recovery: runner {loss['runner']} sampling again on the head (s after the kill) | {loss['recovery_s']} |",
            (
                f"| iteration that absorbed it | {loss['iteration']}: {loss['iteration_s']:.1f} s (median "
                f"{loss['median_iteration_s']} s), {loss['iteration_env_steps']} env steps |"
            ),
            f"| iterations after the loss, before the driver kill | {loss['iterations_after_before_driver_kill']} |",
            f"| driver killed after / checkpoint / redone | {drv['iterations_seen']} / {drv['checkpoint']} / {drv['redone']} |",
            f"| resume: start to first new iteration (s) | {drv['resume_to_first_iteration_s']} |",
            f"| metrics.csv: iterations 1..N once each | {cont['iterations_once_each']} (N = {cont['iterations']}) |",
            f"| env steps added per iteration (min-max) | {cont['env_steps_added_min']}-{cont['env_steps_added_max']} |",
            f"| largest first-minibatch approx KL (0: every batch sampled by the learner's weights) | {result['approx_kl_first_max']:.2g} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=24, help="iterations in all, the resumed run's end")
    ap.add_argument("--node-loss-at", type=int, default=6, help="kill the worker node after this many iterations")
    ap.add_argument("--driver-kill-at", type=int, default=14, help="kill the driver after this many iterations")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each stage")
    ap.add_argument(
        "--health-check-period-ms", type=int, default=None, help="Ray's node health check period (default Ray's: 3000)"
    )
    ap.add_argument(
        "--health-check-failure-threshold",
        type=int,
        default=None,
        help="missed health checks before Ray declares a node dead (default Ray's: 5)",
    )
    args = ap.parse_args(argv)
    if not 0 < args.node_loss_at < args.driver_kill_at < args.iterations:
        ap.error("need 0 < --node-loss-at < --driver-kill-at < --iterations")
    result = run(args, extra)
    (Path(args.out) / "node_loss.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
