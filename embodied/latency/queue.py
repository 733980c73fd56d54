"""A batched action queue indexed by control step (docs/design.md, "Latency").

Every queued action carries the control step it is meant for (its index) and an id (which chunk
and which position in it). Slot ``j`` of the buffer holds the action for step ``now + j`` of each
env. ``pop`` returns the action for ``now`` and advances; ``push`` inserts a chunk whose first
action is meant for step ``start``: actions whose step is already past are dropped (stale), the
ones that overlap queued actions are merged by the queue's rule, the rest are appended. So no
action is executed twice, none after its step has passed, and the order within and across chunks
is the order of their steps.

On a real robot the step of an action is its control period (the robot client counts them); the
action queued in slot ``j`` runs at ``t0 + (now + j) / control_hz``.
"""

from __future__ import annotations

import torch

MERGE_RULES = ("replace", "keep", "blend")


class ActionQueue:
    """Actions ``[N, L, A]`` for steps ``now .. now + L - 1`` of N envs.

    Args:
        num_envs: N.
        action_dim: A.
        merge: how a new chunk meets queued actions for the same steps: ``replace`` (the newer
            plan wins), ``keep`` (the queued actions win, the new chunk only extends the queue) or
            ``blend`` (a linear cross-fade over the overlap, from the old plan to the new one).
    """

    def __init__(self, num_envs: int, action_dim: int, merge: str = "replace"):
        if merge not in MERGE_RULES:
            raise ValueError(f"merge must be one of {MERGE_RULES}, got {merge!r}")
        self.num_envs, self.action_dim, self.merge = num_envs, action_dim, merge
        self.now = 0
        self.actions = torch.zeros(num_envs, 0, action_dim)
        self.valid = torch.zeros(num_envs, 0, dtype=torch.bool)
        self.ids = torch.zeros(num_envs, 0, dtype=torch.long)
        self.dropped = torch.zeros(num_envs, dtype=torch.long)  # stale actions dropped so far
        self._next_chunk = 0

    # ------------------------------------------------------------------ reading
    def remaining(self) -> torch.Tensor:
        """``[N]`` queued actions (for steps ``now`` onward)."""
        return self.valid.sum(1)

    def peek(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``count`` actions ``[N, count, A]`` and their validity ``[N, count]`` (no pop)."""
        self._grow(count)
        return self.actions[:, :count].clone(), self.valid[:, :count].clone()

    # ------------------------------------------------------------------ writing
    def push(self, chunk: torch.Tensor, start: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Queue ``chunk`` ``[N, H, A]`` whose action ``h`` is meant for step ``start + h``.

        Args:
            mask: ``[N]`` envs that take the chunk (default all).

        Returns:
            ``[N]`` how many of its actions were stale (their step already past) and dropped.
        """
        n, h, a = chunk.shape
        if n != self.num_envs or a != self.action_dim:
            raise ValueError(f"chunk must be [{self.num_envs}, H, {self.action_dim}], got {tuple(chunk.shape)}")
        mask = torch.ones(n, dtype=torch.bool) if mask is None else mask.to(torch.bool).cpu()
        chunk = chunk.detach().float().cpu()
        ids = self._next_chunk * 1_000_000 + torch.arange(h).expand(n, h)
        self._next_chunk += 1
        skip = max(self.now - start, 0)  # stale actions at the front
        stale = torch.where(mask, min(skip, h), 0)
        self.dropped += stale
        if skip >= h:
            return stale
        chunk, ids = chunk[:, skip:], ids[:, skip:]
        offset = start + skip - self.now  # slot of the first kept action
        length = chunk.shape[1]
        self._grow(offset + length)
        sl = slice(offset, offset + length)
        old, old_valid = self.actions[:, sl], self.valid[:, sl]
        take_new = mask[:, None].expand(n, length).clone()
        if self.merge == "keep":
            take_new &= ~old_valid
            merged = chunk
        elif self.merge == "blend":
            # weight of the new plan rises linearly over the overlap with valid old actions
            overlap = old_valid.sum(1, keepdim=True).clamp_min(1).float()
            w = ((torch.arange(length)[None, :] + 1).float() / (overlap + 1)).clamp(max=1.0)
            w = torch.where(old_valid, w, torch.ones_like(w))[..., None]
            merged = w * chunk + (1 - w) * old
        else:
            merged = chunk
        self.actions[:, sl] = torch.where(take_new[..., None], merged, old)
        self.ids[:, sl] = torch.where(take_new, ids, self.ids[:, sl])
        self.valid[:, sl] = old_valid | take_new
        return stale

    def pop(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The actions for step ``now`` ``[N, A]``, whether each env had one ``[N]`` and their ids
        ``[N]`` (-1 where none); then ``now`` advances by one step."""
        self._grow(1)
        act, ok, ids = self.actions[:, 0].clone(), self.valid[:, 0].clone(), self.ids[:, 0].clone()
        ids[~ok] = -1
        self.actions, self.valid, self.ids = self.actions[:, 1:], self.valid[:, 1:], self.ids[:, 1:]
        self.now += 1
        return act, ok, ids

    def clear(self, mask: torch.Tensor | None = None) -> None:
        """Forget the queued actions of the envs in ``mask`` (default all), e.g. at an episode end."""
        if mask is None:
            self.valid[:] = False
        else:
            self.valid[mask.to(torch.bool).cpu()] = False

    def _grow(self, length: int) -> None:
        extra = length - self.actions.shape[1]
        if extra > 0:
            n, a = self.num_envs, self.action_dim
            self.actions = torch.cat([self.actions, torch.zeros(n, extra, a)], 1)
            self.valid = torch.cat([self.valid, torch.zeros(n, extra, dtype=torch.bool)], 1)
            self.ids = torch.cat([self.ids, torch.full((n, extra), -1, dtype=torch.long)], 1)
