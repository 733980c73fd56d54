"""Latency-aware RL (ARLI): a VecEnv wrapper where a chunk acts d control steps after its observation.

One RL step (``step_chunk``) covers H control steps: first the d actions committed by the previous
chunk (they execute while the new one is computed), then the first H - d actions of the new chunk;
its last d actions become the committed ones of the next step. The observation handed to the
policy is the one taken when inference starts, with its state augmented by the committed actions
and d (:func:`embodied.latency.augment.augment_state`), so the decision stays Markovian.

d is drawn per env and episode from ``delays`` (domain randomisation over the delays the policy
will meet); at an episode start the committed actions are "hold still, gripper open".
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from embodied.latency.augment import augment_state, augmented_state_dim
from embodied.latency.executor import GRIPPER_OPEN
from sims.core import ChunkResult, Spec, step_chunk


class DelayedChunkEnv:
    """Wraps a :class:`sims.core.VecEnv`; the chunk size is fixed by the policy (``chunk_size``)."""

    def __init__(self, env: Any, chunk_size: int, delays: Sequence[int], seed: int = 0):
        delays = [int(d) for d in delays]
        if not delays or min(delays) < 0 or max(delays) >= chunk_size:
            raise ValueError(f"latency delays must be in 0..{chunk_size - 1} (below the chunk size), got {delays}")
        if getattr(env, "action_mode", "ee_delta") != "ee_delta":
            raise ValueError("latency-aware RL holds still with zero end-effector deltas: use action_mode=ee_delta")
        self.env, self.h, self.delays, self.max_delay = env, chunk_size, delays, max(delays)
        self.a = int(env.action_spec.shape[0])
        self.n = env.num_envs
        self._rng = np.random.default_rng(seed)
        self.delay = torch.zeros(self.n, dtype=torch.long)
        self.committed = torch.zeros(self.n, max(self.max_delay, 1), self.a)
        spec = env.observation_spec["state"]
        self.observation_spec = dict(env.observation_spec)
        self.observation_spec["state"] = Spec(
            (augmented_state_dim(spec.shape[0], self.a, self.max_delay),),
            spec.dtype,
            doc="state + committed actions + d / max_delay",
        )

    def __getattr__(self, name: str) -> Any:  # num_envs, device, tasks, control_hz, cameras, action_spec, ...
        return getattr(self.env, name)

    def _new_episodes(self, mask: torch.Tensor) -> None:
        ids = mask.nonzero().flatten()
        if len(ids):
            self.delay[ids] = torch.as_tensor(self._rng.choice(self.delays, size=len(ids)), dtype=torch.long)
            self.committed[ids] = 0.0
            self.committed[ids, :, -1] = GRIPPER_OPEN

    def _augment(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(obs)
        out["state"] = augment_state(obs["state"], self.committed, self.delay.to(obs["state"].device), self.max_delay)
        return out

    def reset(self, **kwargs: Any) -> dict[str, torch.Tensor]:
        obs = self.env.reset(**kwargs)
        self._new_episodes(torch.ones(self.n, dtype=torch.bool))
        return self._augment(obs)

    def step_chunk(self, actions: torch.Tensor) -> ChunkResult:
        """Execute the committed actions, then the new chunk ``[N, H, A]``'s first H - d."""
        if actions.ndim != 3 or tuple(actions.shape[1:]) != (self.h, self.a):
            raise ValueError(f"expected chunks [N, {self.h}, {self.a}], got {tuple(actions.shape)}")
        acts = actions.detach().float().cpu()
        i = torch.arange(self.h)[None, :]
        d = self.delay[:, None]
        from_committed = i < d
        c_idx = i.clamp(max=self.committed.shape[1] - 1).expand(self.n, -1)
        n_idx = (i - d).clamp(min=0)
        plan = torch.where(
            from_committed[..., None],
            torch.gather(self.committed, 1, c_idx[..., None].expand(-1, -1, self.a)),
            torch.gather(acts, 1, n_idx[..., None].expand(-1, -1, self.a)),
        )
        res = step_chunk(self.env, plan.to(self.env.device))
        # the new chunk's last d actions are committed for the next step: index H - d + j
        j = torch.arange(self.committed.shape[1])[None, :]
        src = (self.h - d + j).clamp(max=self.h - 1)
        self.committed = torch.gather(acts, 1, src[..., None].expand(-1, -1, self.a))
        final_obs = self._augment(res.final_obs)  # the committed actions at the episode's end
        done = res.done.cpu()
        self._new_episodes(done)
        return ChunkResult(
            self._augment(res.obs),
            res.reward,
            res.terminated,
            res.truncated,
            res.step_done,
            res.executed,
            res.success,
            final_obs,
            res.episode,
        )

    def close(self) -> None:
        self.env.close()
