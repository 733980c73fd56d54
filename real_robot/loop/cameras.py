"""Camera-stall detection: a camera whose frame counter stops moving for ``stall_timeout_s`` is stalled."""

from __future__ import annotations

import time
from typing import Callable, Optional


class CameraMonitor:
    """Remembers each camera's last frame id and when it changed; one monitor per episode."""

    def __init__(self, stall_timeout_s: float, clock: Callable[[], float] = time.perf_counter):
        if stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {stall_timeout_s}")
        self.stall_timeout_s, self.clock = stall_timeout_s, clock
        self._last: dict[str, tuple[int, float]] = {}  # camera -> (frame id, when it was first seen)

    def stalled(self, frame_ids: dict[str, int]) -> Optional[str]:
        """The first camera in ``frame_ids`` (camera -> frame counter) stalled for over the timeout, or None."""
        now = self.clock()
        for cam, fid in frame_ids.items():
            prev = self._last.get(cam)
            if prev is None or prev[0] != fid:
                self._last[cam] = (fid, now)
            elif now - prev[1] > self.stall_timeout_s:
                return cam
        return None
