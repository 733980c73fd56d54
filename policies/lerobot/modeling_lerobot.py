"""LeRobot's pi0 / pi0.5 / SmolVLA as :class:`~policies.base.Policy` families.

The wrapped LeRobot policy is ``self.lerobot`` (its weights are saved under ``lerobot.*``). Our
observation contract maps onto LeRobot's batch: each camera's uint8 ``[N, H, W, 3]`` image becomes
``observation.images.<camera>`` in ``[0, 1]`` (LeRobot resizes with padding itself), the state is
normalised with the bundle's statistics (LeRobot's MEAN_STD step), the instruction is tokenised with
the model's tokenizer (padded on the right to ``tokenizer_max_length``). Actions come back in the
normalised space and are un-normalised by the same statistics.

Sampling drives LeRobot's denoising pieces (:mod:`policies.lerobot.adapters`) with the Euler grid of
``predict_action_chunk`` (t = 1, 1 - 1/K, ..., 1/K): the ODE from the same noise gives its chunk.
Flow-SDE replaces one (``sde``) or every (``sde_full``) Euler step of the first ``action_dim``
dimensions by the Gaussian transition of :func:`policies.flow.sde.sde_step`; the model's padding
dimensions follow the ODE, so the chunk's log-probability is exact and covers what becomes actions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    import lerobot  # noqa: F401
except ImportError as _err:
    raise ImportError(
        "the pi0, pi05 and smolvla families run LeRobot's models, which are not installed in this "
        "environment: use .venv-lerobot (CPython 3.12; bash scripts/setup.sh makes it)"
    ) from _err

from policies.base import ChunkSample, DetachedValueHead, Mode, Policy, obs_time_left
from policies.flow import sde as S
from policies.lerobot.adapters import OBS_STATE, OBS_TOKEN_MASK, OBS_TOKENS, Prefix, adapter
from policies.lerobot.configuration_lerobot import SAMPLERS, LeRobotVLAConfig, Pi0Config, Pi05Config, SmolVLAConfig
from policies.lerobot.quantiles import QuantileProcessor
from policies.lerobot.sizes import model_sizes
from sims.core import obs_views

log = logging.getLogger(__name__)


class TokenizerMissingError(FileNotFoundError):
    """The model's tokenizer is not on this machine (nothing is downloaded)."""


def load_tokenizer(name: str) -> Any:
    """A tokenizer from a local folder or from the local Hugging Face cache (never downloaded)."""
    from transformers import AutoTokenizer

    if not name:
        raise TokenizerMissingError("no tokenizer configured: set the policy's tokenizer to a local tokenizer folder")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as err:
        where = (
            "that folder has no tokenizer files"
            if Path(name).exists()
            else (
                "it is neither a local folder nor in the Hugging Face cache (HF_HOME, default ~/.cache/huggingface); "
                f"on a machine with network access, `huggingface-cli download {name}` fills the cache, or point "
                "the policy's tokenizer at a local folder with tokenizer.json / tokenizer_config.json"
            )
        )
        raise TokenizerMissingError(f"cannot load tokenizer {name!r}: {where} ({err})") from None


