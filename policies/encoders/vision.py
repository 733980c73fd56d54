"""A small CNN over every camera view (shared weights), trained from scratch: CPU friendly."""

from __future__ import annotations

import torch
from torch import nn


class SpatialKeypoints(nn.Module):
    """Spatial-softmax keypoints: ``[B, C, h, w]`` features -> ``[B, K, d]`` tokens.

    Each of the K maps of a 1x1 convolution is turned into a distribution over the feature map's
    cells by a softmax (learned temperature); its token carries the expected position ``(x, y)``
    in ``[-1, 1]`` and the features pooled under that distribution. Unlike average pooling onto a
    coarse grid, the expectation keeps sub-cell precision: what lets a small CNN say *where* a
    2-4 pixel object is (the readout robomimic and Diffusion Policy use for manipulation).
    """

    def __init__(self, channels: int, num_keypoints: int, d_model: int):
        super().__init__()
        self.attend = nn.Conv2d(channels, num_keypoints, kernel_size=1)
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.pos = nn.Linear(2, d_model)
        self.feat = nn.Linear(channels, d_model)
        self.emb = nn.Parameter(torch.randn(1, num_keypoints, d_model) * 0.02)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        b, c, h, w = feat.shape
        logits = self.attend(feat).flatten(2) / self.log_temperature.exp()  # [B, K, h*w]
        attn = logits.softmax(dim=-1)
        ys = torch.linspace(-1.0, 1.0, h, device=feat.device, dtype=feat.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=feat.device, dtype=feat.dtype)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(h * w, 2)  # (x, y) per cell
        xy = attn @ grid  # [B, K, 2]
        pooled = attn @ feat.flatten(2).transpose(1, 2)  # [B, K, C]
        return self.pos(xy) + self.feat(pooled) + self.emb


class ViewEncoder(nn.Module):
    """``[N, V, 3, s, s]`` images -> ``[N, V * (G * G + K), d]`` tokens per view: a G x G grid of
    average-pooled features, then ``K`` spatial-softmax keypoint tokens (``keypoints=0``: none)."""

    def __init__(self, channels: list[int], d_model: int, num_views: int, grid: int = 4, keypoints: int = 0):
        super().__init__()
        if keypoints < 0:
            raise ValueError(f"vision_keypoints must be >= 0, got {keypoints}")
        layers: list[nn.Module] = []
        c_in = 3
        for i, c in enumerate(channels):
            layers += [
                nn.Conv2d(c_in, c, kernel_size=5 if i == 0 else 3, stride=2, padding=2 if i == 0 else 1),
                nn.GroupNorm(min(8, c), c),
                nn.GELU(),
            ]
            c_in = c
        self.cnn = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.proj = nn.Linear(c_in, d_model)
        self.keypoints = SpatialKeypoints(c_in, keypoints, d_model) if keypoints else None
        self.view_emb = nn.Parameter(torch.zeros(num_views, 1, d_model))
        self.pos_emb = nn.Parameter(torch.randn(1, grid * grid, d_model) * 0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n, v = images.shape[:2]
        fmap = self.cnn(images.flatten(0, 1))  # [N*V, C, h, w]
        tokens = self.proj(self.pool(fmap).flatten(2).transpose(1, 2)) + self.pos_emb  # [N*V, G*G, d]
        if self.keypoints is not None:
            tokens = torch.cat([tokens, self.keypoints(fmap)], dim=1)  # [N*V, G*G + K, d]
        tokens = tokens.reshape(n, v, -1, tokens.shape[-1]) + self.view_emb
        return tokens.flatten(1, 2)
