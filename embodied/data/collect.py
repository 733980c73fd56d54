"""Collect demonstrations: scripted experts (or a policy's own rollouts) in parallel envs -> a v3.0 dataset.

Episodes run in waves of N parallel envs: each env of a wave is reset to one (task, initial
state) of the work list and runs until its episode ends. Demonstrations use each task's training
states (:func:`sims.suites.training_init_id`): for our suites ``TRAIN_INIT_OFFSET + k``, never the 50
evaluation states (0..49), so a policy is never evaluated on the layouts it was trained on; for real
LIBERO, whose demonstrations come from its 50 official states, states 25..49 (the protocol scores all
50; the held-out evaluation the states 50..99 that LIBERO's placement initializer sampled).

With ``actor`` a policy acts instead of the experts (:class:`PolicyActor`: its chunks executed open loop,
as evaluation runs them), and ``init_pool="protocol"`` starts episodes from the protocol's own states
(0..49, the LIBERO RL works' training states): a policy's successful rollouts on the states RL trains on,
as data for self-imitation (success-filtered behaviour cloning, the reward-weighted regression of a 0/1
reward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from embodied.data.lerobot_format import DatasetWriter, Episode

#: where episodes start: ``training`` (the suite's training states) | ``protocol`` (the protocol's 0..49)
INIT_POOLS = ("training", "protocol")


class PolicyActor:
    """A policy as :func:`collect_suite`'s actor: one action per env and step from its chunks, executed as
    evaluation executes them (the harness's :class:`~embodied.latency.ChunkExecutor`, synchronous), in
    ``mode`` (greedy: the ODE from random initial noise, as evaluation scores; explore: the exploring
    sampler). Each wave's noise is seeded from ``(seed, wave)``, so a collection reproduces."""

    def __init__(self, policy: Any, mode: str = "greedy", seed: int = 0):
        from embodied.eval.harness import PolicyAgent

        self.agent = PolicyAgent(policy, mode)
        self.cameras = tuple(self.agent.cameras)
        self.state_obs = self.agent.state_obs
        self.chunk_size = int(self.agent.chunk_size)
        self.seed = seed
        self.env: Any = None
        self.executor: Any = None
        self._wave = -1

    def bind(self, env: Any) -> None:
        """Act in ``env`` (its envs in lockstep)."""
        from embodied.latency import ChunkExecutor, LatencyConfig

        self.env = env
        a = int(env.action_spec.shape[0])
        self.executor = ChunkExecutor(LatencyConfig(), env.num_envs, self.chunk_size, a, env.control_hz)

    def reset(self) -> None:
        """A new wave: its own noise, a fresh chunk at the next step."""
        from embodied.eval.harness import wave_seed

        self._wave += 1
        self.agent.begin_wave(wave_seed(self.seed, "collect", self._wave))
        self.executor.reset()

    def reads_next(self) -> bool:
        """Whether the next step's observation is read (it starts a chunk): only those views are rendered."""
        return bool(self.executor.reads_observation())

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The actions ``[N, A]`` of this step."""
        return self.executor.next_action(obs, self.env, self.agent)[0]


def pool_init_id(suite: str, pool: str, k: int) -> int:
    """The init id of the ``k``-th state of ``pool`` (see :data:`INIT_POOLS`)."""
    import sims

    return sims.suites.training_init_id(suite, k) if pool == "training" else k


def pool_size(suite: str, pool: str) -> int | None:
    """How many states ``pool`` holds per task (None: as many as asked for)."""
    import sims

    return sims.suites.num_training_states(suite) if pool == "training" else sims.suites.NUM_INIT_STATES


@dataclass
class CollectResult:
    """Per task: attempts, successes and kept episodes; plus totals."""

    suite: str
    tasks: list[dict[str, Any]]
    episodes: int
    frames: int
    wall_s: float
    root: Path


def check_action_noise(action_noise: float) -> None:
    """Raise ``ValueError`` unless ``action_noise`` is a usable DART noise std (actions lie in [-1, 1])."""
    if not 0.0 <= action_noise <= 1.0:
        raise ValueError(
            f"action_noise={action_noise}: a std in action units (actions lie in [-1, 1]), "
            "0 <= action_noise <= 1 (0.1 keeps the experts reliable)"
        )


def collect_suite(
    suite: str,
    out: str | Path,
    *,
    episodes_per_task: int,
    task_ids: Sequence[int] | None = None,
    num_envs: int = 8,
    cameras: Sequence[str] = ("agentview", "wrist"),
    image_size: int = 128,
    keep_failures: bool = False,
    max_attempts_per_task: int | None = None,
    seed: int = 0,
    num_threads: int | None = None,
    expert_gain: float = 1.0,
    action_noise: float = 0.0,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    actor: PolicyActor | None = None,
    init_pool: str = "training",
) -> CollectResult:
    """Run the suite's experts and write ``out`` (a v3.0 dataset). See the module docstring.

    Args:
        episodes_per_task: demonstrations to keep per task (successful ones unless
            ``keep_failures``); failed attempts are retried on new initial states, up to
            ``max_attempts_per_task`` (default 2x + 2; at most the suite's training states).
        task_ids: subset of the suite's task indices (default: all).
        on_episode: called with each finished episode's summary (for videos, logging).
        actor: a policy acting instead of the suite's experts (its executed actions are recorded; its
            cameras and state are the env's); None: the experts.
        init_pool: the initial states episodes start from, cycled in order (:data:`INIT_POOLS`).
        expert_gain: share of the remaining error the experts command per step (1: deadbeat; below
            1: smoother demonstrations, see :mod:`sims.mujoco.suites.experts`); recorded in ``info.json``.
        action_noise: std of Gaussian noise added to the arm dimensions (all but the last, the
            gripper) of the executed actions, clipped to the action bounds; the dataset records the
            expert's clean action at every state it visited (DART, Laskey et al. 2017), so a policy
            also learns how the expert steers back from the drift its own errors cause. 0: off.
    """
    import sims
    from sims.mujoco.robot import ACTION_NAMES, STATE_NAMES

    specs = sims.suites.tasks(suite)
    ids = list(range(len(specs))) if task_ids is None else [int(t) for t in task_ids]
    bad = [t for t in ids if not 0 <= t < len(specs)]
    if bad:
        raise ValueError(f"task ids {bad} out of range: suite {suite!r} has tasks 0..{len(specs) - 1}")
    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be >= 1, got {episodes_per_task}")
    check_action_noise(action_noise)
    if init_pool not in INIT_POOLS:
        raise ValueError(f"init_pool={init_pool!r}: choose {' or '.join(INIT_POOLS)}")
    if actor is None and init_pool == "protocol":
        raise ValueError(
            "init_pool=protocol starts episodes from the states evaluation scores: for a policy's rollouts "
            "only (demonstrations keep to the training states)"
        )
    if actor is not None and action_noise > 0:
        raise ValueError("action_noise is DART's noise on an expert's actions: leave it 0 with a policy actor")
    max_attempts = max_attempts_per_task or 2 * episodes_per_task + 2
    available = pool_size(suite, init_pool)
    if available is not None:
        # a suite with few training states (real LIBERO: 25) gives several demonstrations per state only
        # with DART noise: the experts and the physics are deterministic, so repeats would be copies
        if episodes_per_task > available and action_noise == 0 and actor is None:
            raise ValueError(
                f"episodes_per_task={episodes_per_task}: {suite} has {available} training states per "
                "task (the rest of its 50 are held out), one noiseless demonstration each; set "
                "action_noise > 0 (e.g. 0.1) for several per state, each with other noise"
            )
        max_attempts = min(max_attempts, available * -(-episodes_per_task // available))
    n = max(1, min(num_envs, episodes_per_task * len(ids)))
    env = sims.make(
        sims.suites.backend(suite),
        suite=suite,
        num_envs=n,
        seed=seed,
        cameras=tuple(cameras),
        image_size=image_size,
        num_threads=num_threads,
        **({} if actor is None else {"state_obs": actor.state_obs}),
    )
    try:
        if actor is None:
            expert: Any = sims.suites.expert(suite, num_envs=n, gain=expert_gain, env=env)
            if hasattr(expert, "check_tasks"):
                expert.check_tasks(ids)
        else:
            missing = [c for c in actor.cameras if c not in cameras]
            if missing:
                raise ValueError(f"the policy reads cameras {list(actor.cameras)}: record {missing} too")
            actor.bind(env)
            expert = actor
    except Exception:
        env.close()
        raise
    privileged_dim = env.observation_spec["privileged"].shape[0] if "privileged" in env.observation_spec else 0
    writer = DatasetWriter(
        out,
        fps=env.control_hz,
        cameras=cameras,
        image_size=image_size,
        state_names=getattr(env, "state_names", STATE_NAMES),
        action_names=getattr(env, "action_names", ACTION_NAMES),
        privileged_dim=privileged_dim,
        extra_info={
            "suite": suite,
            "task_names": [s.name for s in specs],
            "control_hz": env.control_hz,
            "action_mode": env.action_mode,
            "init_ids_from": pool_init_id(suite, init_pool, 0),
            "init_pool": init_pool,
            "actor": "experts" if actor is None else f"policy ({actor.agent.mode})",
            # a policy reads its views once per chunk: only those frames are rendered, the others hold the
            # last one, and SFT starts samples at those frames alone (embodied.data.training)
            "decision_every": 1 if actor is None else actor.chunk_size,
            "expert_gain": expert_gain,
            "action_noise": action_noise,
        },
    )
    noise_gen = torch.Generator().manual_seed(seed)
    bounds = (env.action_spec.low, env.action_spec.high)
    stats = {t: {"attempts": 0, "successes": 0, "kept": 0} for t in ids}
    next_init = {t: 0 for t in ids}
    total = episodes_per_task * len(ids)
    start = time.perf_counter()

    def pending() -> list[int]:
        """Tasks still needing episodes, with a free attempt."""
        return [t for t in ids if stats[t]["kept"] < episodes_per_task and stats[t]["attempts"] < max_attempts]

    try:
        with tqdm(total=total, desc=f"collect {suite}", unit="ep") as bar:
            while pending():
                # one wave: fill the envs round-robin over tasks that still need episodes; a policy's
                # task by task (a wave of every task's scene holds them all in memory at once)
                wave: list[tuple[int, int]] = []
                queue = pending()
                need = {t: episodes_per_task - stats[t]["kept"] for t in queue}
                while len(wave) < n and any(need.values()):
                    for t in queue:
                        for _ in range(1 if actor is None else max(need[t], 1)):
                            if need[t] > 0 and len(wave) < n and stats[t]["attempts"] < max_attempts:
                                k = next_init[t] if available is None else next_init[t] % available
                                wave.append((t, pool_init_id(suite, init_pool, k)))
                                next_init[t] += 1
                                stats[t]["attempts"] += 1
                                need[t] -= 1
                    if all(stats[t]["attempts"] >= max_attempts for t in queue):
                        break
                count = len(wave)
                task_col = [t for t, _ in wave] + [wave[0][0]] * (n - count)
                init_col = [i for _, i in wave] + [wave[0][1]] * (n - count)
                obs = env.reset(task_ids=task_col, init_ids=init_col)
                expert.reset()
                active = np.zeros(n, bool)
                active[:count] = True
                buffers: list[dict[str, list]] = [
                    {k: [] for k in ("state", "privileged", "action", "reward", "done", "success", "rgb")}
                    for _ in range(n)
                ]
                while active.any():
                    actions = expert.act(obs)
                    executed = actions
                    if action_noise > 0:
                        noise = torch.randn(actions.shape, generator=noise_gen) * action_noise
                        noise[:, -1] = 0.0  # the gripper stays the expert's
                        executed = (actions + noise.to(actions.dtype)).clamp(*bounds)
                    nxt, reward, term, trunc, info = env.step(
                        executed, active=torch.as_tensor(active), render=actor is None or actor.reads_next()
                    )
                    done = info["done"].numpy()
                    for i in np.flatnonzero(active):
                        b = buffers[i]
                        b["state"].append(obs["state"][i].numpy())
                        b["privileged"].append(
                            obs["privileged"][i].numpy() if privileged_dim else np.zeros(0, np.float32)
                        )
                        b["action"].append(actions[i].numpy())
                        b["reward"].append(float(reward[i]))
                        b["done"].append(bool(done[i]))
                        b["success"].append(bool(info["success"][i]))
                        if "rgb" in obs:
                            b["rgb"].append(obs["rgb"][i].numpy())
                    for i in np.flatnonzero(active & done):
                        t, init_id = wave[i]
                        b = buffers[i]
                        ok = any(b["success"])
                        stats[t]["successes"] += int(ok)
                        summary = {
                            "task": t,
                            "name": specs[t].name,
                            "init_id": init_id,
                            "success": ok,
                            "length": len(b["action"]),
                            "diverged": bool(info["diverged"][i]),
                        }
                        if (ok or keep_failures) and stats[t]["kept"] < episodes_per_task:
                            writer.add_episode(
                                Episode(
                                    task_index=t,
                                    instruction=specs[t].instruction,
                                    state=np.stack(b["state"]),
                                    privileged=np.stack(b["privileged"]),
                                    action=np.stack(b["action"]),
                                    reward=np.asarray(b["reward"]),
                                    done=np.asarray(b["done"]),
                                    success=np.asarray(b["success"]),
                                    rgb=np.stack(b["rgb"]) if b["rgb"] else None,
                                    meta={
                                        "suite": suite,
                                        "suite_task_index": t,
                                        "task_name": specs[t].name,
                                        "init_id": init_id,
                                    },
                                )
                            )
                            stats[t]["kept"] += 1
                            bar.update(1)
                        if on_episode is not None:
                            summary["rgb"] = np.stack(b["rgb"]) if b["rgb"] else None
                            on_episode(summary)
                    active &= ~done
                    obs = nxt
    finally:
        env.close()
        root = writer.close()
    tasks = [
        {
            "suite": suite,
            "task": t,
            "name": specs[t].name,
            "instruction": specs[t].instruction,
            "episodes": stats[t]["kept"],
            "attempts": stats[t]["attempts"],
            "success_rate": stats[t]["successes"] / max(stats[t]["attempts"], 1),
        }
        for t in ids
    ]
    return CollectResult(
        suite, tasks, writer.num_episodes, len(writer._rows["index"]), time.perf_counter() - start, root
    )
