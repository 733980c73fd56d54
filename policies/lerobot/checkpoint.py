"""LeRobot checkpoint folders in and out.

:func:`load_lerobot` reads a folder that LeRobot's ``save_pretrained`` wrote (``config.json`` with
``"type": "pi0" | "pi05" | "smolvla"``, ``model.safetensors``, and, when LeRobot saved its processors,
the normaliser statistics in ``policy_preprocessor_step_*_normalizer_processor.safetensors``) as one of
our policies: the weights are loaded strictly (LeRobot's ``from_pretrained`` would fall back to a
random model when they do not fit; here a mismatch is an error). :func:`export_lerobot` writes our
policy's LeRobot model back in that format, so LeRobot itself loads it after our fine-tuning.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from policies.errors import CheckpointError
from policies.lerobot.sizes import model_sizes

log = logging.getLogger(__name__)

#: LeRobot ``type`` -> our family
LEROBOT_FAMILIES = {"pi0": "pi0", "pi05": "pi05", "smolvla": "smolvla"}
#: our config's fields that LeRobot's config determines (the rest of theirs goes to ``lerobot_config``)
_DERIVED = (
    "chunk_size",
    "n_action_steps",
    "input_features",
    "output_features",
    "tokenizer_max_length",
    "train_expert_only",
    "freeze_vision_encoder",
    "device",
    "num_inference_steps",
    "num_steps",
    "image_resolution",
    "resize_imgs_with_padding",
    "type",
)


def is_lerobot_folder(path: str | os.PathLike) -> bool:
    """True for a folder with LeRobot's ``config.json`` (a ``type`` and no bundle ``format_version``)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        meta = json.loads(cfg.read_text())
    except json.JSONDecodeError:
        return False
    return isinstance(meta, dict) and "type" in meta and "format_version" not in meta


#: our config of an exported checkpoint, beside LeRobot's files
EMBODIED_CONFIG = "embodied_policy.json"
#: the normalisation our processor of each family applies (LeRobot's names)
NORMALISATION = {"pi0": "MEAN_STD", "pi05": "QUANTILES", "smolvla": "MEAN_STD"}
#: our statistic -> LeRobot's flat normaliser key
_STAT_NAMES = {
    "state_mean": "observation.state.mean",
    "state_std": "observation.state.std",
    "action_mean": "action.mean",
    "action_std": "action.std",
    "state_q01": "observation.state.q01",
    "state_q99": "observation.state.q99",
    "action_q01": "action.q01",
    "action_q99": "action.q99",
}


def _normalizer_stats(folder: Path, state_dim: int, action_dim: int, mode: str) -> dict[str, list[float]] | None:
    from safetensors.torch import load_file

    files = sorted(folder.glob("policy_preprocessor_step_*_normalizer_processor.safetensors"))
    if not files:
        return None
    flat = load_file(str(files[0]))
    needed = [k for k in _STAT_NAMES if ("_q" in k) == (mode == "QUANTILES")]
    missing = [_STAT_NAMES[k] for k in needed if _STAT_NAMES[k] not in flat]
    if missing:
        raise CheckpointError(
            f"{files[0]} lacks {missing}: the policy's state and action normalisation ({mode}) cannot be reproduced"
        )
    out = {k: [float(x) for x in flat[name].flatten()] for k, name in _STAT_NAMES.items() if name in flat}
    key = "state_mean" if "state_mean" in out else "state_q01"
    akey = "action_mean" if "action_mean" in out else "action_q01"
    if len(out[key]) != state_dim or len(out[akey]) != action_dim:
        raise CheckpointError(
            f"{files[0]}: statistics of {len(out[key])}-D state / "
            f"{len(out[akey])}-D action, the model has {state_dim} / {action_dim}"
        )
    return out


