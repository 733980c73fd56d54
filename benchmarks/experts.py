"""``bench=experts``: every scripted expert on all 50 fixed initial states of every task.

For each suite, one env of ``num_envs`` parallel envs (default 50: one episode per initial state
in a single wave) runs each task's 50 evaluation episodes; an env stops at success or at the
task's step limit. Writes ``experts.json`` (per task: success rate, failures by initial-state id,
mean episode length; per suite: mean; the 95% target) and ``experts.csv``.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json


@dataclass
class ExpertsBenchConfig(BenchConfig):
    """``bench=experts``: each scripted expert on the fixed evaluation initial states of every task."""

    suites: list[str] = field(default_factory=list)  # [] = every suite
    init_states: int = 50  # evaluation initial states per task (the protocol's 50)
    num_envs: int = 50  # parallel envs (one wave per task with the default)
    num_threads: int = 0  # MuJoCo C threads; 0 = all cores
    target_success: float = 0.95  # every task must reach this; reported, never asserted by tests


SCHEMA = ExpertsBenchConfig


def run_task(env: Any, expert: Any, task: int, init_ids: list[int], max_steps: int) -> dict[str, Any]:
    """Run ``len(init_ids)`` episodes (envs ``0..k-1``) of one task; the rest of the envs idle."""
    n, k = env.num_envs, len(init_ids)
    pad = init_ids + [init_ids[0]] * (n - k)
    obs = env.reset(task_ids=[task] * n, init_ids=pad)
    expert.reset()
    finished = np.zeros(n, bool)
    finished[k:] = True
    success = np.zeros(n, bool)
    length = np.zeros(n, np.int64)
    diverged = np.zeros(n, bool)
    for _ in range(max_steps):
        obs, _, _, _, info = env.step(expert.act(obs), active=torch.as_tensor(~finished))
        done = info["done"].numpy() & ~finished
        success |= info["success"].numpy() & ~finished
        diverged |= info["diverged"].numpy() & ~finished
        length[done] = info["episode"]["length"].numpy()[done]
        finished |= done
        if finished.all():
            break
    return {
        "success": success[:k].tolist(),
        "length": length[:k].tolist(),
        "diverged": int(diverged[:k].sum()),
    }


def run(cfg: ExpertsBenchConfig, out: Path) -> dict[str, Any]:
    import sims

    suites = list(cfg.suites) if cfg.suites else sims.suites.names()
    unknown = [s for s in suites if s not in sims.suites.names()]
    if unknown:
        raise BenchError(f"unknown suite(s) {unknown}; choose from {sims.suites.names()}")
    if not 1 <= cfg.init_states <= sims.suites.NUM_INIT_STATES:
        raise BenchError(f"init_states must be in 1..{sims.suites.NUM_INIT_STATES}, got {cfg.init_states}")
    init_ids = list(range(cfg.init_states))
    rows: list[dict[str, Any]] = []
    per_suite: dict[str, Any] = {}
    start = time.perf_counter()
    total = sum(len(sims.suites.tasks(s)) for s in suites)
    with tqdm(total=total, desc="experts", unit="task") as bar:
        for suite in suites:
            specs = sims.suites.tasks(suite)
            n = min(cfg.num_envs, len(init_ids))
            with sims.make(
                "mujoco", suite=suite, num_envs=n, seed=cfg.seed, cameras=(), num_threads=cfg.num_threads or None
            ) as env:
                expert = sims.suites.expert(suite, num_envs=n)
                tasks = []
                for t, spec in enumerate(specs):
                    res = {"success": [], "length": [], "diverged": 0}
                    for lo in range(0, len(init_ids), n):
                        part = run_task(env, expert, t, init_ids[lo : lo + n], spec.max_steps)
                        for key in ("success", "length"):
                            res[key] += part[key]
                        res["diverged"] += part["diverged"]
                    rate = float(np.mean(res["success"]))
                    row = {
                        "suite": suite,
                        "task": t,
                        "name": spec.name,
                        "episodes": len(init_ids),
                        "success_rate": rate,
                        "failures": [i for i, ok in zip(init_ids, res["success"]) if not ok],
                        "mean_length": float(np.mean(res["length"])),
                        "max_steps": spec.max_steps,
                        "diverged": res["diverged"],
                        "meets_target": rate >= cfg.target_success,
                    }
                    tasks.append(row)
                    rows.append(row)
                    bar.set_postfix_str(f"{suite}/{t} {rate:.0%}")
                    bar.update(1)
            per_suite[suite] = {
                "success_rate": float(np.mean([r["success_rate"] for r in tasks])),
                "min_task_success_rate": float(min(r["success_rate"] for r in tasks)),
                "tasks": tasks,
            }
    result = {
        "bench": "experts",
        "init_states": len(init_ids),
        "target_success": cfg.target_success,
        "all_tasks_meet_target": all(r["meets_target"] for r in rows),
        "tasks_total": len(rows),
        "tasks_below_target": [f"{r['suite']}/{r['name']}" for r in rows if not r["meets_target"]],
        "overall_success_rate": float(np.mean([r["success_rate"] for r in rows])),
        "wall_s": round(time.perf_counter() - start, 1),
        "suites": per_suite,
        "machine": machine_info(),
    }
    write_json(out / "experts.json", result)
    with open(out / "experts.csv", "w", newline="") as fh:
        writer = csv.DictWriter(
            fh,
            fieldnames=[
                "suite",
                "task",
                "name",
                "episodes",
                "success_rate",
                "mean_length",
                "max_steps",
                "diverged",
                "meets_target",
                "failures",
            ],
        )
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "failures": " ".join(map(str, r["failures"]))})
    print(f"{'suite':8s} {'task':52s} {'success':>8s} {'len':>5s}")
    for r in rows:
        print(f"{r['suite']:8s} {r['name']:52s} {r['success_rate']:8.0%} {r['mean_length']:5.0f}")
    for s, v in per_suite.items():
        print(f"suite {s}: mean {v['success_rate']:.1%}, min task {v['min_task_success_rate']:.0%}")
    print(f"all {len(rows)} tasks >= {cfg.target_success:.0%}: {result['all_tasks_meet_target']}")
    return result
