"""MP4 videos with OpenCV: episodes for people to watch (camera views side by side, instruction and
step drawn on; lossy ``mp4v``) and the lossless camera streams of demonstration datasets (``ffv1``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np


def annotate_frame(views: Sequence[np.ndarray], lines: Sequence[str], scale: int = 2) -> np.ndarray:
    """Views ``[H, W, 3]`` RGB uint8 side by side, upscaled, with text lines in a bottom band.

    Returns an ``[H*scale + band, W*V*scale, 3]`` RGB frame.
    """
    row = np.concatenate(list(views), axis=1)
    row = cv2.resize(row, (row.shape[1] * scale, row.shape[0] * scale), interpolation=cv2.INTER_NEAREST)
    band = np.full((18 * max(1, len(lines)) + 6, row.shape[1], 3), 24, np.uint8)
    for k, text in enumerate(lines):
        cv2.putText(band, text, (6, 18 * (k + 1)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (235, 235, 235), 1, cv2.LINE_AA)
    return np.concatenate([row, band], axis=0)


# codec name -> (OpenCV fourcc, codec name ffprobe reports, pixel format the stream holds)
CODECS = {
    # MPEG-4 Part 2: small, lossy (yuv420p: chroma at half resolution, blocks); videos for people
    "mp4v": ("mp4v", "mpeg4", "yuv420p"),
    # FFV1: lossless intra-only; OpenCV stores 8-bit colour frames as bgra (no chroma subsampling),
    # so decoding gives back the written frames bit for bit, whatever the FFmpeg build
    "ffv1": ("FFV1", "ffv1", "bgra"),
}


class VideoWriter:
    """Writes RGB frames to an mp4 (``codec``: one of :data:`CODECS`, default the lossy ``mp4v`` for
    videos people watch; ``ffv1`` for frames a model trains on); the file is complete once
    :meth:`close` returns."""

    def __init__(self, path: str | os.PathLike, fps: float, codec: str = "mp4v"):
        if codec not in CODECS:
            raise ValueError(f"codec={codec!r}: choose one of {', '.join(CODECS)}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps = fps
        self.codec = codec
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] = (0, 0)
        self.frames = 0

    def write(self, frame: np.ndarray) -> None:
        """Append one ``[H, W, 3]`` RGB uint8 frame (every frame the size of the first)."""
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"{self.path}: frames must be [H, W, 3] uint8 RGB, got {frame.dtype} {frame.shape}")
        if self._writer is not None and frame.shape[:2] != self._size:
            # OpenCV would drop the frame without a word, shifting every later frame of the file
            raise ValueError(f"{self.path}: frame of size {frame.shape[:2]}, the video's is {self._size}")
        if self._writer is None:
            h, w = frame.shape[:2]
            self._size = (h, w)
            fourcc = CODECS[self.codec][0]
            self._writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*fourcc), self.fps, (w, h))
            if not self._writer.isOpened():
                raise RuntimeError(f"OpenCV could not open a {self.codec} video writer for {self.path} "
                                   "(its FFmpeg backend lacks the encoder?)")
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def count_frames(path: str | os.PathLike) -> int:
    """Number of frames OpenCV can decode from a video file (0 if unreadable)."""
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.isOpened():
        ok, _ = cap.read()
        if not ok:
            break
        n += 1
    cap.release()
    return n