class LeRobotVLAPolicy(Policy):
    """A LeRobot VLA behind our contract (see the module docstring). Subclasses set the family."""

    family = "lerobot"  # the subclasses below name the registered families
    config_class = LeRobotVLAConfig

    def __init__(self, config: LeRobotVLAConfig, lerobot_policy: Any | None = None):
        super().__init__(config)
        self.adapter = adapter(config.lerobot_type)
        if lerobot_policy is None:
            with model_sizes(config.lerobot_type, config.model_sizes):
                lerobot_policy = self.adapter.policy_class()(self.adapter.lerobot_config(config))
        self.lerobot = lerobot_policy
        self.max_action_dim = self.adapter.max_action_dim(lerobot_policy)
        if config.action_dim > self.max_action_dim:
            raise ValueError(f"action_dim {config.action_dim} exceeds the model's max_action_dim {self.max_action_dim}")
        mark = f".{self.adapter.vlm_module}."
        # the VLM's weights (whether any trains decides if the prefix runs with gradients), found once
        self._vlm_params = [p for name, p in self.lerobot.named_parameters() if mark in f".{name}"]
        self.value_mlp = self._make_value_head()
        # Flow-Noise's learned std, on the action expert's output features (what LeRobot's action_out_proj
        # reads); a fresh head in an SFT bundle (SFT never trains it), dropped at deployment
        self.noise_head = nn.Linear(self.lerobot.model.action_out_proj.in_features, config.action_dim)
        self._tokenizer: Any | None = None
        self._token_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    # ------------------------------------------------------------------ parts
    @property
    def prefix_modules(self) -> tuple[str, ...]:
        """The VLM's submodule (RL's ``freeze_prefix`` freezes it, see
        :func:`embodied.algorithms.params.split_parameters`)."""
        return (self.adapter.vlm_module,)

    def _vlm_width(self) -> int:
        return (
            int(self.lerobot.model.state_proj.out_features)
            if self.config.lerobot_type == "smolvla"
            else int(self.lerobot.model.paligemma_with_expert.paligemma.config.text_config.hidden_size)
        )

    def _make_value_head(self) -> DetachedValueHead:
        return DetachedValueHead(self._vlm_width() + self.config.state_dim, self.config.value_hidden)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config.tokenizer_name())
        return self._tokenizer

    def tokens(
        self, instructions: list[str], device: torch.device, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, L]`` token ids and attention mask (True = a real token), ``L = tokenizer_max_length``,
        of the model's prompts (pi0.5's hold the normalised ``state [N, S]``)."""
        if isinstance(instructions, str):
            raise TypeError("instruction must be a list of N strings, not one string")
        prompts = self.adapter.prompts(
            list(instructions), state if state is not None else torch.zeros(len(instructions), 0)
        )
        cache = not self.adapter.prompt_has_state  # a prompt with the state is met once
        rows = []
        for text in prompts:
            row = self._token_cache.get(text) if cache else None
            if row is None:
                enc = self.tokenizer()(
                    text,
                    max_length=self.config.tokenizer_max_length,
                    padding="max_length",
                    padding_side="right",
                    truncation=True,
                    return_tensors="pt",
                )
                row = (enc["input_ids"][0], enc["attention_mask"][0].bool())
                if cache:
                    self._token_cache[text] = row
            rows.append(row)
        return (torch.stack([r[0] for r in rows]).to(device), torch.stack([r[1] for r in rows]).to(device))

    def lerobot_batch(self, obs: dict[str, Any]) -> dict[str, Any]:
        """LeRobot's batch of our observation (state normalised, images in [0, 1], tokens)."""
        cfg, device = self.config, self.device
        self.processor.check_obs(obs)
        batch: dict[str, Any] = {OBS_STATE: self.processor.state(torch.as_tensor(obs["state"]), device)}
        rgb = torch.as_tensor(obs_views(obs)) if cfg.cameras else None
        if rgb is not None:
            if rgb.ndim != 5 or rgb.shape[1] != len(cfg.cameras):
                raise ValueError(
                    f"rgb must be [N, {len(cfg.cameras)}, H, W, 3] for cameras {cfg.cameras}, got {tuple(rgb.shape)}"
                )
            images = rgb.to(device).permute(0, 1, 4, 2, 3).float() / 255.0
            for i, key in enumerate(cfg.image_keys()):
                batch[key] = images[:, i]
        batch[OBS_TOKENS], batch[OBS_TOKEN_MASK] = self.tokens(list(obs["instruction"]), device, batch[OBS_STATE])
        return batch

    def _vlm_trainable(self) -> bool:
        return any(p.requires_grad for p in self._vlm_params)

    def encode(self, obs: dict[str, Any]) -> tuple[Prefix, dict[str, Any]]:
        """The VLM prefix of a batch (with gradients only where the VLM trains) and LeRobot's batch."""
        batch = self.lerobot_batch(obs)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self._vlm_trainable()):
            prefix = self.adapter.prefix(self.lerobot, batch)
        return prefix, batch

    def _velocity(self, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.adapter.velocity(self.lerobot, prefix, x, t).float()

    def _velocity_and_std(self, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The velocity and Flow-Noise's std ``[N, H, A]``, bounded to ``[noise_std_min, noise_std_max]``,
        from the expert's output features: the input of LeRobot's ``action_out_proj``, read by a hook
        during the same denoising step."""
        seen: list[torch.Tensor] = []
        hook = self.lerobot.model.action_out_proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
        try:
            v = self._velocity(prefix, x, t)
        finally:
            hook.remove()
        c = self.config
        std = c.noise_std_min + (c.noise_std_max - c.noise_std_min) * torch.sigmoid(self.noise_head(seen[-1].float()))
        return v, std

    def _step(
        self, sampler: str, prefix: Prefix, x: torch.Tensor, t: torch.Tensor, dt: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ODE step of all dims, and the stochastic transition's mean and std on the action dims:
        Flow-SDE's (``sde``, ``sde_full``) or the ODE step with the learned std (``noise``)."""
        if sampler == "noise":
            v, std = self._velocity_and_std(prefix, x, t)
            ode = S.ode_step(x, v, dt)
            return ode, ode[..., : self.config.action_dim], std
        return self._split_step(x, self._velocity(prefix, x, t), t, dt)

    def _value(self, prefix: Prefix, batch: dict[str, Any], time_left: torch.Tensor) -> torch.Tensor:
        feats = torch.cat([prefix.pooled().float(), batch[OBS_STATE].float()], dim=1)
        return self.value_mlp(feats, time_left)

    def _split_step(
        self, x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, dt: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ODE step of all dims and the Flow-SDE mean and std of the action dims ``[N, H, A]``."""
        a = self.config.action_dim
        ode = S.ode_step(x, v, dt)
        mean, std = S.sde_step(x[..., :a], v[..., :a], t, dt, self.config.noise_level)
        return ode, mean, std

    # ------------------------------------------------------------------ the contract
    def sample(
        self,
        obs: dict[str, Any],
        *,
        mode: Mode = "explore",
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> ChunkSample:
        """A chunk ``[N, H, A]``; ``noise`` ``[N, H, max_action_dim]`` is the initial x_1 (drawn when None)."""
        cfg = self.config
        prefix, batch = self.encode(obs)
        n, h, a, k_steps = prefix.pad.shape[0], cfg.chunk_size, cfg.action_dim, cfg.num_steps
        device = prefix.pad.device
        dt = 1.0 / k_steps
        sampler = "ode" if mode == "greedy" else cfg.sampler
        rng_device = generator.device if generator is not None else device

        def normal(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(shape, generator=generator, device=rng_device).to(device)

        x = normal((n, h, self.max_action_dim)) if noise is None else noise.to(device).float()
        logprob = torch.zeros(n, device=device)
        chain = [x]
        stoch = (
            torch.randint(0, k_steps, (n,), generator=generator, device=rng_device).to(device)
            if sampler == "sde"
            else None
        )
        extras: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for k, t_val in enumerate(S.time_grid(k_steps)):
                t = torch.full((n,), t_val, device=device)
                if sampler == "ode":
                    x_next = S.ode_step(x, self._velocity(prefix, x, t), dt)
                else:
                    ode, mean, std = self._step(sampler, prefix, x, t, dt)
                    noisy = mean + std * normal(tuple(mean.shape))
                    x_next = ode.clone()
                    if sampler == "sde":
                        is_k = stoch == k
                        x_next[..., :a] = torch.where(is_k[:, None, None], noisy, ode[..., :a])
                        logprob = torch.where(is_k, S.gaussian_logprob(noisy, mean, std), logprob)
                        S.keep_stochastic_step(extras, k, is_k, x, x_next)
                    else:
                        x_next[..., :a] = noisy
                        logprob = logprob + S.gaussian_logprob(noisy, mean, std)
                x = x_next
                chain.append(x)
            if sampler == "sde":
                extras["step"] = stoch
            elif sampler in ("sde_full", "noise"):
                extras["chain"] = torch.stack(chain, dim=1)
            extras["sampler"] = torch.full((n,), SAMPLERS.index(sampler), dtype=torch.long, device=device)
            value = self._value(prefix, batch, obs_time_left(obs, n, device))
        actions = self.processor.unnormalize_actions(x[..., :a])
        return ChunkSample(
            actions=actions, logprob=logprob, value=value.detach(), extras={k: v.detach() for k, v in extras.items()}
        )

    def logprob(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact log-probability of a sampled chunk under the current weights: the one stochastic
        transition (``sde``) or the sum over all K (``sde_full``, ``noise``); 0 for ODE chunks."""
        cfg = self.config
        prefix, batch = self.encode(obs)
        n, device, dt = prefix.pad.shape[0], prefix.pad.device, 1.0 / cfg.num_steps
        value = self._value(prefix, batch, obs_time_left(obs, n, device))
        a = cfg.action_dim
        if "step" in extras:
            x_t, x_next = extras["x_t"].to(device), extras["x_next"].to(device)
            t = 1.0 - extras["step"].to(device).float() * dt
            _, mean, std = self._split_step(x_t, self._velocity(prefix, x_t, t), t, dt)
            return S.gaussian_logprob(x_next[..., :a], mean, std), S.gaussian_entropy(std), value
        if "chain" in extras:
            chain = extras["chain"].to(device)  # [N, K+1, H, max_action_dim]
            kind = SAMPLERS[int(extras["sampler"][0])] if "sampler" in extras else cfg.sampler
            if "sampler" in extras and not bool((extras["sampler"] == extras["sampler"][0]).all()):
                raise ValueError("extras mix chunks of different samplers; compute their log-probs separately")
            lp = torch.zeros(n, device=device)
            ent = torch.zeros(n, device=device)
            for k, t_val in enumerate(S.time_grid(cfg.num_steps)):
                t = torch.full((n,), t_val, device=device)
                _, mean, std = self._step(kind, prefix, chain[:, k], t, dt)
                lp = lp + S.gaussian_logprob(chain[:, k + 1, ..., :a], mean, std)
                ent = ent + S.gaussian_entropy(std)
            return lp, ent, value
        if "sampler" in extras and SAMPLERS[int(extras["sampler"][0])] == "ode":
            zero = torch.zeros(n, device=device)
            return zero, zero, value
        raise KeyError("extras need 'step', 'x_t', 'x_next' (Flow-SDE) or 'chain' (sde_full, noise)")

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            prefix, batch = self.encode(obs)
        return self._value(prefix, batch, obs_time_left(obs, prefix.pad.shape[0], prefix.pad.device))

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """LeRobot's flow-matching loss (its training forward, its time distribution) on the action dims."""
        batch = self.lerobot_batch(obs)
        a = self.processor.normalize_actions(actions.to(self.device))
        padded = torch.nn.functional.pad(a, (0, self.max_action_dim - a.shape[-1]))
        model = self.lerobot.model
        noise = torch.randn_like(padded)
        time = model.sample_time(padded.shape[0], padded.device)
        losses = self.adapter.flow_losses(self.lerobot, batch, padded, noise, time)
        return losses[..., : a.shape[-1]].mean()


class Pi0Policy(LeRobotVLAPolicy):
    family = "pi0"
    config_class = Pi0Config


class Pi05Policy(LeRobotVLAPolicy):
    """pi0.5: quantile normalisation (LeRobot's default for it), the state in the prompt."""

    family = "pi05"
    config_class = Pi05Config

    def __init__(self, config: Pi05Config, lerobot_policy: Any | None = None):
        super().__init__(config, lerobot_policy)
        self.processor = QuantileProcessor(config)


class SmolVLAPolicy(LeRobotVLAPolicy):
    family = "smolvla"
    config_class = SmolVLAConfig
