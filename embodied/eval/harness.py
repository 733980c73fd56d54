"""Evaluation on the fixed protocol: every task's fixed initial states, one episode each.

Work is a fixed, ordered list of ``(task, init_id)`` per suite, cut into waves of ``num_envs``
episodes. Each wave resets its envs to those initial states and runs until every env reached
success or its task's step limit (an env stops at its own end; the others go on). The agent's
randomness is seeded per wave from ``(seed, suite, wave)``, so a configuration gives the same
numbers on every run and machine (CPU), and an interrupted run resumes wave by wave: waves whose
episodes are all recorded in ``episodes.jsonl`` are skipped, an unfinished wave is run again
(with the same seed, so it reproduces the episodes it had already recorded).
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from embodied.latency import ChunkExecutor, LatencyConfig
from policies.flow.rtc import rtc_sample
from policies.io import env_inputs, task_instructions


class Agent(Protocol):
    """What the harness drives: a policy (any family) or the scripted experts."""

    cameras: Sequence[str]
    state_obs: str  # what obs["state"] holds (sims.core.STATE_OBS)
    chunk_size: int

    def begin_wave(self, seed: int) -> None: ...

    def act(self, obs: dict[str, torch.Tensor], env: Any) -> torch.Tensor:
        """An action chunk ``[N, H, A]`` for all envs."""

    def episode_done(self, mask: np.ndarray) -> None: ...


class PolicyAgent:
    """A :class:`policies.base.Policy` in greedy (default) or explore mode."""

    def __init__(self, policy: Any, mode: str = "greedy", rtc_beta: float = 5.0):
        if mode not in ("greedy", "explore"):
            raise ValueError(f"mode must be 'greedy' or 'explore', got {mode!r}")
        self.policy = policy.eval()
        self.mode = mode
        self.rtc_beta = rtc_beta
        self.cameras = list(policy.config.cameras)
        self.state_obs = policy.config.state_obs
        self.chunk_size = policy.chunk_size
        self._gen = torch.Generator()

    def begin_wave(self, seed: int) -> None:
        self._gen = torch.Generator(device=self.policy.device).manual_seed(seed)

    def act(self, obs: dict[str, torch.Tensor], env: Any) -> torch.Tensor:
        batch = env_inputs(obs, task_instructions(env))
        with torch.no_grad():
            return self.policy.sample(batch, mode=self.mode, generator=self._gen).actions.cpu()

    def act_rtc(
        self, obs: dict[str, torch.Tensor], env: Any, prev: torch.Tensor, prev_valid: torch.Tensor, frozen: int
    ) -> torch.Tensor:
        """Real-time chunking: a chunk that continues ``prev`` ``[N, L, A]`` (flow policies)."""
        batch = env_inputs(obs, task_instructions(env))
        return rtc_sample(self.policy, batch, prev, prev_valid, frozen, beta=self.rtc_beta, generator=self._gen).cpu()

    def episode_done(self, mask: np.ndarray) -> None:
        pass


class ExpertAgent:
    """The suite's scripted experts (closed loop: chunks of one action)."""

    cameras = ("agentview", "wrist")
    state_obs = "proprio"
    chunk_size = 1

    def __init__(self, suite: str, num_envs: int | None = None):
        import sims

        self.suite = suite
        self.expert: Any = None
        # real LIBERO's experts act on the simulator they are built over: built at the first action
        self._needs_env = sims.suites.is_libero(suite)
        if num_envs is not None and not self._needs_env:
            self._build(num_envs)

    def _build(self, num_envs: int, env: Any = None) -> None:
        import sims

        self.expert = sims.suites.expert(self.suite, num_envs=num_envs, env=env if self._needs_env else None)
        self.num_envs = num_envs

    def begin_wave(self, seed: int) -> None:
        if self.expert is not None:
            self.expert.reset()

    def act(self, obs: dict[str, torch.Tensor], env: Any) -> torch.Tensor:
        # one script per env of the batch actually run (an evaluation shrinks it to the episodes it has)
        n = int(obs["state"].shape[0])
        if self.expert is None or self.num_envs != n or (self._needs_env and self.expert.env is not env):
            self._build(n, env)
        return self.expert(obs)

    def episode_done(self, mask: np.ndarray) -> None:
        if self.expert is not None:
            self.expert.reset(mask)


@dataclass
class EpisodeRecord:
    suite: str
    task: int
    name: str
    init_id: int
    wave: int
    success: bool
    length: int
    diverged: bool
    attempt: int = 0  # which of the state's attempts (``embodied-eval attempts=K``); 0: the protocol's episode

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def wave_seed(seed: int, suite: str, wave: int, attempt: int = 0) -> int:
    """The sampling seed of one wave; attempt 0 keeps the protocol's seeds, later attempts differ."""
    return zlib.crc32(f"{seed}/{suite}/{wave}".encode() + (f"/{attempt}".encode() if attempt else b""))


