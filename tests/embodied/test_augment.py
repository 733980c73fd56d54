"""Random-shift augmentation of the training images (embodied/data/augment.py)."""

from __future__ import annotations

import pytest
import torch

from embodied.data.augment import random_shift


def test_random_shift_is_a_translation_with_repeated_borders():
    s = 12
    rgb = torch.arange(3 * 2 * s * s * 3, dtype=torch.int64).reshape(3, 2, s, s, 3)
    gen = torch.Generator().manual_seed(1)
    out = random_shift(rgb, 3, gen)
    assert out.shape == rgb.shape and out.dtype == rgb.dtype
    for b in range(3):
        for v in range(2):
            img, shifted = rgb[b, v], out[b, v]
            # the shifted image equals the original translated by one (dy, dx) in [-3, 3]^2,
            # indices past the border clamped (replicate padding then crop)
            matches = []
            for dy in range(-3, 4):
                for dx in range(-3, 4):
                    rows = (torch.arange(s) + dy).clamp(0, s - 1)
                    cols = (torch.arange(s) + dx).clamp(0, s - 1)
                    if torch.equal(img[rows][:, cols], shifted):
                        matches.append((dy, dx))
            assert len(matches) == 1
    # views and samples get their own offsets; the same generator state gives the same result
    assert not all(torch.equal(out[b, v], out[0, 0] - rgb[0, 0] + rgb[b, v]) for b in range(3) for v in range(2))
    assert torch.equal(out, random_shift(rgb, 3, torch.Generator().manual_seed(1)))
    assert random_shift(rgb, 0, gen) is rgb
    with pytest.raises(ValueError, match="pad must be >= 0"):
        random_shift(rgb, -1, gen)
