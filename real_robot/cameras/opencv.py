"""OpenCV cameras: a device index, a video file or a stream URL, resized/cropped to a policy view.

``read()`` returns an RGB uint8 ``[H, W, 3]`` frame, the frame counter and its timestamp. A camera
that returns no new frame for ``stall_timeout`` seconds raises :class:`CameraStalled` (the client
stops the episode rather than act on a frozen view).
"""

from __future__ import annotations

import time
from typing import Optional, Union

import cv2
import numpy as np

from real_robot.cameras.base import CameraConfig, CameraStalled, as_source, crop_box

__all__ = ["CameraStalled", "OpenCVCamera", "fit_view", "from_config"]


def fit_view(frame: np.ndarray, size: int, crop: Optional[tuple[int, int, int, int]] = None) -> np.ndarray:
    """Optional crop ``(x, y, w, h)``, then a centre crop to a square and a resize to ``size``."""
    if crop is not None:
        x, y, w, h = crop
        frame = frame[y : y + h, x : x + w]
    h, w = frame.shape[:2]
    s = min(h, w)
    y0, x0 = (h - s) // 2, (w - s) // 2
    frame = frame[y0 : y0 + s, x0 : x0 + s]
    interp = cv2.INTER_AREA if s > size else cv2.INTER_LINEAR
    return cv2.resize(frame, (size, size), interpolation=interp)


class OpenCVCamera:
    def __init__(
        self,
        source: Union[int, str],
        size: int,
        crop: Optional[tuple[int, int, int, int]] = None,
        stall_timeout: float = 0.5,
        loop: bool = False,
    ):
        self.source, self.size, self.crop, self.stall_timeout, self.loop = source, size, crop, stall_timeout, loop
        self._cap: Optional[cv2.VideoCapture] = None
        self.frame_id = 0
        self._last_ok = time.perf_counter()
        self._last: Optional[np.ndarray] = None

    def open(self) -> None:
        self._cap = cv2.VideoCapture(self.source)
        if not self._cap.isOpened():
            raise ConnectionError(f"cannot open camera {self.source!r}")
        self._last_ok = time.perf_counter()

    def read(self) -> tuple[np.ndarray, int, float]:
        """``(frame [size, size, 3] RGB uint8, frame counter, timestamp)``."""
        if self._cap is None:
            self.open()
        ok, frame = self._cap.read()
        if not ok and self.loop:
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = self._cap.read()
        now = time.perf_counter()
        if ok:
            self._last_ok = now
            self.frame_id += 1
            self._last = fit_view(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), self.size, self.crop)
        elif now - self._last_ok > self.stall_timeout or self._last is None:
            raise CameraStalled(f"camera {self.source!r}: no frame for {now - self._last_ok:.2f} s")
        return self._last, self.frame_id, now

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


def from_config(cfg: CameraConfig) -> OpenCVCamera:
    """``kind: opencv``: ``source`` is a device index, a video file or a stream URL."""
    return OpenCVCamera(as_source(cfg.source), cfg.size, crop=crop_box(cfg.crop), stall_timeout=cfg.stall_timeout_s)
