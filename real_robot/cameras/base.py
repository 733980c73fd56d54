"""The camera contract the robot adapters read, and the options that pick and build a camera.

A camera ``open()``s, ``read()``s ``(frame [size, size, 3] RGB uint8, frame counter, timestamp)`` (the
counter moves only with a new frame; a camera with no new frame for ``stall_timeout`` seconds raises
:class:`CameraStalled`) and ``close()``s. :data:`CAMERAS` names the kinds; :func:`make_camera` builds
one from a :class:`CameraConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from sims.registry import Registry, load_attr


class CameraStalled(RuntimeError):
    """No fresh frame from a camera within its timeout."""


class Camera(Protocol):
    size: int  # the square view's side (pixels)

    def open(self) -> None: ...

    def read(self) -> tuple[np.ndarray, int, float]:
        """``(frame [size, size, 3] RGB uint8, frame counter, timestamp)``."""
        ...

    def close(self) -> None: ...


@dataclass
class CameraConfig:
    """One camera of a real arm (``embodied-deploy cameras=[{name: wrist, kind: realsense, source: "..."}]``)."""

    name: str = "agentview"  # the view's name, as the policy knows it
    kind: str = "opencv"  # opencv | realsense
    source: str = ""  # opencv: device index, video file or stream URL; realsense: serial number; "": the first device
    size: int = 224  # the square view the policy gets (pixels)
    width: int = 640  # realsense: the colour stream's resolution and rate
    height: int = 480
    fps: int = 30
    crop: Optional[list[int]] = None  # x y w h of the frame to keep before the centre square crop
    stall_timeout_s: float = 0.5  # no new frame this long: the camera is stalled


#: camera kinds: ``"module:factory"``, each factory taking a :class:`CameraConfig`
CAMERAS: Registry[str] = Registry(
    "camera kind",
    {
        "opencv": "real_robot.cameras.opencv:from_config",
        "realsense": "real_robot.cameras.realsense:from_config",
    },
)


def make_camera(cfg: CameraConfig) -> Camera:
    """The camera ``cfg`` describes (not opened yet)."""
    return load_attr(CAMERAS.lookup(cfg.kind))(cfg)


def make_cameras(cfgs: list[CameraConfig]) -> dict[str, Camera]:
    """``{name: camera}`` for camera configs with distinct names."""
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise ValueError(f"camera names must differ, got {names}")
    return {c.name: make_camera(c) for c in cfgs}


def read_views(cameras: dict[str, Camera]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One frame of every camera: ``(images {name: [H, W, 3] uint8}, frame_ids {name: counter})``."""
    images, ids = {}, {}
    for name, cam in cameras.items():
        images[name], ids[name], _ = cam.read()
    return images, ids


def as_source(text: str) -> int | str:
    """A device index for OpenCV when ``text`` is a number (empty: device 0), else the file or URL itself."""
    text = text.strip()
    return int(text or 0) if text.isdigit() or not text else text


def crop_box(crop: Optional[list[int]]) -> Optional[tuple[int, int, int, int]]:
    return None if not crop else (int(crop[0]), int(crop[1]), int(crop[2]), int(crop[3]))
