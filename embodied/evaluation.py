"""A simple evaluation loop: a policy on a suite's fixed initial states (one episode each).

Each env runs one (task, initial state) episode until success or the task's step limit; the
policy is queried for a chunk ``[N, H, A]`` and every env executes it step by step, stopping at
its own episode end. (The full benchmark harness with intervals, videos and reports builds on
this; see ``embodied-eval``.)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from tqdm import tqdm


def policy_obs(obs: dict[str, torch.Tensor], env: Any) -> dict[str, Any]:
    """Simulation observation + the instruction strings the policy reads."""
    return {"rgb": obs["rgb"], "state": obs["state"],
            "instruction": [env.tasks[int(t)].instruction for t in obs["task_id"]]}


def evaluate_suite(policy: Any, suite: str, *, tasks: Sequence[int] | None = None, episodes_per_task: int = 10,
                   num_envs: int = 10, image_size: int = 128, mode: str = "greedy", seed: int = 0,
                   progress: bool = True) -> dict[str, Any]:
    """Success rate per task on init states ``0..episodes_per_task-1``; see the module docstring."""
    import sims

    specs = sims.suites.tasks(suite)
    task_ids = list(range(len(specs))) if tasks is None else list(tasks)
    work = [(t, i) for t in task_ids for i in range(episodes_per_task)]
    n = min(num_envs, len(work))
    env = sims.make("mujoco", suite=suite, num_envs=n, seed=seed, cameras=tuple(policy.config.cameras),
                    image_size=image_size)
    policy.check_env(env)
    gen = torch.Generator().manual_seed(seed)
    results: dict[int, list[bool]] = {t: [] for t in task_ids}
    lengths: dict[int, list[int]] = {t: [] for t in task_ids}
    policy.eval()
    bar = tqdm(total=len(work), desc=f"eval {suite}", unit="ep", disable=not progress)
    try:
        for lo in range(0, len(work), n):
            wave = work[lo:lo + n]
            k = len(wave)
            pad = wave + [wave[0]] * (n - k)
            obs = env.reset(task_ids=[t for t, _ in pad], init_ids=[i for _, i in pad])
            active = np.zeros(n, bool)
            active[:k] = True
            success = np.zeros(n, bool)
            length = np.zeros(n, np.int64)
            while active.any():
                with torch.no_grad():
                    chunk = policy.sample(policy_obs(obs, env), mode=mode, generator=gen).actions
                for h in range(chunk.shape[1]):
                    obs, _, _, _, info = env.step(chunk[:, h], active=torch.as_tensor(active))
                    done = info["done"].numpy() & active
                    success |= info["success"].numpy() & active
                    length[done] = info["episode"]["length"].numpy()[done]
                    active &= ~done
                    bar.update(int(done.sum()))
                    if not active.any():
                        break
            for j, (t, _) in enumerate(wave):
                results[t].append(bool(success[j]))
                lengths[t].append(int(length[j]))
    finally:
        bar.close()
        env.close()
    per_task = [{"task": t, "name": specs[t].name, "episodes": len(results[t]),
                 "success_rate": float(np.mean(results[t])), "mean_length": float(np.mean(lengths[t]))}
                for t in task_ids]
    return {"suite": suite, "success_rate": float(np.mean([r["success_rate"] for r in per_task])),
            "episodes_per_task": episodes_per_task, "tasks": per_task}
