"""Quick evaluation of a policy on a suite's fixed initial states (``embodied-sft eval.suite=...``);
the full harness with intervals, videos, reports and resume is ``embodied-eval``
(:mod:`embodied.runners.eval`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from embodied.eval.harness import PolicyAgent, run_suite


def evaluate_suite(
    policy: Any,
    suite: str,
    *,
    tasks: Sequence[int] | None = None,
    episodes_per_task: int = 10,
    num_envs: int = 10,
    image_size: int = 128,
    mode: str = "greedy",
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Success rate per task on initial states ``0..episodes_per_task-1`` (same protocol as the harness)."""
    import sims

    specs = sims.suites.tasks(suite)
    task_ids = list(range(len(specs))) if tasks is None else list(tasks)
    records = []
    with tqdm(total=len(task_ids) * episodes_per_task, desc=f"eval {suite}", unit="ep", disable=not progress) as bar:
        stats = run_suite(
            PolicyAgent(policy, mode),
            suite,
            tasks=task_ids,
            episodes=episodes_per_task,
            num_envs=num_envs,
            image_size=image_size,
            seed=seed,
            on_episode=records.append,
            progress=bar,
            check=policy.check_env,
        )
    per_task = []
    for t in task_ids:
        eps = [r for r in records if r.task == t]
        per_task.append(
            {
                "task": t,
                "name": specs[t].name,
                "episodes": len(eps),
                "success_rate": float(np.mean([r.success for r in eps])),
                "mean_length": float(np.mean([r.length for r in eps])),
            }
        )
    return {
        "suite": suite,
        "success_rate": float(np.mean([r["success_rate"] for r in per_task])),
        "episodes_per_task": episodes_per_task,
        "image_size": image_size,
        "tasks": per_task,
        "env_steps_per_s": stats["env_steps"] / max(stats["seconds"], 1e-9),
    }
