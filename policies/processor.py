"""Model-input preprocessing shared by the families: resize and scale images, normalise state and
actions with dataset statistics (stored in the checkpoint's ``stats.json``), tokenise text.

The tokenizer is byte-level (UTF-8 bytes + 1, 0 = padding): no vocabulary file, stable across
machines. Images: uint8 ``[N, V, H, W, 3]`` -> float ``[N, V, 3, s, s]`` in ``[-1, 1]``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from sims.core import obs_views

STAT_KEYS = ("state_mean", "state_std", "action_mean", "action_std")


class Processor:
    """Preprocessing for one policy; ``stats`` come from the training dataset."""

    def __init__(self, config: Any, stats: dict[str, Sequence[float]] | None = None):
        self.config = config
        self.set_stats(stats)
        self._token_cache: dict[str, torch.Tensor] = {}
        # drop the token columns that are padding in every row of a batch: every consumer masks
        # padding (attention keys, pooling) and text positions start at 0, so the outputs are those of
        # the full width (to rounding) at a fraction of the prefix's cost (False: the full width)
        self.trim_padding = True

    # ------------------------------------------------------------------ statistics
    def set_stats(self, stats: dict[str, Sequence[float]] | None) -> None:
        """Install normalisation statistics (identity when None)."""
        s, a = self.config.state_dim, self.config.action_dim
        stats = dict(stats or {})
        stats.setdefault("state_mean", [0.0] * s)
        stats.setdefault("state_std", [1.0] * s)
        stats.setdefault("action_mean", [0.0] * a)
        stats.setdefault("action_std", [1.0] * a)
        for key, size in (("state_mean", s), ("state_std", s), ("action_mean", a), ("action_std", a)):
            if len(stats[key]) != size:
                raise ValueError(f"stats[{key!r}] has {len(stats[key])} values, the policy expects {size}")
        self.stats = {k: [float(v) for v in stats[k]] for k in STAT_KEYS}
        self._t = {k: torch.tensor(self.stats[k], dtype=torch.float32) for k in STAT_KEYS}
        self._t["state_std"] = self._t["state_std"].clamp_min(float(self.config.state_std_floor))
        self._t["action_std"] = self._t["action_std"].clamp_min(1e-3)

    @staticmethod
    def stats_from_arrays(states: np.ndarray, actions: np.ndarray) -> dict[str, list[float]]:
        """Statistics from dataset arrays ``states [T, S]``, ``actions [T, A]``."""
        return {
            "state_mean": states.mean(0).tolist(),
            "state_std": states.std(0).tolist(),
            "action_mean": actions.mean(0).tolist(),
            "action_std": actions.std(0).tolist(),
        }

    def _stat(self, key: str, device: torch.device) -> torch.Tensor:
        t = self._t[key]
        if t.device != device:
            t = self._t[key] = t.to(device)
        return t

    # ------------------------------------------------------------------ transforms
    def images(self, rgb: torch.Tensor, device: torch.device) -> torch.Tensor:
        """uint8 ``[N, V, H, W, 3]`` -> float ``[N, V, 3, s, s]`` in ``[-1, 1]``."""
        if rgb.ndim != 5 or rgb.shape[-1] != 3:
            raise ValueError(f"rgb must be [N, V, H, W, 3], got {tuple(rgb.shape)}")
        if rgb.shape[1] != len(self.config.cameras):
            raise ValueError(
                f"rgb has {rgb.shape[1]} views, the policy expects {len(self.config.cameras)} ({self.config.cameras})"
            )
        n, v, h, w, _ = rgb.shape
        s = self.config.image_size
        if v == 0:  # a policy without cameras
            return torch.zeros((n, 0, 3, s, s), device=device)
        x = rgb.to(device).permute(0, 1, 4, 2, 3).reshape(n * v, 3, h, w).float() / 255.0
        if (h, w) != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        return (x * 2.0 - 1.0).reshape(n, v, 3, s, s)

    def state(self, state: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``[N, S]`` -> normalised ``[N, S]``, clipped to ``+-config.state_clip`` when it is > 0."""
        if state.shape[-1] != self.config.state_dim:
            raise ValueError(f"state has {state.shape[-1]} dims, the policy expects {self.config.state_dim}")
        z = (state.to(device).float() - self._stat("state_mean", device)) / self._stat("state_std", device)
        clip = float(self.config.state_clip)
        return z.clamp(-clip, clip) if clip > 0 else z

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[..., A]`` -> model space."""
        d = actions.device
        return (actions.float() - self._stat("action_mean", d)) / self._stat("action_std", d)

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Model space ``[..., A]`` -> env actions, clipped to ``[-1, 1]``."""
        d = actions.device
        return (actions * self._stat("action_std", d) + self._stat("action_mean", d)).clamp(-1.0, 1.0)

    def tokens(self, instructions: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte tokens ``[N, L]`` (int64) and padding mask ``[N, L]`` (True = padding); ``L`` is the
        longest instruction's byte count in the batch (at least 1), or ``max_text_len`` without
        :attr:`trim_padding`."""
        if isinstance(instructions, str):
            raise TypeError("instruction must be a list of N strings, not one string")
        rows = []
        for text in instructions:
            row = self._token_cache.get(text)
            if row is None:
                raw = list(text.encode("utf-8"))[: self.config.max_text_len]
                row = torch.zeros(self.config.max_text_len, dtype=torch.long)
                row[: len(raw)] = torch.tensor(raw, dtype=torch.long) + 1
                self._token_cache[text] = row
            rows.append(row)
        ids = torch.stack(rows)
        if self.trim_padding and len(rows):
            width = max(1, int((ids != 0).sum(1).max()))
            ids = ids[:, :width]
        ids = ids.to(device)
        return ids, ids == 0

    def check_obs(self, obs: dict[str, Any]) -> None:
        """Raise when ``obs`` lacks a key this policy reads, or its instructions do not match its batch."""
        needed = ("rgb", "state", "instruction") if self.config.cameras else ("state", "instruction")
        missing = [k for k in needed if k not in obs]
        if missing:
            raise KeyError(f"observation is missing {missing}; this policy needs {list(needed)}")
        n = obs["state"].shape[0]
        if len(obs["instruction"]) != n:
            raise ValueError(f"{len(obs['instruction'])} instructions for a batch of {n}")

    def prepare(self, obs: dict[str, Any], device: torch.device) -> dict[str, Any]:
        """All model inputs of a batch: ``images``, ``state``, ``tokens``, ``token_pad``, ``texts``."""
        self.check_obs(obs)
        tokens, pad = self.tokens(obs["instruction"], device)
        return {
            "images": self.images(obs_views(obs), device),
            "state": self.state(obs["state"], device),
            "tokens": tokens,
            "token_pad": pad,
            "texts": list(obs["instruction"]),
        }
