"""Intel RealSense colour cameras (``pyrealsense2``), behind the same contract as the OpenCV camera.

The colour stream runs as ``width x height`` RGB at ``fps``; ``read()`` takes the newest frame the
pipeline holds without waiting (the frame counter moves only with a new frame, so a camera that
stops sending shows up in the client's stall monitor), crops and resizes it to the policy's square
view, and raises :class:`CameraStalled` after ``stall_timeout`` seconds without a new frame. Only the
first read waits for a frame (up to ``first_frame_timeout`` seconds).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any, Optional

import numpy as np

from real_robot.cameras.base import CameraConfig, CameraStalled, crop_box
from real_robot.cameras.opencv import fit_view
from real_robot.robots.vendor import require


class RealSenseCamera:
    def __init__(
        self,
        serial: str,
        size: int,
        width: int = 640,
        height: int = 480,
        fps: int = 30,
        crop: Optional[tuple[int, int, int, int]] = None,
        stall_timeout: float = 0.5,
        first_frame_timeout: float = 5.0,
        rs: Optional[ModuleType] = None,
    ):
        """``rs``: the ``pyrealsense2`` module (imported on :meth:`open` when None; a test passes a stand-in)."""
        self.serial, self.size, self.crop = serial, size, crop
        self.width, self.height, self.fps = width, height, fps
        self.stall_timeout, self.first_frame_timeout = stall_timeout, first_frame_timeout
        self._rs = rs
        self._pipe: Any = None
        self.frame_id = 0
        self._number: Optional[int] = None  # the device's own counter of the last frame taken
        self._last: Optional[np.ndarray] = None
        self._last_ok = time.perf_counter()

    def open(self) -> None:
        rs = self._rs = self._rs or require("pyrealsense2", "the RealSense camera")
        config = rs.config()
        if self.serial:
            config.enable_device(self.serial)
        config.enable_stream(rs.stream.color, self.width, self.height, rs.format.rgb8, self.fps)
        self._pipe = rs.pipeline()
        try:
            self._pipe.start(config)
        except RuntimeError as err:
            self._pipe = None
            raise ConnectionError(f"cannot start RealSense camera {self.serial or '(first found)'}: {err}") from err
        self._last_ok = time.perf_counter()

    def _take(self, frames: Any, now: float) -> None:
        color = frames.get_color_frame() if frames else None
        if not color:
            return
        number = int(color.get_frame_number())
        if number == self._number:
            return
        self._number, self._last_ok = number, now
        self.frame_id += 1
        self._last = fit_view(np.asanyarray(color.get_data()), self.size, self.crop)

    def read(self) -> tuple[np.ndarray, int, float]:
        """``(frame [size, size, 3] RGB uint8, frame counter, timestamp)``."""
        if self._pipe is None:
            self.open()
        if self._last is None:
            ok, frames = self._pipe.try_wait_for_frames(int(self.first_frame_timeout * 1000))
            self._take(frames if ok else None, time.perf_counter())
        else:
            self._take(self._pipe.poll_for_frames(), time.perf_counter())
        now = time.perf_counter()
        if self._last is None or now - self._last_ok > self.stall_timeout:
            raise CameraStalled(
                f"RealSense camera {self.serial or '(first found)'}: no frame for {now - self._last_ok:.2f} s"
            )
        return self._last, self.frame_id, now

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.stop()
            self._pipe = None


def from_config(cfg: CameraConfig) -> RealSenseCamera:
    """``kind: realsense``: ``source`` is the serial number (empty: the first camera found)."""
    return RealSenseCamera(
        cfg.source.strip(),
        cfg.size,
        width=cfg.width,
        height=cfg.height,
        fps=cfg.fps,
        crop=crop_box(cfg.crop),
        stall_timeout=cfg.stall_timeout_s,
    )
