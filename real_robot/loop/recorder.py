"""What each control period saw and sent, kept for the demonstration dataset."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from real_robot.robots.base import Observation


class EpisodeRecorder:
    """Per period: ``states`` ``[S]``, ``actions`` ``[A]`` (float32, as sent or held) and ``images``
    camera -> ``[H, W, 3]`` of ``cameras``; records nothing when not ``enabled``."""

    def __init__(self, cameras: Sequence[str], enabled: bool = True):
        self.cameras, self.enabled = tuple(cameras), enabled
        self.states: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.images: list[dict[str, np.ndarray]] = []

    def add(self, obs: Observation, sent: np.ndarray) -> None:
        if not self.enabled:
            return
        self.states.append(obs.state.copy())
        self.actions.append(sent.astype(np.float32))
        self.images.append({c: obs.images[c] for c in self.cameras})