def load_lerobot(
    path: str | os.PathLike,
    *,
    device: str = "cpu",
    tokenizer: str = "",
    model_sizes_override: str | dict[str, Any] | None = None,
    cameras: list[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """Our policy of a LeRobot checkpoint folder (eval mode); ``overrides``: our config fields to change
    (see :func:`policies.load`). ``tokenizer`` overrides the model's
    default (a local folder); ``model_sizes_override`` rebuilds a small model (see ``model_sizes``);
    ``cameras`` names our cameras for the checkpoint's image features, in their order (LeRobot's
    LIBERO checkpoints read ``observation.images.image`` and ``.wrist_image``: ``["agentview", "wrist"]``
    for our LIBERO scenes); by default the features' own names."""
    from lerobot.configs.policies import PreTrainedConfig
    from safetensors.torch import load_file

    from policies.registry import config_with, policy_class

    folder = Path(path)
    if not is_lerobot_folder(folder):
        raise CheckpointError(f"{folder} is not a LeRobot checkpoint folder (config.json with a 'type')")
    kind = json.loads((folder / "config.json").read_text())["type"]
    family = LEROBOT_FAMILIES.get(kind)
    if family is None:
        raise CheckpointError(
            f"{folder}: LeRobot policy type {kind!r} has no family here; supported: {sorted(LEROBOT_FAMILIES)}"
        )
    from policies.lerobot.adapters import adapter

    adapter(family).config_class()  # imported: LeRobot registers the config type on import
    lr_config = PreTrainedConfig.from_pretrained(str(folder), local_files_only=True)
    cls = policy_class(family)
    modes = {str(k): str(getattr(v, "value", v)) for k, v in getattr(lr_config, "normalization_mapping", {}).items()}
    mode = NORMALISATION[family]
    if any(modes.get(k, mode) not in (mode, "IDENTITY") for k in ("STATE", "ACTION")):
        raise CheckpointError(
            f"{folder}: state/action normalisation {modes}; the {family} family normalises with "
            f"{mode} (LeRobot's default for it)"
        )
    image_keys = [k for k, f in lr_config.input_features.items() if str(getattr(f.type, "value", f.type)) == "VISUAL"]
    state = lr_config.input_features.get("observation.state")
    action = lr_config.output_features.get("action")
    if state is None or action is None:
        raise CheckpointError(f"{folder}: the config lacks observation.state or action features")
    resolution = getattr(lr_config, "image_resolution", None) or getattr(lr_config, "resize_imgs_with_padding", None)
    steps = getattr(lr_config, "num_inference_steps", None) or getattr(lr_config, "num_steps", 10)
    raw = json.loads((folder / "config.json").read_text())
    fields = dict(
        action_dim=int(action.shape[0]),
        state_dim=int(state.shape[0]),
        chunk_size=int(lr_config.chunk_size),
        cameras=[k.removeprefix("observation.images.") for k in image_keys],
        camera_keys=image_keys,
        image_size=int(resolution[0]),
        num_steps=int(steps),
        tokenizer=tokenizer,
        tokenizer_max_length=int(lr_config.tokenizer_max_length),
        train_expert_only=bool(lr_config.train_expert_only),
        freeze_vision_encoder=bool(getattr(lr_config, "freeze_vision_encoder", True)),
        lerobot_config={k: v for k, v in raw.items() if k not in _DERIVED},
        model_sizes=model_sizes_override or {},
    )
    if cameras is not None:
        if len(cameras) != len(image_keys):
            raise CheckpointError(f"cameras {list(cameras)} must name one camera per image feature {image_keys}")
        fields["cameras"] = list(cameras)
    ours = folder / EMBODIED_CONFIG
    if ours.is_file():  # written by export_lerobot: our own fields (cameras, tokenizer, sizes) as they were
        saved = json.loads(ours.read_text())
        if saved.get("family") != family:
            raise CheckpointError(f"{ours} is for a {saved.get('family')} policy, config.json for {family}")
        fields = {
            **saved["config"],
            **({"tokenizer": tokenizer} if tokenizer else {}),
            **({"model_sizes": model_sizes_override} if model_sizes_override else {}),
            **({"cameras": list(cameras), "camera_keys": image_keys} if cameras is not None else {}),
        }
    config = config_with(family, {**cls.config_class().to_dict(), **fields}, overrides)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{folder} has no model.safetensors")
    lr_config.device = "cpu"
    with model_sizes(family, config.model_sizes):
        lr_policy = _lerobot_class(family)(lr_config)
    state_dict = (
        lr_policy._fix_pytorch_state_dict_keys(load_file(str(weights)), lr_config)
        if hasattr(lr_policy, "_fix_pytorch_state_dict_keys")
        else load_file(str(weights))
    )
    if family != "smolvla":  # openpi-converted weights may lack the "model." prefix
        state_dict = {k if k.startswith("model.") else f"model.{k}": v for k, v in state_dict.items()}
    missing, unexpected = lr_policy.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not fit LeRobot's {family} built from {folder}/config.json: "
            f"missing {missing[:5]} ({len(missing)}), unexpected {unexpected[:5]} ({len(unexpected)})"
        )
    policy = cls(config, lerobot_policy=lr_policy)
    stats = _normalizer_stats(folder, config.state_dim, config.action_dim, mode)
    if stats is None and (folder / "stats.json").is_file():  # written by export_lerobot
        stats = json.loads((folder / "stats.json").read_text())
    if stats is None:
        log.warning("%s has no LeRobot normaliser statistics: states and actions pass un-normalised", folder)
    policy.processor.set_stats(stats)
    return policy.to(device).eval()


def _lerobot_class(family: str) -> Any:
    from policies.lerobot.adapters import adapter

    return adapter(family).policy_class()


def export_lerobot(policy: Any, path: str | os.PathLike) -> Path:
    """Write ``policy``'s LeRobot model as a LeRobot checkpoint folder (``config.json``,
    ``model.safetensors``: what LeRobot's ``from_pretrained`` reads) and our normalisation statistics
    as ``stats.json`` (:func:`load_lerobot` reads them back; in LeRobot, pass them as ``dataset_stats`` to
    the family's ``make_*_pre_post_processors``) and our config as ``embodied_policy.json`` (camera names,
    tokenizer, sizes: :func:`load_lerobot` restores them); returns the folder."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lr = policy.lerobot
    lr.config.device = "cpu"
    state = {k: v.detach().cpu().contiguous() for k, v in lr.state_dict().items()}
    lr.save_pretrained(folder, state_dict=state)
    (folder / "stats.json").write_text(json.dumps(policy.processor.stats, indent=2))
    (folder / EMBODIED_CONFIG).write_text(
        json.dumps({"family": policy.family, "config": policy.config.to_dict()}, indent=2)
    )
    return folder
