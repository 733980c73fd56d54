"""Batched chunk rollouts: one RL step = one action chunk for all N envs at once.

No Python loop over environments: the policy samples ``[N, H, A]`` chunks, the VecEnv executes
them with ``step_chunk`` (each env stopping at its own episode end), and everything is stored as
``[T, N, ...]`` tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from embodied.algorithms.critic import CriticInputs, EpisodeClock, step_limits, time_left
from policies.io import env_inputs, indexed_inputs, task_instructions
from sims.core import obs_views

#: the key of the step counts (int64 ``[N]``, steps since each episode began) that
#: :func:`collect_chunks` adds to the observation it returns, so the next call continues the clock
ELAPSED = "elapsed"


@dataclass
class Rollout:
    """``T`` chunks of ``N`` envs. Shapes: ``rgb [T, N, V, H, W, 3]``, ``state [T, N, S]``,
    ``task_id [T, N]``; per chunk ``[T, N]``: ``logprob``, ``value``, ``reward`` (sum over the
    executed steps), ``done``, ``trunc``, ``success``, ``final_value`` (value of the final
    observation where ``trunc``); ``last_value [N]``; ``extras`` as the policy returned them;
    ``critic_obs [T, N, C]`` the separate critic's inputs (None when values come from the policy);
    ``time_left [T, N]`` the fraction of each episode's step limit left at the chunk's start, which
    the policy read as ``obs["time_left"]`` (None: the policy read none)."""

    rgb: torch.Tensor
    state: torch.Tensor
    task_id: torch.Tensor
    extras: dict[str, torch.Tensor]
    logprob: torch.Tensor
    value: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    trunc: torch.Tensor
    success: torch.Tensor
    final_value: torch.Tensor
    last_value: torch.Tensor
    instructions: list[str]
    env_steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_success: list[bool] = field(default_factory=list)
    episode_envs: list[int] = field(default_factory=list)  # the env of each ended episode, in order of ending
    timing: dict[str, float] = field(default_factory=dict)
    critic_obs: torch.Tensor | None = None
    time_left: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.reward.shape)  # type: ignore[return-value]

    def first_episodes(self) -> tuple[list[float], list[int], list[bool]]:
        """``(returns, lengths, successes)`` of each env's first ended episode: the rollouts GRPO scores.
        Every ended episode over-counts short ones (an env that succeeds fast ends several episodes
        in a window where a failing one ends one)."""
        seen: set[int] = set()
        returns, lengths, successes = [], [], []
        for env, ret, length, ok in zip(
            self.episode_envs, self.episode_returns, self.episode_lengths, self.episode_success
        ):
            if env not in seen:
                seen.add(env)
                returns.append(ret)
                lengths.append(length)
                successes.append(ok)
        return returns, lengths, successes

    def policy_obs(self, flat_index: torch.Tensor) -> dict[str, Any]:
        """Observations of flattened ``T * N`` entries, as the policy reads them."""
        time_left = self.time_left.flatten(0, 1)[flat_index] if self.time_left is not None else None
        return indexed_inputs(
            self.rgb.flatten(0, 1)[flat_index],
            self.state.flatten(0, 1)[flat_index],
            self.task_id.flatten(0, 1)[flat_index],
            self.instructions,
            time_left=time_left,
        )

    def flat_extras(self, flat_index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v.flatten(0, 1)[flat_index] for k, v in self.extras.items()}


@torch.no_grad()
def collect_chunks(
    env: Any,
    policy: Any,
    obs: dict[str, torch.Tensor],
    num_chunks: int,
    generator: torch.Generator | None = None,
    critic: CriticInputs | None = None,
) -> tuple[Rollout, dict[str, torch.Tensor]]:
    """Run ``num_chunks`` chunks in every env from ``obs``; returns the rollout and the next obs.

    With ``critic`` the values come from that separate critic (its clock is advanced here, so pass
    the same object on every call that continues the episodes) instead of the policy's value head.

    The policy reads ``obs["time_left"]`` (float ``[N]``, :func:`embodied.algorithms.critic.time_left`): the
    fraction of each episode's step limit (``env.tasks[i].max_steps``; the critic's limits with
    ``critic``) still left, 0 for the final observation of an episode cut at its limit; the rollout
    keeps it (``Rollout.time_left``) so training evaluates the value on the same input. It comes from
    an :class:`~embodied.algorithms.critic.EpisodeClock`: ``critic.clock`` with ``critic``, else one started
    from ``obs["elapsed"]`` (int64 ``[N]`` steps since each episode began; absent: 0, fresh episodes,
    as after ``env.reset``). The returned obs carries ``"elapsed"``, so passing it to the next call
    continues the episodes' clocks.
    """
    instructions = task_instructions(env)
    critic_obs: list[torch.Tensor] = []
    if critic is not None:
        clock, limits = critic.clock, critic.limits
    else:
        clock, limits = EpisodeClock(env.num_envs, obs.get(ELAPSED)), step_limits(env)

    def left(o: dict[str, torch.Tensor], elapsed: torch.Tensor | None = None) -> torch.Tensor:
        return time_left(clock.elapsed if elapsed is None else elapsed, limits, o["task_id"])

    def values(o: dict[str, torch.Tensor], elapsed: torch.Tensor | None = None) -> torch.Tensor:
        if critic is None:
            return policy.value(env_inputs(o, instructions, time_left=left(o, elapsed))).float().cpu()
        return critic.value(critic.features(o, elapsed))

    keys = ("logprob", "value", "reward", "done", "trunc", "success", "final_value")
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    rgb, state, task_id, extras, tlefts = [], [], [], [], []
    env_steps = 0
    returns, lengths, successes, ended_envs = [], [], [], []
    t_infer = t_sim = 0.0
    for _ in range(num_chunks):
        t0 = time.perf_counter()
        tlefts.append(left(obs))
        sample = policy.sample(env_inputs(obs, instructions, time_left=tlefts[-1]), mode="explore", generator=generator)
        t1 = time.perf_counter()
        res = env.step_chunk(sample.actions.to(env.device))
        t2 = time.perf_counter()
        rgb.append(obs_views(obs))
        state.append(obs["state"])
        task_id.append(obs["task_id"])
        extras.append({k: v.cpu() for k, v in sample.extras.items()})
        cols["logprob"].append(sample.logprob.cpu())
        if critic is None:
            cols["value"].append(sample.value.float().cpu())
        else:
            critic_obs.append(critic.features(obs))
            cols["value"].append(critic.value(critic_obs[-1]))
        ended_at = clock.advance(res.executed, res.done)
        cols["reward"].append(res.reward.cpu())
        cols["done"].append(res.done.cpu())
        cols["trunc"].append(res.truncated.cpu())
        cols["success"].append(res.success.cpu())
        final_value = torch.zeros_like(res.reward).cpu()
        if bool(res.truncated.any()):
            rows = res.truncated.nonzero().flatten()
            final = {k: v[rows] for k, v in res.final_obs.items()}
            final_value[rows.cpu()] = values(final, ended_at[rows.cpu()])  # at the limit: no time left
        cols["final_value"].append(final_value)
        env_steps += int(res.executed.sum())
        for i in res.done.nonzero().flatten().tolist():
            returns.append(float(res.episode["return"][i]))
            lengths.append(int(res.episode["length"][i]))
            successes.append(bool(res.success[i]))
            ended_envs.append(i)
        obs = {**res.obs, ELAPSED: clock.elapsed.clone()}
        t3 = time.perf_counter()
        t_infer += (t1 - t0) + (t3 - t2)
        t_sim += t2 - t1
    t0 = time.perf_counter()
    last_value = values(obs)
    t_infer += time.perf_counter() - t0
    stacked_extras = {k: torch.stack([e[k] for e in extras]) for k in extras[0]}
    rollout = Rollout(
        rgb=torch.stack(rgb).cpu(),
        state=torch.stack(state).cpu(),
        task_id=torch.stack(task_id).cpu(),
        extras=stacked_extras,
        **{k: torch.stack(v) for k, v in cols.items()},
        last_value=last_value,
        instructions=instructions,
        env_steps=env_steps,
        episode_returns=returns,
        episode_lengths=lengths,
        episode_success=successes,
        episode_envs=ended_envs,
        timing={"inference_s": t_infer, "sim_s": t_sim},
        critic_obs=torch.stack(critic_obs) if critic_obs else None,
        time_left=torch.stack(tlefts),
    )
    return rollout, obs
