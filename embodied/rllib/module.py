"""``PolicyRLModule``: any :class:`policies.base.Policy` as an RLlib ``TorchRLModule``.

The module is built from a JSON-able ``model_config`` (the policy family, its config, the
processor's dataset statistics and the task instructions), so remote env runners and learners
build it on their own node; weights travel through RLlib's state sync, never as pickled modules.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.rl_module.torch import TorchRLModule

from embodied.algorithms.batch import ROW
from embodied.algorithms.critic import build_critic
from embodied.algorithms.loss import policy_extras, policy_obs
from policies.precision import lookup as lookup_precision


def module_config(policy: Any, instructions: list[str], critic: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``model_config`` that rebuilds ``policy``'s architecture in another process; ``critic``
    (``{"kind": "privileged", "input_dim", "hidden"}``) adds a separate critic (:mod:`embodied.algorithms.critic`)."""
    return {
        "family": policy.family,
        "policy_config": policy.config.to_dict(),
        "stats": policy.processor.stats,
        "instructions": list(instructions),
        "critic": critic,
    }


def build_policy(model_config: dict[str, Any]) -> Any:
    """A fresh policy (random weights, the bundle's statistics) from :func:`module_config`'s dict."""
    from policies import policy_class

    cls = policy_class(model_config["family"])
    policy = cls(cls.config_class.from_dict(dict(model_config["policy_config"])))
    if model_config.get("stats"):
        policy.processor.set_stats(model_config["stats"])
    return policy


class PolicyRLModule(TorchRLModule):
    """Batches are dicts of columns (see :mod:`embodied.algorithms.batch`): ``rgb [B, V, H, W, 3]``,
    ``state [B, S]``, ``task_id [B]`` and the policy's sampling extras ``x.<name>``.

    Forward passes: exploration/inference sample a chunk (``actions [B, H, A]``, ``action_logp [B]``,
    ``vf_preds [B]``, ``x.*``); train evaluates the stored chunks (``logprob``, ``entropy``, ``value``
    ``[B]``). With a separate critic (``self.critic``) values come from it and the batch's
    ``critic_obs [B, C]`` column; the policy's value head is then unused.
    """

    def setup(self) -> None:
        self.policy = build_policy(self.model_config)
        self.instructions = list(self.model_config["instructions"])
        self.critic = build_critic(self.model_config.get("critic"))
        # row -> its prefix tokens [T_i, d], for the batch being trained on (None: not kept)
        self._prefix_rows: dict[int, torch.Tensor] | None = None
        self._precision = lookup_precision("fp32")  # the train forward's numerics (train_with)

    def train_with(self, precision: str, compile: bool = False) -> list[str]:
        """A learner's numerics (:class:`~embodied.algorithms.update.UpdateConfig`'s ``precision`` and
        ``compile``): train passes run under the precision's autocast, the frozen weights are held in its
        frozen dtype (call it after the parameters are frozen), and with ``compile`` the policy's heavy
        submodules are compiled; returns their names (none where torch.compile cannot run, with a warning)."""
        from policies.precision import compile_policy

        self._precision = lookup_precision(precision)
        self._precision.cast_frozen(self)
        return compile_policy(self.policy) if compile else []

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # RLlib's state is numpy arrays, which have no bfloat16: weights held in it travel as float32
        with self._precision.full_weights(self):
            return super().get_state(*args, **kwargs)

    def keep_prefix_tokens(self, enabled: bool = True) -> None:
        """Start a new training batch: with ``enabled`` (and a frozen encoder, see
        :attr:`policies.base.Policy.frozen_prefix`) train passes encode each row of the batch once
        (minibatches carry the rows' indices, :data:`~embodied.algorithms.batch.ROW`) and reuse its tokens
        in later epochs; they are the same tokens, since no encoder weight moves during the update."""
        self._prefix_rows = {} if enabled else None

    def _encoded(self, batch: dict[str, Any], obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The minibatch's prefix tokens from the rows kept, encoding (without gradients) the minibatch
        once when a row is new; None when not keeping them."""
        if self._prefix_rows is None or ROW not in batch or not self.policy.frozen_prefix:
            return None
        from policies.encoders.prefix import PrefixEncoder

        rows = [int(r) for r in batch[ROW]]
        if any(r not in self._prefix_rows for r in rows):
            with torch.no_grad():
                tokens, pad = self.policy.encode(obs)
            self._prefix_rows.update(zip(rows, PrefixEncoder.split_rows(tokens, pad)))
            return tokens, pad
        return PrefixEncoder.stack_rows([self._prefix_rows[r] for r in rows])

    def _sample(self, batch: dict[str, Any], mode: str) -> dict[str, Any]:
        sample = self.policy.sample(policy_obs(batch, self.instructions), mode=mode)
        value = self.critic(batch["critic_obs"]) if self.critic is not None and "critic_obs" in batch else sample.value
        out = {"actions": sample.actions, "action_logp": sample.logprob, "vf_preds": value}
        out.update({"x." + k: v for k, v in sample.extras.items()})
        return out

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        with torch.no_grad():
            return self._sample(batch, "greedy")

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        with torch.no_grad():
            return self._sample(batch, "explore")

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        from policies.base import ENCODED

        obs = policy_obs(batch, self.instructions)
        with self._precision.autocast(self.policy.device):
            encoded = self._encoded(batch, obs)
            if encoded is not None:
                obs[ENCODED] = encoded
            logprob, entropy, value = self.policy.logprob(obs, policy_extras(batch))
            if self.critic is not None:
                value = self.critic(batch["critic_obs"])
        # the loss in float32, whatever the forward's precision
        return {"logprob": logprob.float(), "entropy": entropy.float(), "value": value.float()}

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._sample(batch, "greedy")

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The wrapped policy's ``state_dict`` (for saving a bundle), every weight in float32."""
        with self._precision.full_weights(self.policy):
            return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def critic_state(self) -> dict[str, torch.Tensor]:
        """The separate critic's ``state_dict`` (empty without one)."""
        if self.critic is None:
            return {}
        return {k: v.detach().cpu() for k, v in self.critic.state_dict().items()}