def work_list(tasks: Sequence[int], episodes: int, first_state: int = 0) -> list[tuple[int, int]]:
    """The fixed order of ``(task, init_id)`` of a suite: initial states ``first_state ..
    first_state + episodes - 1`` of every task."""
    return [(t, i) for t in tasks for i in range(first_state, first_state + episodes)]


def plan_waves(
    suite: str,
    tasks: Sequence[int],
    episodes: int,
    num_envs: int,
    first_state: int,
    attempts: int,
    done: Iterable[EpisodeRecord] = (),
) -> tuple[int, list[list[tuple[int, int]]], dict[tuple[int, int], set[tuple[int, int]]], list[tuple[int, int]]]:
    """``(envs per wave, waves, recorded, todo)`` of one suite: the waves' ``(task, init_id)`` lists,
    the episodes ``done`` holds per ``(attempt, wave)``, and the ``(attempt, wave)`` pairs still to run
    (a wave counts as done only when all its episodes are recorded)."""
    work = work_list(tasks, episodes, first_state)
    n = max(1, min(num_envs, len(work)))
    waves = [work[w : w + n] for w in range(0, len(work), n)]
    recorded: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for r in done:
        if r.suite == suite:
            recorded.setdefault((r.attempt, r.wave), set()).add((r.task, r.init_id))
    todo = [
        (a, w)
        for a in range(attempts)
        for w, items in enumerate(waves)
        if not set(items) <= recorded.get((a, w), set())
    ]
    return n, waves, recorded, todo


