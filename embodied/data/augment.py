"""Image augmentation for supervised fine-tuning.

``random_shift`` is DrQ's random shift: every view of every sample is translated by an integer
offset in ``[-pad, pad]`` pixels on each axis, the border pixels repeated into the gap (the
same as replicate-padding by ``pad`` and cropping back at a random position). It teaches a
small CNN to read positions relative to what is in the image rather than absolute pixels, which
is what few-shot behaviour cloning overfits on first.
"""

from __future__ import annotations

import torch


def random_shift(rgb: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each view of ``rgb`` ``[B, V, s, s, C]`` (any dtype) by its own offset; same shape.

    ``pad=0`` returns ``rgb`` unchanged. Offsets are drawn from ``generator`` (CPU), one
    ``(dy, dx)`` per sample and view.
    """
    if pad < 0:
        raise ValueError(f"random_shift: pad must be >= 0, got {pad}")
    if pad == 0:
        return rgb
    if rgb.dim() != 5 or rgb.shape[2] != rgb.shape[3]:
        raise ValueError(f"random_shift expects square images [B, V, s, s, C], got {tuple(rgb.shape)}")
    b, v, s = rgb.shape[0], rgb.shape[1], rgb.shape[2]
    flat = rgb.reshape(b * v, s, s, rgb.shape[-1])
    offsets = torch.randint(-pad, pad + 1, (b * v, 2), generator=generator).to(rgb.device)
    base = torch.arange(s, device=rgb.device)
    rows = (base[None, :] + offsets[:, :1]).clamp_(0, s - 1)  # [BV, s]
    cols = (base[None, :] + offsets[:, 1:]).clamp_(0, s - 1)
    which = torch.arange(b * v, device=rgb.device)[:, None, None]
    out = flat[which, rows[:, :, None], cols[:, None, :]]  # [BV, s, s, C]
    return out.reshape(rgb.shape)
