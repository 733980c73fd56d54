"""A small CNN over every camera view (shared weights), trained from scratch: CPU friendly."""

from __future__ import annotations

import torch
from torch import nn


class ViewEncoder(nn.Module):
    """``[N, V, 3, s, s]`` images -> ``[N, V * G * G, d]`` tokens (G x G grid per view)."""

    def __init__(self, channels: list[int], d_model: int, num_views: int, grid: int = 4):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i, c in enumerate(channels):
            layers += [
                nn.Conv2d(c_in, c, kernel_size=5 if i == 0 else 3, stride=2, padding=2 if i == 0 else 1),
                nn.GroupNorm(min(8, c), c),
                nn.GELU(),
            ]
            c_in = c
        self.cnn = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(grid))
        self.proj = nn.Linear(c_in, d_model)
        self.view_emb = nn.Parameter(torch.zeros(num_views, 1, d_model))
        self.pos_emb = nn.Parameter(torch.randn(1, grid * grid, d_model) * 0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n, v = images.shape[:2]
        feat = self.cnn(images.flatten(0, 1))  # [N*V, C, G, G]
        tokens = self.proj(feat.flatten(2).transpose(1, 2))  # [N*V, G*G, d]
        tokens = tokens.reshape(n, v, -1, tokens.shape[-1]) + self.pos_emb + self.view_emb
        return tokens.flatten(1, 2)
