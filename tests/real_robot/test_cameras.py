"""The OpenCV camera (real_robot/cameras/opencv.py): frames from a video file, and the stall it reports."""

from __future__ import annotations

import time

import numpy as np
import pytest


def test_opencv_camera_from_a_file_and_stall(tmp_path):
    import cv2

    from real_robot.cameras.opencv import CameraStalled, OpenCVCamera

    path = str(tmp_path / "cam.avi")
    vw = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 20, (80, 60))
    for i in range(5):
        vw.write(np.full((60, 80, 3), i * 40, np.uint8))
    vw.release()
    cam = OpenCVCamera(path, size=32, stall_timeout=0.05)
    frames = [cam.read() for _ in range(5)]
    assert frames[-1][0].shape == (32, 32, 3) and [f[1] for f in frames] == [1, 2, 3, 4, 5]
    time.sleep(0.1)
    with pytest.raises(CameraStalled):
        cam.read()
    cam.close()
