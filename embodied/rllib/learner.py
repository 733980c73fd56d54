"""``ChunkPPOLearner``: an RLlib ``TorchLearner`` whose loss is the chunk PPO loss of
:mod:`embodied.rl.loss` (Flow-SDE / Flow-Noise log-probabilities for flow VLAs, token log-prob sums
for token VLAs; GRPO is the same loss without the critic)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from embodied.rl.loss import LossConfig, chunk_ppo_loss

STAT_KEYS = ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl")


def split_parameters(module: torch.nn.Module, freeze_prefix: bool = False
                     ) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """``(actor, critic)`` parameters: the critic is the policy's value head (``value_mlp``). With
    ``freeze_prefix`` the observation encoder (``prefix``: vision, language, state, fusion) is left
    out of both and stops requiring gradients."""
    actor, critic = [], []
    for name, p in module.named_parameters():
        if freeze_prefix and ".prefix." in f".{name}":
            p.requires_grad_(False)
            continue
        (critic if ".value_mlp." in f".{name}" else actor).append(p)
    return actor, critic


class ChunkPPOLearner(TorchLearner):
    """Two optimizers (actor at ``config.lr``, critic at ``config.critic_lr``), global-norm gradient
    clipping from ``config.grad_clip``; per-minibatch statistics kept until :meth:`pop_stats`."""

    def build(self) -> None:
        self._stats: dict[str, list[float]] = {k: [] for k in STAT_KEYS}
        super().build()

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        actor, critic = split_parameters(self._module[module_id], freeze_prefix=config.freeze_prefix)
        self.register_optimizer(module_id=module_id, optimizer_name="actor",
                                optimizer=torch.optim.AdamW(actor, weight_decay=0.0), params=actor,
                                lr_or_lr_schedule=config.lr)
        if critic and config.use_critic:
            self.register_optimizer(module_id=module_id, optimizer_name="critic",
                                    optimizer=torch.optim.AdamW(critic, weight_decay=0.0), params=critic,
                                    lr_or_lr_schedule=config.critic_lr)

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, torch.Tensor]) -> torch.Tensor:
        cfg = LossConfig(clip=config.clip_param, dual_clip=config.dual_clip, value_clip=config.vf_clip_param,
                         vf_coef=config.vf_loss_coeff, ent_coef=config.entropy_coeff, kl_coef=config.kl_coeff,
                         use_critic=config.use_critic, logprob_scale=config.logprob_scale)
        loss, st = chunk_ppo_loss(fwd_out["logprob"], fwd_out["entropy"], fwd_out["value"], batch, cfg)
        for k in STAT_KEYS:
            self._stats[k].append(getattr(st, k))
        return loss

    def pop_stats(self) -> dict[str, float]:
        """Means of the statistics since the last call (0 where no minibatch ran)."""
        out = {k: float(np.mean(v)) if v else 0.0 for k, v in self._stats.items()}
        out["minibatches"] = float(len(self._stats["approx_kl"]))
        self._stats = {k: [] for k in STAT_KEYS}
        return out

    def optimizer_states(self) -> dict[str, dict[str, Any]]:
        """``{name: torch optimizer state_dict}`` of this learner's optimizers (for checkpoints)."""
        return {name: opt.state_dict() for name, opt in self._named_optimizers.items()}

    def load_optimizer_states(self, states: dict[str, dict[str, Any]]) -> None:
        for name, state in states.items():
            self._named_optimizers[name].load_state_dict(state)

    def policy_state(self, module_id: str) -> dict[str, torch.Tensor]:
        return self._module[module_id].policy_state()

    def load_policy_state(self, module_id: str, state: dict[str, torch.Tensor]) -> None:
        self._module[module_id].policy.load_state_dict(state)

    def seed_update(self, seed: int) -> None:
        """Seed the minibatch shuffling of the next update (reproducible resumes)."""
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
