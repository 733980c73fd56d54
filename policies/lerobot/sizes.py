"""Building a LeRobot pi0 / pi0.5 at other than its published sizes (a tiny one for tests and laptops).

LeRobot hard-codes the sizes: ``get_gemma_config`` knows only ``gemma_300m`` and ``gemma_2b`` (and the
configs refuse other variant names), and the PaliGemma wrapper sets the SigLIP tower's sizes. Inside
:func:`model_sizes` those two places read the given sizes instead; the variant names stay LeRobot's,
so a checkpoint written from a small model loads in LeRobot itself inside the same context.
SmolVLA needs no patch: its VLM config is a local folder (``lerobot_config.vlm_model_name``).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator

#: the LeRobot modules whose Gemma and PaliGemma sizes :func:`model_sizes` overrides
PATCHED_MODULES = {"pi0": "lerobot.policies.pi0.modeling_pi0", "pi05": "lerobot.policies.pi05.modeling_pi05"}

#: named sizes (``model_sizes="tiny"``): a pi0 / pi0.5 of a few million weights besides its embedding
#: tables (LeRobot's real sizes: gemma_2b / gemma_300m, SigLIP so400m). Both Gemmas keep 8 query
#: heads of one width, as the real ones: their joint attention concatenates the two, and LeRobot's
#: training forward reshapes to 8 heads.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "gemma": {
            "gemma_2b": dict(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8),
            "gemma_300m": dict(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),
        },
        "vision": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=8),
    },
}

GEMMA_FIELDS = ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")
VISION_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size")


def resolve_sizes(sizes: str | dict[str, Any] | None) -> dict[str, Any]:
    """The size overrides of a ``model_sizes`` value (a preset name, a mapping, or empty), checked."""
    if isinstance(sizes, str):
        if sizes not in PRESETS:
            raise ValueError(f"unknown model_sizes preset {sizes!r}; known: {sorted(PRESETS)} (or a mapping)")
        sizes = PRESETS[sizes]
    sizes = dict(sizes or {})
    check_sizes(sizes)
    return sizes


def check_sizes(sizes: dict[str, Any]) -> None:
    """Raise on a ``model_sizes`` entry with unknown or missing fields."""
    unknown = sorted(set(sizes) - {"gemma", "vision"})
    if unknown:
        raise ValueError(f"unknown model_sizes key(s) {unknown}; known: ['gemma', 'vision']")
    for variant, fields in (sizes.get("gemma") or {}).items():
        if variant not in ("gemma_300m", "gemma_2b"):
            raise ValueError(f"model_sizes.gemma names {variant!r}; LeRobot's variants are 'gemma_300m' and 'gemma_2b'")
        if set(fields) != set(GEMMA_FIELDS):
            raise ValueError(f"model_sizes.gemma.{variant} needs exactly {list(GEMMA_FIELDS)}, got {sorted(fields)}")
    unknown = sorted(set(sizes.get("vision") or {}) - set(VISION_FIELDS))
    if unknown:
        raise ValueError(f"unknown model_sizes.vision field(s) {unknown}; known: {list(VISION_FIELDS)}")


@contextlib.contextmanager
def model_sizes(lerobot_type: str, sizes: str | dict[str, Any] | None) -> Iterator[None]:
    """Within the block, pi0 / pi0.5 models are built with ``sizes`` (see :class:`LeRobotVLAConfig`'s
    ``model_sizes``); a no-op for empty sizes and for SmolVLA."""
    sizes = resolve_sizes(sizes)
    if not sizes or lerobot_type not in PATCHED_MODULES:
        yield
        return
    module = importlib.import_module(PATCHED_MODULES[lerobot_type])
    gemma, vision = dict(sizes.get("gemma") or {}), dict(sizes.get("vision") or {})
    original_get, original_vlm = module.get_gemma_config, module.PaliGemmaForConditionalGenerationWithPiGemma

    def get_gemma_config(variant: str) -> Any:
        return module.GemmaConfig(**gemma[variant]) if variant in gemma else original_get(variant)

    class SizedPaliGemma(original_vlm):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any):
            for key, value in vision.items():
                setattr(config.vision_config, key, value)
            if vision:  # the projector maps the vision width onto the language model's
                config.vision_config.projection_dim = config.text_config.hidden_size
            super().__init__(config)

    module.get_gemma_config = get_gemma_config
    module.PaliGemmaForConditionalGenerationWithPiGemma = SizedPaliGemma
    try:
        yield
    finally:
        module.get_gemma_config = original_get
        module.PaliGemmaForConditionalGenerationWithPiGemma = original_vlm
