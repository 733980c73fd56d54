"""Checkpoint bundles: ``model.safetensors`` + ``config.json`` + ``stats.json``. Never unpickles.

``config.json`` holds the family, the family's config (sizes, chunk size, action space, control
rate, camera keys), the format version and the sha256 of ``model.safetensors``; loading refuses a
weights file whose hash differs (tampered or swapped) and anything that is not safetensors
(a pickled ``.pt``/``.bin`` is never opened). Files are written atomically: each is complete or
absent, and ``config.json`` is written last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from policies.errors import CheckpointError, SpecMismatchError
from policies.files import sha256_file, write_atomic

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"


#: Config values of bundles written before a field existed: they load as they were trained.
LEGACY_CONFIG = {"state_std_floor": 1e-3, "state_clip": 0.0}


__all__ = ["CheckpointError", "SpecMismatchError", "load", "read_meta", "save"]


def save(policy: Any, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``policy`` as a bundle into folder ``path``; returns the folder."""
    from safetensors.torch import save as st_save

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    write_atomic(folder / WEIGHTS, st_save(state, metadata={"family": policy.family}))
    write_atomic(folder / "stats.json", json.dumps(policy.processor.stats, indent=2).encode())
    meta = {
        "format_version": FORMAT_VERSION,
        "family": policy.family,
        "config": policy.config.to_dict(),
        "files": {WEIGHTS: sha256_file(folder / WEIGHTS)},
        "extra": extra or {},
    }
    write_atomic(folder / "config.json", json.dumps(meta, indent=2).encode())
    return folder


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of a bundle, validated."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(
            f"no checkpoint bundle at {folder}: expected a folder with config.json, {WEIGHTS} and stats.json"
        )
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder} has no config.json: not a bundle, or its save was interrupted")
    try:
        meta = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {err}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{cfg_path}: format_version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
    return meta


def load(
    path: str | os.PathLike,
    *,
    device: str = "cpu",
    cameras: list[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """Load a bundle written by :func:`save`, or a checkpoint folder written by LeRobot (pi0, pi0.5,
    SmolVLA: :func:`policies.lerobot.load_lerobot`, where ``cameras`` names our cameras for its image
    features); returns the policy in eval mode. ``overrides``: config fields to change before the policy
    is built (how it samples, say: ``{"sampler": "sde", "temperature": 0.5}``), validated by its config;
    the weights stay the checkpoint's."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from policies.lerobot.checkpoint import is_lerobot_folder, load_lerobot
    from policies.registry import config_with, policy_class

    folder = Path(path)
    if is_lerobot_folder(folder):
        return load_lerobot(folder, device=device, cameras=cameras, overrides=overrides)
    if cameras is not None:
        raise CheckpointError("cameras= renames a LeRobot checkpoint's image features; a bundle keeps its own")
    meta = read_meta(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        pickled = sorted(p.name for p in folder.glob("*") if p.suffix in (".pt", ".pth", ".bin", ".pkl", ".ckpt"))
        hint = f" (found {pickled}: pickled checkpoints are never loaded)" if pickled else ""
        raise CheckpointError(f"{folder} has no {WEIGHTS}{hint}")
    expected = meta.get("files", {}).get(WEIGHTS)
    if expected != sha256_file(weights):
        raise CheckpointError(
            f"{weights} does not match the sha256 recorded in config.json: the file was modified "
            "or belongs to another bundle; refusing to load it"
        )
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights} is not a valid safetensors file ({err})") from None
    cls = policy_class(meta["family"])
    config = config_with(meta["family"], {**LEGACY_CONFIG, **meta["config"]}, overrides)
    policy = cls(config)
    stats_path = folder / "stats.json"
    if stats_path.is_file():
        policy.processor.set_stats(json.loads(stats_path.read_text()))
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not fit a {meta['family']} policy with this config: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return policy.to(device).eval()
