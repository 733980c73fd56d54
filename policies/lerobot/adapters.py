"""What differs between LeRobot's pi0, pi0.5 and SmolVLA, behind one small interface.

Each adapter knows its LeRobot classes, how to build LeRobot's config from ours, which of the
model's submodules is the VLM (frozen by ``train_expert_only`` and by RL's ``freeze_prefix``), and
the three pieces the policy drives: the prefix (VLM forward with its KV cache, once per chunk), the
velocity of the action expert at ``(x_t, t)`` from that cache, and the flow-matching losses of a
training batch. Everything runs LeRobot's own methods; nothing of their maths is re-implemented.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from policies.lerobot.configuration_lerobot import LeRobotVLAConfig

OBS_STATE = "observation.state"
OBS_TOKENS = "observation.language.tokens"
OBS_TOKEN_MASK = "observation.language.attention_mask"
ACTION = "action"


def _attr(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class Prefix:
    """The VLM's pass over one batch of observations, reused by every denoising step.

    Attributes:
        pad: ``[N, T]`` prefix padding mask (True = a real token).
        kv: the VLM's KV cache of the prefix.
        hidden: ``[N, T, W]`` the VLM's last hidden states (the value head's features).
        state: ``[N, max_state_dim]`` the padded, normalised state (pi0's suffix reads it).
    """

    pad: torch.Tensor
    kv: Any
    hidden: torch.Tensor
    state: torch.Tensor

    def pooled(self) -> torch.Tensor:
        """``[N, W]``: the mean of the hidden states over real tokens."""
        m = self.pad.to(self.hidden.dtype)[..., None]
        return (self.hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class Adapter:
    """One LeRobot VLA type (see the module docstring)."""

    lerobot_type: ClassVar[str] = ""
    policy_path: ClassVar[str] = ""
    config_path: ClassVar[str] = ""
    #: the VLM's submodule name (a dotted parameter name containing ``.<name>.`` belongs to it)
    vlm_module: ClassVar[str] = ""
    #: appended to every instruction before tokenising (PaliGemma's prompts end with a newline)
    text_suffix: ClassVar[str] = ""

    #: True where the prompt holds the (discretised) state: tokens are then made per observation
    prompt_has_state: ClassVar[bool] = False

    def prompts(self, texts: list[str], state: torch.Tensor) -> list[str]:
        """The text each instruction is tokenised as (``state``: the normalised ``[N, S]``)."""
        return [t + self.text_suffix for t in texts]

    def policy_class(self) -> Any:
        return _attr(self.policy_path)

    def config_class(self) -> Any:
        return _attr(self.config_path)

    def lerobot_config(self, cfg: LeRobotVLAConfig) -> Any:
        """LeRobot's config of a policy with our config ``cfg``."""
        from lerobot.configs.types import FeatureType, PolicyFeature

        s = cfg.image_size
        features = {key: PolicyFeature(FeatureType.VISUAL, (3, s, s)) for key in cfg.image_keys()}
        features[OBS_STATE] = PolicyFeature(FeatureType.STATE, (cfg.state_dim,))
        kwargs = dict(
            self.derived_fields(cfg),
            chunk_size=cfg.chunk_size,
            n_action_steps=cfg.chunk_size,
            tokenizer_max_length=cfg.tokenizer_max_length,
            train_expert_only=cfg.train_expert_only,
            freeze_vision_encoder=cfg.freeze_vision_encoder,
            device="cpu",
            input_features=features,
            output_features={ACTION: PolicyFeature(FeatureType.ACTION, (cfg.action_dim,))},
        )
        kwargs.update(cfg.lerobot_config)
        return self.config_class()(**kwargs)

    def derived_fields(self, cfg: LeRobotVLAConfig) -> dict[str, Any]:
        raise NotImplementedError

    def max_action_dim(self, policy: Any) -> int:
        return int(policy.config.max_action_dim)

    def prefix(self, policy: Any, batch: dict[str, Any]) -> Prefix:
        raise NotImplementedError

    def velocity(self, policy: Any, prefix: Prefix, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``[N, H, max_action_dim]`` velocity of the action expert at ``x_t`` and times ``t [N]``."""
        raise NotImplementedError

    def flow_losses(
        self, policy: Any, batch: dict[str, Any], actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """``[N, H, max_action_dim]`` squared velocity errors of LeRobot's training forward."""
        raise NotImplementedError


class Pi0Adapter(Adapter):
    lerobot_type = "pi0"
    policy_path = "lerobot.policies.pi0.modeling_pi0:PI0Policy"
    config_path = "lerobot.policies.pi0.configuration_pi0:PI0Config"
    vlm_module = "paligemma"
    text_suffix = "\n"
    modeling = "lerobot.policies.pi0.modeling_pi0"

    def derived_fields(self, cfg: LeRobotVLAConfig) -> dict[str, Any]:
        return {"num_inference_steps": cfg.num_steps, "image_resolution": (cfg.image_size, cfg.image_size)}

    def _inputs(self, policy: Any, batch: dict[str, Any]) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
        images, img_masks = policy._preprocess_images(batch)
        return images, img_masks, batch[OBS_TOKENS], batch[OBS_TOKEN_MASK]

    def prefix(self, policy: Any, batch: dict[str, Any]) -> Prefix:
        mod = importlib.import_module(self.modeling)
        model = policy.model
        images, img_masks, tokens, masks = self._inputs(policy, batch)
        embs, pad, att = model.embed_prefix(images, img_masks, tokens, masks)
        att_2d = mod.make_att_2d_masks(pad, att)
        positions = torch.cumsum(pad, dim=1) - 1
        model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
        (hidden, _), kv = model.paligemma_with_expert.forward(
            attention_mask=mod.prepare_attention_masks_4d(att_2d),
            position_ids=positions,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=True,
        )
        return Prefix(pad=pad, kv=kv, hidden=hidden, state=self.suffix_state(policy, batch))

    def suffix_state(self, policy: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The state the expert's suffix reads: pi0's padded, normalised state."""
        return policy.prepare_state(batch)

    def velocity(self, policy: Any, prefix: Prefix, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return policy.model.denoise_step(prefix.state, prefix.pad, prefix.kv, x_t, t)

    def flow_losses(
        self, policy: Any, batch: dict[str, Any], actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        images, img_masks, tokens, masks = self._inputs(policy, batch)
        return policy.model.forward(images, img_masks, tokens, masks, policy.prepare_state(batch), actions, noise, time)


class Pi05Adapter(Pi0Adapter):
    """pi0.5: the normalised state (quantiles, in [-1, 1]) discretised into 256 bins in the prompt
    (openpi's ``PaligemmaTokenizer``, LeRobot's ``Pi05PrepareStateTokenizerProcessorStep``), no state
    in the suffix, adaRMS time conditioning inside the expert."""

    lerobot_type = "pi05"
    policy_path = "lerobot.policies.pi05.modeling_pi05:PI05Policy"
    config_path = "lerobot.policies.pi05.configuration_pi05:PI05Config"
    modeling = "lerobot.policies.pi05.modeling_pi05"
    text_suffix = ""
    prompt_has_state = True

    def prompts(self, texts: list[str], state: torch.Tensor) -> list[str]:
        import numpy as np

        bins = np.digitize(state.detach().cpu().numpy(), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        out = []
        for text, row in zip(texts, bins):
            cleaned = text.strip().replace("_", " ").replace("\n", " ")
            out.append(f"Task: {cleaned}, State: {' '.join(map(str, row))};\nAction: ")
        return out

    def suffix_state(self, policy: Any, batch: dict[str, Any]) -> torch.Tensor:
        return batch[OBS_STATE]  # in the prompt, not in the suffix: kept for the value head only

    def velocity(self, policy: Any, prefix: Prefix, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return policy.model.denoise_step(prefix.pad, prefix.kv, x_t, t)

    def flow_losses(
        self, policy: Any, batch: dict[str, Any], actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        images, img_masks, tokens, masks = self._inputs(policy, batch)
        return policy.model.forward(images, img_masks, tokens, masks, actions, noise, time)


class SmolVLAAdapter(Adapter):
    lerobot_type = "smolvla"
    policy_path = "lerobot.policies.smolvla.modeling_smolvla:SmolVLAPolicy"
    config_path = "lerobot.policies.smolvla.configuration_smolvla:SmolVLAConfig"
    vlm_module = "vlm"
    text_suffix = "\n"
    modeling = "lerobot.policies.smolvla.modeling_smolvla"

    def derived_fields(self, cfg: LeRobotVLAConfig) -> dict[str, Any]:
        s = cfg.image_size
        return {"num_steps": cfg.num_steps, "resize_imgs_with_padding": (s, s)}

    def _inputs(self, policy: Any, batch: dict[str, Any]) -> tuple[Any, Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        images, img_masks = policy.prepare_images(batch)
        return images, img_masks, batch[OBS_TOKENS], batch[OBS_TOKEN_MASK], policy.prepare_state(batch)

    def prefix(self, policy: Any, batch: dict[str, Any]) -> Prefix:
        mod = importlib.import_module(self.modeling)
        model = policy.model
        images, img_masks, tokens, masks, state = self._inputs(policy, batch)
        embs, pad, att = model.embed_prefix(images, img_masks, tokens, masks, state=state)
        att_2d = mod.make_att_2d_masks(pad, att)
        positions = torch.cumsum(pad, dim=1) - 1
        (hidden, _), kv = model.vlm_with_expert.forward(
            attention_mask=att_2d,
            position_ids=positions,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=model.config.use_cache,
        )
        return Prefix(pad=pad, kv=kv, hidden=hidden, state=state)

    def velocity(self, policy: Any, prefix: Prefix, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return policy.model.denoise_step(prefix.pad, prefix.kv, x_t, t)

    def flow_losses(
        self, policy: Any, batch: dict[str, Any], actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        images, img_masks, tokens, masks, state = self._inputs(policy, batch)
        return policy.model.forward(images, img_masks, tokens, masks, state, actions, noise, time)


ADAPTERS: dict[str, Adapter] = {a.lerobot_type: a for a in (Pi0Adapter(), Pi05Adapter(), SmolVLAAdapter())}


def adapter(lerobot_type: str) -> Adapter:
    if lerobot_type not in ADAPTERS:
        raise ValueError(f"no LeRobot adapter for {lerobot_type!r}; known: {sorted(ADAPTERS)}")
    return ADAPTERS[lerobot_type]
