"""``ChunkPPOLearner``: an RLlib ``TorchLearner`` whose loss is the chunk PPO loss of
:mod:`embodied.algorithms.loss` (Flow-SDE / Flow-Noise log-probabilities for flow VLAs, token log-prob sums
for token VLAs; GRPO is the same loss without the critic)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from embodied.algorithms.loss import chunk_ppo_loss
from embodied.algorithms.params import split_parameters
from embodied.algorithms.update import MAX_KEYS, STAT_KEYS

__all__ = ["ChunkPPOLearner", "load_keeping_lr", "split_parameters"]


def load_keeping_lr(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)`` without the saved learning rates: torch restores each
    group's saved ``lr``, which RLlib's schedule only overwrites after the first update, so a run
    continued at another ``algo.lr`` would take its first update at the old one."""
    rates = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, lr in zip(optimizer.param_groups, rates):
        group["lr"] = lr


class ChunkPPOLearner(TorchLearner):
    """Two optimizers (actor at ``config.update.lr``, critic at ``config.update.critic_lr``; the actor's
    parameters as ``config.update.freeze_prefix`` says), global-norm gradient clipping at
    ``config.update.max_grad_norm`` (by RLlib, as its ``grad_clip``), the train forward's numerics of
    ``config.update.precision`` and ``config.update.compile``, the loss of ``config.loss``: the
    typed configs of :class:`~embodied.rllib.algorithm.ChunkRLConfig`. Per-minibatch statistics are
    kept until :meth:`pop_stats`."""

    def build(self) -> None:
        self._stats: dict[str, list[float]] = {k: [] for k in STAT_KEYS + MAX_KEYS}
        self._actor_frozen = False
        self._actor_refs: dict[Any, None] = {}  # ordered: the weights' undo copies follow it
        # actor weights before each of the last two actor steps (kept only with rollback enabled)
        self._before_steps: deque[list[torch.Tensor]] = deque(maxlen=2)
        self._keep_undo = False
        # the actor's gradient of the iteration's first minibatch, until the second one's is compared with it
        self._first_grad: torch.Tensor | None = None
        self._grad_cos: float | None = None  # their cosine, until pop_stats reports it
        self._grad_compared = False
        super().build()

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        update = config.update
        actor, critic = split_parameters(self._module[module_id], freeze_prefix=update.freeze_prefix)
        # after the freeze: its frozen weights are what the precision may hold in bfloat16
        self._module[module_id].unwrapped().train_with(update.precision, compile=update.compile)
        self._actor_refs.update(dict.fromkeys(self.get_param_ref(p) for p in actor))
        self.register_optimizer(
            module_id=module_id,
            optimizer_name="actor",
            optimizer=torch.optim.AdamW(actor, weight_decay=0.0),
            params=actor,
            lr_or_lr_schedule=update.lr,
        )
        if critic and config.loss.use_critic:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name="critic",
                optimizer=torch.optim.AdamW(critic, weight_decay=0.0),
                params=critic,
                lr_or_lr_schedule=update.critic_lr or 0.0,
            )

    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        policy = self.module[module_id].unwrapped().policy
        loss, st = chunk_ppo_loss(
            fwd_out["logprob"],
            fwd_out["entropy"],
            fwd_out["value"],
            batch,
            config.loss,
            action_dims=policy.chunk_size * policy.action_dim,
        )
        for k in STAT_KEYS + MAX_KEYS:
            self._stats[k].append(getattr(st, k))
        return loss

    def set_actor_frozen(self, frozen: bool) -> None:
        """Critic warm-up: while frozen only the value head steps (the actor's gradients, including
        those the value loss sends into the shared observation encoder, are dropped)."""
        self._actor_frozen = bool(frozen)

    def compute_gradients(self, loss_per_module: dict[str, Any], **kwargs: Any) -> dict[Any, Any]:
        grads = super().compute_gradients(loss_per_module, **kwargs)
        if self._actor_frozen:  # the optimizer steps on p.grad, so clearing the dict's entry is not enough
            for ref in self._actor_refs:
                self._params[ref].grad = None
            grads = {ref: g for ref, g in grads.items() if ref not in self._actor_refs}
        else:
            self._compare_gradient(grads)
            if self._keep_undo:  # the weights this step starts from, before the optimizer moves them
                self._before_steps.append([self._params[ref].detach().clone() for ref in self._actor_refs])
        return grads

    def _compare_gradient(self, grads: dict[Any, torch.Tensor]) -> None:
        """Keep the actor's raw gradient of an iteration's first minibatch; at the second, its cosine with
        that one (:func:`embodied.algorithms.update.gradient_noise_scale` reads the noise in it)."""
        if self._grad_compared or not any(grads.get(ref) is not None for ref in self._actor_refs):
            return
        # a parameter the loss did not reach (no gradient) counts as zeros, so both vectors line up
        flat = torch.cat(
            [
                grads[ref].detach().flatten()
                if grads.get(ref) is not None
                else self._params[ref].new_zeros(self._params[ref].numel())
                for ref in self._actor_refs
            ]
        )
        if self._first_grad is None:
            self._first_grad = flat
            return
        self._grad_cos = float(torch.nn.functional.cosine_similarity(self._first_grad, flat, dim=0))
        self._first_grad, self._grad_compared = None, True

    def keep_undo(self, enabled: bool) -> None:
        """Start an iteration's update: with ``enabled`` keep the actor's weights before each of its next
        steps, so that :meth:`undo_actor_steps` can take the last two back; the gradients of its first two
        minibatches are compared anew (``grad_cos`` in :meth:`pop_stats`)."""
        self._keep_undo = bool(enabled)
        self._before_steps.clear()
        self._first_grad, self._grad_cos, self._grad_compared = None, None, False

    def keep_prefix_tokens(self, enabled: bool) -> None:
        """Start an iteration's update: with ``enabled`` each row's frozen prefix tokens are computed once
        and reused by later epochs (see :meth:`embodied.rllib.module.PolicyRLModule.keep_prefix_tokens`)."""
        for module_id in self.module.keys():
            module = self.module[module_id].unwrapped()
            if hasattr(module, "keep_prefix_tokens"):
                module.keep_prefix_tokens(enabled)

    def undo_actor_steps(self) -> int:
        """Put the actor back to its weights before the last two steps of this iteration (or before the
        only one); returns how many steps were undone. The optimizers' moments keep those steps'
        gradients: only the weights go back."""
        if not self._before_steps:
            return 0
        undone = len(self._before_steps)
        with torch.no_grad():
            for ref, weights in zip(self._actor_refs, self._before_steps[0]):
                self._params[ref].copy_(weights)
        self._before_steps.clear()
        return undone

    def pop_stats(self) -> dict[str, float]:
        """Means of the statistics since the last call (0 where no minibatch ran)."""
        out = {k: float(np.mean(v)) if v else 0.0 for k, v in self._stats.items()}
        out["minibatches"] = float(len(self._stats["approx_kl"]))
        if self._grad_cos is not None:  # reported once, by the minibatch that measured it
            out["grad_cos"], self._grad_cos = self._grad_cos, None
        self._stats = {k: [] for k in STAT_KEYS + MAX_KEYS}
        return out

    def optimizer_states(self) -> dict[str, dict[str, Any]]:
        """``{name: torch optimizer state_dict}`` of this learner's optimizers (for checkpoints)."""
        return {name: opt.state_dict() for name, opt in self._named_optimizers.items()}

    def load_optimizer_states(self, states: dict[str, dict[str, Any]]) -> None:
        """Load saved optimizer states, keeping the learning rates this learner was configured with."""
        for name, state in states.items():
            load_keeping_lr(self._named_optimizers[name], state)

    def policy_state(self, module_id: str) -> dict[str, torch.Tensor]:
        return self._module[module_id].policy_state()

    def load_policy_state(self, module_id: str, state: dict[str, torch.Tensor]) -> None:
        self._module[module_id].policy.load_state_dict(state)

    def critic_state(self, module_id: str) -> dict[str, torch.Tensor]:
        return self._module[module_id].critic_state()

    def load_critic_state(self, module_id: str, state: dict[str, torch.Tensor]) -> None:
        critic = self._module[module_id].critic
        if critic is None:
            raise ValueError("this module has no separate critic to load weights into")
        critic.load_state_dict(state)

    def update_critic_norm(self, module_id: str, features: torch.Tensor) -> None:
        """Fold a training batch's critic inputs ``[B, C]`` into the critic's input statistics (before
        the update, identically on every learner, so data-parallel copies stay equal)."""
        critic = self._module[module_id].critic
        if critic is not None:
            critic.norm.update(torch.as_tensor(features))

    def seed_update(self, seed: int) -> None:
        """Seed this learner process's global torch / numpy RNGs before an iteration's update, from the run
        seed and the iteration (:meth:`ChunkRL.training_step`), so that whatever draws from them during
        the update (and, with the local learner, in the driver after it) is the same in a resumed run.
        The minibatch shuffle does not use them: it has its own generator, seeded the same way."""
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
