"""Configuration of the LeRobot VLA families (``pi0``, ``pi05``, ``smolvla``).

Importing this module needs neither LeRobot nor torch's model code: the Hydra schemas read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.base import PolicyConfig

#: exploration samplers of the LeRobot families (greedy mode always runs the ODE)
SAMPLERS = ("ode", "sde", "sde_full", "noise")


@dataclass
class LeRobotVLAConfig(PolicyConfig):
    """Fields of a LeRobot VLA beyond :class:`PolicyConfig` (``d_model``, ``vision_*``, ``prefix_*``,
    ``language_encoder`` and ``vision_encoder`` are unused: the model is LeRobot's).

    Attributes:
        lerobot_config: fields of LeRobot's own config class (``PI0Config``, ``PI05Config``,
            ``SmolVLAConfig``) beyond those derived from ours (chunk size, action and state sizes,
            cameras, image resolution, denoising steps), e.g. ``{"max_action_dim": 32}``. A checkpoint
            loaded from a LeRobot folder keeps its whole config here.
        model_sizes: size overrides for a small model built from scratch (tests, laptops): the name
            of a preset of :data:`policies.lerobot.sizes.PRESETS` (``tiny``), or
            ``{"gemma": {variant: {width, depth, mlp_dim, num_heads, num_kv_heads, head_dim}},
            "vision": {hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            patch_size}}`` for pi0/pi0.5 (LeRobot hard-codes the Gemma and SigLIP sizes), ``{}`` for
            LeRobot's real sizes (also None). Recorded in the bundle: the same overrides rebuild the model.
        tokenizer: a local tokenizer folder, or a Hugging Face hub id found in the local cache
            (never downloaded: ``HF_HUB_OFFLINE`` reading). ``""``: the model's own (PaliGemma's for
            pi0/pi0.5; SmolVLA's VLM processor).
        tokenizer_max_length: tokens per instruction (padded on the right).
        camera_keys: LeRobot's image feature key of each of ``cameras`` (same order); ``[]``:
            ``observation.images.<camera>``.
        num_steps: K Euler denoising steps (LeRobot's ``num_inference_steps`` / ``num_steps``).
        sampler: ``ode``, ``sde`` (Flow-SDE, one stochastic step per chunk, drawn uniformly) or
            ``sde_full`` (every step stochastic), or ``noise`` (Flow-Noise: every step the ODE step
            plus a learned, bounded std on the expert's output features). Only the first ``action_dim``
            dimensions are stochastic; the model's padding dimensions follow the ODE, so the
            log-probability covers exactly what becomes the action.
        noise_level: Flow-SDE noise level a (``sigma_t = a * sqrt(t / (1 - t))``).
        noise_std_min / noise_std_max: bounds of Flow-Noise's learned std ([0.08, 0.16] in pi_RL).
        train_expert_only: freeze the VLM (vision tower and language model): SFT and RL train the
            action expert, its projections and the value head (RLinf's pi0 RL setting).
        freeze_vision_encoder: freeze the vision tower only (with ``train_expert_only`` False).
    """

    lerobot_type: ClassVar[str] = ""
    #: LeRobot's default tokenizer of the family (its processor's hub id)
    default_tokenizer: ClassVar[str] = ""

    # Any-typed (not dict): Hydra then takes a whole mapping on the command line,
    # policy.lerobot_config={max_action_dim:32}
    lerobot_config: Any = None
    model_sizes: Any = None
    tokenizer: str = ""
    tokenizer_max_length: int = 48
    camera_keys: list[str] = field(default_factory=list)
    num_steps: int = 10
    sampler: str = "sde"
    noise_level: float = 0.5
    noise_std_min: float = 0.08
    noise_std_max: float = 0.16
    train_expert_only: bool = True
    freeze_vision_encoder: bool = True
    image_size: int = 224

    def __post_init__(self) -> None:
        from policies.lerobot.sizes import resolve_sizes

        self.lerobot_config = dict(self.lerobot_config or {})
        if not isinstance(self.model_sizes, str):
            self.model_sizes = dict(self.model_sizes or {})
        resolve_sizes(self.model_sizes)  # refuses an unknown preset or field early
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if not 0 < self.noise_std_min <= self.noise_std_max:
            raise ValueError("need 0 < noise_std_min <= noise_std_max")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.camera_keys and len(self.camera_keys) != len(self.cameras):
            raise ValueError(f"camera_keys {self.camera_keys} must name one key per camera {self.cameras}")
        if self.value_features != "detached":
            raise ValueError("the LeRobot families have the detached value head only: value_features='detached'")
        self.check_value_fields()

    def image_keys(self) -> list[str]:
        """LeRobot's image feature key of each camera, in ``cameras`` order."""
        return list(self.camera_keys) or [f"observation.images.{c}" for c in self.cameras]

    def tokenizer_name(self) -> str:
        return self.tokenizer or self.default_tokenizer


@dataclass
class Pi0Config(LeRobotVLAConfig):
    """pi0 (openpi's PaliGemma + Gemma action expert, as ported by LeRobot)."""

    lerobot_type: ClassVar[str] = "pi0"
    default_tokenizer: ClassVar[str] = "google/paligemma-3b-pt-224"


@dataclass
class Pi05Config(LeRobotVLAConfig):
    """pi0.5 (the state enters the prompt as discretised tokens; adaRMS time conditioning)."""

    lerobot_type: ClassVar[str] = "pi05"
    default_tokenizer: ClassVar[str] = "google/paligemma-3b-pt-224"
    tokenizer_max_length: int = 200


@dataclass
class SmolVLAConfig(LeRobotVLAConfig):
    """SmolVLA (SmolVLM2 + a small action expert reading its KV cache)."""

    lerobot_type: ClassVar[str] = "smolvla"
    #: LeRobot's default VLM (``lerobot_config.vlm_model_name`` names another: a local folder or hub id)
    default_vlm: ClassVar[str] = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
    image_size: int = 512

    def tokenizer_name(self) -> str:
        """The VLM's own tokenizer unless ``tokenizer`` names another."""
        return self.tokenizer or str(self.lerobot_config.get("vlm_model_name", self.default_vlm))
