"""Action <-> token discretisation (OpenVLA-style): ``num_bins`` uniform bins over ``[-1, 1]``.

Bin ``b`` covers ``[-1 + b*w, -1 + (b+1)*w)`` with width ``w = 2 / num_bins`` (the last bin also
holds ``+1``); it decodes to its center ``-1 + (b + 0.5) * w``. So for any action in ``[-1, 1]``,
``|bins_to_actions(actions_to_bins(a)) - a| <= w / 2``. Actions outside ``[-1, 1]`` are clipped
first (the env clips them too). These are pure functions of tensors, on any device.
"""

from __future__ import annotations

import torch


def bin_width(num_bins: int) -> float:
    """Width of one bin, ``2 / num_bins``."""
    return 2.0 / num_bins


def actions_to_bins(actions: torch.Tensor, num_bins: int = 256) -> torch.Tensor:
    """Float actions ``[...]`` in ``[-1, 1]`` -> int64 bin indices ``[...]`` in ``[0, num_bins)``.

    Raises ``ValueError`` on non-finite actions (they have no bin).
    """
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2, got {num_bins}")
    if not bool(torch.isfinite(actions).all()):
        raise ValueError("actions contain NaN or inf; they cannot be discretised")
    a = actions.float().clamp(-1.0, 1.0)
    bins = torch.floor((a + 1.0) / bin_width(num_bins)).long()
    return bins.clamp_(0, num_bins - 1)


def bins_to_actions(bins: torch.Tensor, num_bins: int = 256) -> torch.Tensor:
    """Int bin indices ``[...]`` -> float32 bin centers ``[...]`` in ``(-1, 1)``."""
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2, got {num_bins}")
    return -1.0 + (bins.float() + 0.5) * bin_width(num_bins)
