"""Videos for people to watch (embodied/video.py): H.264 that browsers, TensorBoard and W&B play."""

from __future__ import annotations

import cv2
import numpy as np

from embodied.video import VideoWriter, annotate_frame, count_frames, video_codec, watch_codec


def test_videos_for_people_are_h264_with_every_frame(tmp_path):
    assert watch_codec() == "h264"  # imageio-ffmpeg's ffmpeg has libx264
    rng = np.random.default_rng(0)
    frames = [
        annotate_frame([rng.integers(0, 256, (33, 33, 3), dtype=np.uint8)] * 2, ["put the bowl", f"step {k}"])
        for k in range(12)
    ]
    with VideoWriter(tmp_path / "episode.mp4", fps=20.0) as writer:
        for frame in frames:
            writer.write(frame)
    path = tmp_path / "episode.mp4"
    assert video_codec(path) == "h264" and count_frames(path) == 12
    cap = cv2.VideoCapture(str(path))
    ok, first = cap.read()
    cap.release()
    h, w = frames[0].shape[:2]
    assert ok and first.shape[:2] == (h + h % 2, w + w % 2)  # yuv420p: an odd size gains one black row/column
    # lossy, but the picture is the frame's: the mean error of a still region stays small
    assert np.abs(first[:h, :w, ::-1].astype(int) - frames[0].astype(int)).mean() < 12
    assert path.read_bytes()[4:8] == b"ftyp" and path.read_bytes().find(b"moov") < path.read_bytes().find(b"mdat")


def test_odd_sized_frames_and_the_mp4v_fallback(tmp_path):
    frame = np.full((31, 45, 3), 200, np.uint8)
    with VideoWriter(tmp_path / "odd.mp4", fps=10.0, codec="h264") as writer:
        writer.write(frame)
        writer.write(frame)
    assert video_codec(tmp_path / "odd.mp4") == "h264" and count_frames(tmp_path / "odd.mp4") == 2
    with VideoWriter(tmp_path / "old.mp4", fps=10.0, codec="mp4v") as writer:
        writer.write(frame)
    assert video_codec(tmp_path / "old.mp4") == "mpeg4"
