"""The RealSense camera (real_robot/cameras/realsense.py) against a recording stand-in of
``pyrealsense2`` (no camera on this machine): the stream it asks for, the RGB frames it returns at
the policy's size, its counter that moves only with a new device frame, and its stall."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from real_robot.cameras.base import CameraConfig, CameraStalled, make_cameras
from real_robot.cameras.realsense import RealSenseCamera


def fake_rs():
    """A stand-in ``pyrealsense2``: a pipeline whose frames the test queues as ``(number, image)``."""
    calls: list[tuple] = []
    queue: list[tuple[int, np.ndarray]] = []

    class Frame:
        def __init__(self, number, image):
            self.number, self.image = number, image

        def get_frame_number(self):
            return self.number

        def get_data(self):
            return self.image

    class FrameSet:
        def __init__(self, frame):
            self.frame = frame

        def __bool__(self):
            return self.frame is not None

        def get_color_frame(self):
            return self.frame

    class config:
        def enable_device(self, serial):
            calls.append(("enable_device", serial))

        def enable_stream(self, stream, width, height, fmt, fps):
            calls.append(("enable_stream", stream, width, height, fmt, fps))

    class pipeline:
        def start(self, cfg):
            calls.append(("start",))

        def try_wait_for_frames(self, timeout_ms):
            calls.append(("try_wait_for_frames", timeout_ms))
            return (True, FrameSet(Frame(*queue.pop(0)))) if queue else (False, None)

        def poll_for_frames(self):
            return FrameSet(Frame(*queue.pop(0)) if queue else None)

        def stop(self):
            calls.append(("stop",))

    rs = SimpleNamespace(
        config=config, pipeline=pipeline, stream=SimpleNamespace(color="color"), format=SimpleNamespace(rgb8="rgb8")
    )
    return rs, calls, queue


def test_realsense_frames_counter_and_stall():
    rs, calls, queue = fake_rs()
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, 8:56] = (200, 10, 10)  # the centre square red: what survives the crop
    queue += [(7, image), (7, image), (8, image)]
    cam = RealSenseCamera("123456789012", size=32, width=64, height=48, fps=15, stall_timeout=0.05, rs=rs)
    frame, fid, _ = cam.read()
    assert calls[:3] == [("enable_device", "123456789012"), ("enable_stream", "color", 64, 48, "rgb8", 15), ("start",)]
    assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8 and fid == 1
    assert (frame[..., 0] == 200).all()  # RGB as the device sends it (no BGR swap)
    assert cam.read()[1] == 1  # the device's frame 7 again: no new frame
    assert cam.read()[1] == 2
    time.sleep(0.08)
    with pytest.raises(CameraStalled):
        cam.read()
    cam.close()
    assert calls[-1] == ("stop",)


def test_cameras_from_config_and_a_camera_that_never_sends():
    cams = make_cameras([CameraConfig(name="wrist", kind="realsense", size=96), CameraConfig(name="front", source="3")])
    assert isinstance(cams["wrist"], RealSenseCamera) and cams["wrist"].serial == "" and cams["front"].source == 3
    with pytest.raises(ValueError, match="camera names must differ"):
        make_cameras([CameraConfig(name="a"), CameraConfig(name="a", kind="realsense")])
    rs, calls, queue = fake_rs()
    cam = RealSenseCamera("", size=32, rs=rs)
    with pytest.raises(CameraStalled):
        cam.read()
    assert ("enable_device", "") not in calls and calls[-1] == ("try_wait_for_frames", 5000)
