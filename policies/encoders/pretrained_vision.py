"""A SigLIP vision encoder from transformers: a drop-in for :class:`~policies.encoders.vision.ViewEncoder`.

Chosen with ``vision_encoder="siglip"`` and ``pretrained_vision=<folder>`` on the policy config
(the default ``vision_encoder="cnn"`` is the small CNN trained from scratch). The folder is a
local Hugging Face checkpoint, loaded offline (``local_files_only=True``, safetensors only, never a
pickled ``.bin``):

- a SigLIP vision model (``config.json`` with ``model_type`` ``siglip_vision_model``, e.g. written
  by ``SiglipVisionModel.save_pretrained``) or a full SigLIP model (``siglip``: its vision half is
  taken);
- a PaliGemma model (``paligemma``, e.g. a pi_0 / PaliGemma-3B backbone): its SigLIP vision tower
  is built from the config's ``vision_config`` and only the ``vision_tower.*`` tensors are read
  from the (possibly sharded) safetensors; the Gemma language model is never instantiated.

Nothing is downloaded: fetch a checkpoint once on a machine with network (e.g. ``hf download
google/siglip-base-patch16-224 --local-dir DIR``) and point ``pretrained_vision`` at ``DIR``.
transformers comes with ``pip install -r requirements/pretrained.txt``; it is imported only when
this encoder is built.

Input contract as ViewEncoder: images ``[N, V, 3, s, s]`` in ``[-1, 1]`` (the processor's output),
which is exactly SigLIP's/PaliGemma's normalisation (mean = std = 0.5). Images whose size differs
from the checkpoint's ``image_size`` are resized (bilinear) to it; set the policy's ``image_size``
to the checkpoint's (224 for most SigLIP/PaliGemma) to avoid resampling twice. The backbone's
patch tokens ``[N*V, P*P, C]`` (P = image_size / patch_size, 16 for 224/14) are average-pooled
to a ``G x G`` grid when ``P > G`` (G = 4 by default, the CNN's token count), projected to
``d_model`` and tagged with a learned per-view embedding: output ``[N, V * G * G, d]``.

The backbone is built without SigLIP's attention-pooling head (``vision_use_head=False``): the
prefix uses the patch tokens, so the head would be dead weight (and unused parameters upset DDP).
It is fine-tuned with the rest of the policy (pi_0 style); freeze it with
``policy.prefix.vision.backbone.requires_grad_(False)`` if wanted.

Caveat: a saved policy bundle stores the backbone's weights but not its architecture, so
``policies.load`` rebuilds the backbone from ``pretrained_vision`` and needs that folder to exist
on the loading machine (its weights are then overwritten by the bundle's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.encoders.language import hf_offline

if TYPE_CHECKING:  # pragma: no cover
    from transformers import SiglipVisionConfig, SiglipVisionModel

TRANSFORMERS_INSTALL = "pip install -r requirements/pretrained.txt (pins transformers)"
SIGLIP_TYPES = ("siglip_vision_model", "siglip")
PALIGEMMA_TYPES = ("paligemma",)
# PaliGemma checkpoints name the tower ``vision_tower.*`` (older: ``vision_tower.vision_model.*``,
# newer in memory: ``model.vision_tower.*``); the rest (language model, projector) is ignored.
PALIGEMMA_KEY_MAPPING = {r"^(model\.)?vision_tower\.": ""}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            f"vision_encoder='siglip' needs the 'transformers' package: {TRANSFORMERS_INSTALL}; the default "
            "vision_encoder='cnn' needs nothing"
        ) from err
    return transformers


def _bad_path(path: str | Path, why: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"pretrained_vision={str(path)!r}: {why}. Point it at a local folder holding a SigLIP or PaliGemma "
        "checkpoint (config.json + model.safetensors, or sharded with model.safetensors.index.json), e.g. from "
        "SiglipVisionModel.save_pretrained(DIR) or `hf download google/siglip-base-patch16-224 --local-dir DIR` "
        "on a machine with network; or use vision_encoder='cnn'"
    )


def load_siglip_vision(path: str | Path) -> SiglipVisionModel:
    """A float32 ``SiglipVisionModel`` (no pooling head) from a local SigLIP or PaliGemma folder, offline.

    Raises:
        ImportError: transformers is not installed.
        FileNotFoundError: ``path`` is not a folder with ``config.json`` and safetensors weights.
        ValueError: the folder holds another kind of model, or weights that do not fit its config.
    """
    tf = _transformers()
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise _bad_path(path, "no such folder")
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise _bad_path(path, "the folder has no config.json")
    try:
        model_type = json.loads(cfg_file.read_text()).get("model_type", "")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise _bad_path(path, f"config.json is not a JSON object ({err})") from None
    if model_type not in SIGLIP_TYPES + PALIGEMMA_TYPES:
        raise ValueError(
            f"pretrained_vision={str(path)!r} holds a {model_type or 'untyped'!r} model; vision_encoder='siglip' "
            f"loads model_type {SIGLIP_TYPES + PALIGEMMA_TYPES} (SigLIP vision, SigLIP, PaliGemma)"
        )
    if not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" (found {pickled}: pickled weights are never loaded; convert them to safetensors)" if pickled else ""
        raise _bad_path(path, f"the folder has no *.safetensors weights{hint}")

    kwargs: dict[str, Any] = {}
    if model_type in PALIGEMMA_TYPES:
        kwargs["key_mapping"] = PALIGEMMA_KEY_MAPPING
    with hf_offline():
        try:
            config = tf.SiglipVisionConfig.from_pretrained(str(folder), local_files_only=True)
            config.vision_use_head = False
            model, info = tf.SiglipVisionModel.from_pretrained(
                str(folder),
                config=config,
                local_files_only=True,
                use_safetensors=True,
                dtype=torch.float32,
                output_loading_info=True,
                **kwargs,
            )
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
            raise ValueError(
                f"could not load a SigLIP vision model from pretrained_vision={str(path)!r}: {err}"
            ) from err
    missing = sorted(info.get("missing_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if missing or mismatched:
        raise ValueError(
            f"pretrained_vision={str(path)!r} does not hold a complete {model_type} vision tower for its config: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, shape mismatches {mismatched[:5]}"
        )
    return model.float()


def build_siglip_vision(vision_config: SiglipVisionConfig | dict[str, Any]) -> SiglipVisionModel:
    """A randomly initialised float32 ``SiglipVisionModel`` (no pooling head) from a config or its dict."""
    tf = _transformers()
    if isinstance(vision_config, dict):
        config = tf.SiglipVisionConfig(**vision_config)
    elif isinstance(vision_config, tf.SiglipVisionConfig):
        config = tf.SiglipVisionConfig(**vision_config.to_dict())  # a copy: the caller's stays untouched
    else:
        raise TypeError(f"vision_config must be a SiglipVisionConfig or a dict, got {type(vision_config).__name__}")
    config.vision_use_head = False
    return tf.SiglipVisionModel(config).float()


def _as_int(value: int | list[int] | tuple[int, ...]) -> int:
    if isinstance(value, int):
        return value
    if len(set(value)) != 1:
        raise ValueError(f"only square SigLIP images/patches are supported, got {value}")
    return int(value[0])


class SiglipViewEncoder(nn.Module):
    """``[N, V, 3, s, s]`` images in ``[-1, 1]`` -> ``[N, V * T, d]`` tokens with a SigLIP backbone.

    ``T = min(G, P) ** 2`` tokens per view: the ``P x P`` patch grid of the backbone,
    average-pooled to ``G x G`` when larger. Give exactly one of ``pretrained`` (a local folder,
    see :func:`load_siglip_vision`) and ``vision_config`` (random init, e.g. a tiny config in tests).

    Attributes:
        backbone: the ``transformers.SiglipVisionModel``.
        proj: ``Linear(hidden_size, d_model)``.
        view_emb: ``[V, 1, d]`` learned per-view embedding.
        image_size / patch_grid / grid: the backbone's input size, its P, and the output G.
    """

    def __init__(
        self,
        d_model: int,
        num_views: int,
        *,
        pretrained: str | Path = "",
        vision_config: SiglipVisionConfig | dict[str, Any] | None = None,
        grid: int = 4,
    ):
        super().__init__()
        if bool(pretrained) == (vision_config is not None):
            raise ValueError("SiglipViewEncoder needs exactly one of pretrained=<folder> or vision_config=<config>")
        if grid < 1:
            raise ValueError(f"grid must be >= 1, got {grid}")
        self.backbone = load_siglip_vision(pretrained) if pretrained else build_siglip_vision(vision_config)
        cfg = self.backbone.config
        self.image_size = _as_int(cfg.image_size)
        patch = _as_int(cfg.patch_size)
        if self.image_size % patch:
            raise ValueError(f"SigLIP image_size {self.image_size} is not a multiple of patch_size {patch}")
        self.patch_grid = self.image_size // patch
        self.grid = min(grid, self.patch_grid)
        self.num_views = num_views
        self.proj = nn.Linear(cfg.hidden_size, d_model)
        self.view_emb = nn.Parameter(torch.randn(num_views, 1, d_model) * 0.02)

    @property
    def tokens_per_view(self) -> int:
        return self.grid * self.grid

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, V, 3, s, s]`` in ``[-1, 1]`` -> ``[N, V * T, d]``."""
        if images.ndim != 5 or images.shape[1] != self.num_views or images.shape[2] != 3:
            raise ValueError(f"images must be [N, {self.num_views}, 3, s, s], got {tuple(images.shape)}")
        n, v = images.shape[:2]
        x = images.flatten(0, 1)  # [N*V, 3, s, s]
        size = self.image_size
        if x.shape[-2:] != (size, size):
            down = x.shape[-1] > size or x.shape[-2] > size
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=down)
        h = self.backbone(pixel_values=x.to(self.proj.weight.dtype)).last_hidden_state  # [N*V, P*P, C]
        if self.grid < self.patch_grid:
            p, c = self.patch_grid, h.shape[-1]
            h = h.transpose(1, 2).reshape(n * v, c, p, p)
            h = F.adaptive_avg_pool2d(h, self.grid).flatten(2).transpose(1, 2)  # [N*V, G*G, C]
        tokens = self.proj(h).reshape(n, v, self.tokens_per_view, -1) + self.view_emb
        return tokens.flatten(1, 2)