def load_records(path: Path) -> list[EpisodeRecord]:
    """Episodes already recorded (a torn last line from a kill is ignored)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(EpisodeRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


#: ``(suite, task, init_id, frames, success, length) -> wants_more``: False stops the filming (no more videos wanted)
FrameSink = Callable[[str, int, int, list[np.ndarray], bool, int], "bool | None"]


def run_suite(
    agent: Agent,
    suite: str,
    *,
    tasks: Sequence[int],
    episodes: int,
    num_envs: int,
    image_size: int,
    seed: int,
    latency: LatencyConfig | None = None,
    done: Iterable[EpisodeRecord] = (),
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    record_frames: bool = False,
    on_frames: FrameSink | None = None,
    progress: Any = None,
    check: Callable[[Any], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    attempts: int = 1,
    first_state: int = 0,
    shard: tuple[int, int] = (0, 1),
    max_steps: int | None = None,
    env_options: dict[str, Any] | None = None,
    env: Any = None,
) -> dict[str, Any]:
    """Run the remaining waves of one suite. Returns ``{"env_steps", "seconds"}`` of this call.

    Args:
        latency: execution mode and inference delay (default: sync, no delay).
        done: records from an interrupted run; their complete waves are skipped.
        on_episode: called for every finished episode (append it to ``episodes.jsonl``).
        record_frames / on_frames: keep each env's frames ``[V, H, W, 3]`` and hand the episode's
            frames to ``on_frames(suite, task, init_id, frames, success, length)`` when it ends
            (attempt 0's episodes only). When ``on_frames`` returns False it wants no more videos:
            the filming stops there, and with it the rendering of every step it needed.
        check: called with the env once built (e.g. the policy's spec check).
        should_stop: polled before every control step; when it returns True the run stops there
            with ``KeyboardInterrupt`` (finished episodes have been handed to ``on_episode``).
        attempts: runs every initial state this many times in the same envs, each attempt with other
            sampling noise (its own wave seeds; records carry the attempt, ``done`` is matched per
            attempt); attempt 0 is the protocol's run.
        first_state: the first initial state of each task (0: the protocol's states; 50: the next
            50, held out from a training run on the protocol's states).
        shard: ``(i, k)``: run only every k-th remaining wave from the i-th (a worker's share, see
            :mod:`embodied.eval.parallel`); a wave's episodes do not depend on who runs it.
        max_steps: a step limit per episode other than the tasks' own (not the protocol's: quick checks).
        env_options: further options of the suite's env for :func:`sims.make` (e.g. a LIBERO suite's
            ``render_faces``).
        env: an env of ``suite`` built already (with ``num_envs`` envs, the tasks' own step limits and
            the agent's cameras and image size) to run in instead of a new one; the caller keeps it (it
            is not closed). An RL env runner scores the greedy policy in its own envs so.
    """
    import sims

    latency = latency or LatencyConfig()
    latency.check(agent.chunk_size)
    specs = sims.suites.tasks(suite)
    n, waves, recorded, todo = plan_waves(suite, tasks, episodes, num_envs, first_state, attempts, done)
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be (i, k) with 0 <= i < k, got {shard}")
    todo = todo[index::count]
    if not todo:
        return {"env_steps": 0, "seconds": 0.0, "latency": {}, "latency_samples": {}}
    limit = {} if max_steps is None else {"max_steps": int(max_steps)}
    owned = env is None
    if owned:
        env = sims.make(
            sims.suites.backend(suite),
            suite=suite,
            num_envs=n,
            seed=seed,
            cameras=tuple(agent.cameras),
            image_size=image_size,
            state_obs=agent.state_obs,
            **limit,
            **(env_options or {}),
        )
    elif env.num_envs != n:
        raise ValueError(f"env= holds {env.num_envs} envs but the waves need {n}: pass num_envs={env.num_envs}")
    if latency.mode == "aware":  # sets latency.max_delay
        policy = getattr(agent, "policy", None)
        policy_state = policy.config.state_dim if policy is not None else env.observation_spec["state"].shape[0]
        seen = aware_view(env, int(policy_state), agent.chunk_size, latency)
    else:
        seen = env
    if check is not None:
        check(seen)
    executor = ChunkExecutor(latency, n, agent.chunk_size, int(env.action_spec.shape[0]), env.control_hz)
    env_steps = held = 0
    start = time.perf_counter()
    try:
        for attempt, w in todo:
            wave = waves[w]
            filming = record_frames and attempt == 0
            k = len(wave)
            padded = wave + [wave[0]] * (n - k)
            obs = env.reset(task_ids=[t for t, _ in padded], init_ids=[i for _, i in padded])
            agent.begin_wave(wave_seed(seed, suite, w, attempt))
            executor.reset()
            active = np.zeros(n, bool)
            active[:k] = True
            success = np.zeros(n, bool)
            frames: list[list[np.ndarray]] = [[] for _ in range(n)]
            if filming:
                for j in range(k):
                    frames[j].append(_frame(env, obs, j))
            while active.any():
                if should_stop is not None and should_stop():
                    raise KeyboardInterrupt
                action, from_chunk = executor.next_action(obs, env, agent)
                # pixels only for the steps whose observation is read: the next chunk request, or a video
                obs, _, _, _, info = env.step(
                    action, active=torch.as_tensor(active), render=filming or executor.reads_observation()
                )
                env_steps += int(active.sum())
                held += int((~from_chunk.numpy() & active).sum())
                ended = info["done"].numpy() & active
                success |= info["success"].numpy() & active
                if filming:
                    for j in np.flatnonzero(active & ~ended if "rgb" not in obs else active):
                        frames[j].append(_frame(env, info["final_obs"], j))
                for j in np.flatnonzero(ended):
                    t, init_id = wave[j]
                    rec = EpisodeRecord(
                        suite,
                        t,
                        specs[t].name,
                        init_id,
                        w,
                        bool(success[j]),
                        int(info["episode"]["length"][j]),
                        bool(info["diverged"][j]),
                        attempt,
                    )
                    if on_episode is not None and (t, init_id) not in recorded.get((attempt, w), set()):
                        on_episode(rec)
                    if filming and on_frames is not None:
                        wants_more = on_frames(suite, t, init_id, frames[j], rec.success, rec.length)
                        frames[j] = []
                        if wants_more is False:  # the sink is full: stop filming (and rendering every step)
                            filming = record_frames = False
                            frames = [[] for _ in range(n)]
                    if progress is not None:
                        progress.update(1)
                if ended.any():
                    agent.episode_done(ended)
                active &= ~ended
    finally:
        if owned:
            env.close()
    return {
        "env_steps": env_steps,
        "seconds": time.perf_counter() - start,
        # every wave resets the executor's request counter; its timing samples hold them all
        "latency": {
            "held_steps": held,
            "requests": len(executor.stats.samples.get("inference", [])),
            **executor.stats.summary(),
        },
        "latency_samples": executor.stats.samples,
    }


def _frame(env: Any, obs: dict[str, torch.Tensor], j: int) -> np.ndarray:
    """Env ``j``'s views ``[V, H, W, 3]`` from ``obs``; without obs cameras (a state-only policy) the
    agentview camera rendered now (so an episode's last frame, taken after its reset, is not shown)."""
    if "rgb" in obs:
        return obs["rgb"][j].numpy()
    return env.render(int(j), "agentview")[None]


def aware_view(env: Any, policy_state_dim: int, chunk_size: int, latency: LatencyConfig) -> Any:
    """The env as a latency-aware policy reading ``policy_state_dim`` state dims sees it (augmented
    state), for its spec check; sets ``latency.max_delay`` from that size."""
    from embodied.latency import max_delay_of
    from embodied.latency.delay_env import DelayedChunkEnv

    s, a = int(env.observation_spec["state"].shape[0]), int(env.action_spec.shape[0])
    max_delay = max_delay_of(policy_state_dim, s, a)
    if max_delay is None:
        raise ValueError(
            f"execution=aware needs a policy trained with latency-aware RL (state of {s} + "
            f"max_delay * {a} + 1 dims); this policy reads {policy_state_dim}"
        )
    if latency.max_delay is None:
        latency.max_delay = max_delay
    if latency.delay > latency.max_delay:
        raise ValueError(f"delay {latency.delay} exceeds the policy's max_delay {latency.max_delay}")
    return DelayedChunkEnv(env, chunk_size, [latency.max_delay])
