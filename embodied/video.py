"""MP4 videos: episodes for people to watch (camera views side by side, instruction and step drawn
on; H.264 (``h264``, libx264, yuv420p: what browsers, TensorBoard and W&B play), or MPEG-4 part 2
(``mp4v``) through OpenCV where no libx264 is installed) and the camera streams of demonstration
datasets, stored
losslessly: HEVC in its lossless mode on planar RGB (``hevc``, the default of new datasets; a codec
LeRobot's tools re-encode with) or FFV1 (``ffv1``, datasets written before, and the fallback where
no HEVC encoder is installed).

Lossless HEVC is libx265 with ``x265-params lossless=1`` on ``gbrp`` frames (8-bit R, G, B planes: no
RGB -> YUV conversion, no chroma subsampling), every frame intra-coded (see :data:`HEVC_GOP`), so the
decoders give back the written frames bit for bit. OpenCV's FFmpeg has no libx265 encoder: it is
driven through PyAV where installed (as LeRobot does; ``.venv-lerobot``) or else an ``ffmpeg``
executable that has libx265 (imageio-ffmpeg's, or one on the PATH). OpenCV's FFmpeg decodes HEVC."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

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


# codec name -> (OpenCV fourcc or None when OpenCV cannot write it, codec name ffprobe reports,
# pixel format the stream holds)
CODECS = {
    # H.264 (libx264, yuv420p, the moov atom first): lossy; the videos for people, which every browser plays
    "h264": (None, "h264", "yuv420p"),
    # MPEG-4 Part 2: small, lossy (yuv420p: chroma at half resolution, blocks); browsers do not play it
    "mp4v": ("mp4v", "mpeg4", "yuv420p"),
    # FFV1: lossless intra-only; OpenCV stores 8-bit colour frames as bgra (no chroma subsampling),
    # so decoding gives back the written frames bit for bit, whatever the FFmpeg build. LeRobot's
    # tools refuse to re-encode it (their codecs: h264, hevc, libsvtav1, libaom-av1, hardware ones).
    "ffv1": ("FFV1", "ffv1", "bgra"),
    # HEVC, lossless (libx265 lossless=1) on planar RGB: bit for bit too, and a codec LeRobot accepts
    "hevc": (None, "hevc", "gbrp"),
}
LOSSLESS_CODECS = ("hevc", "ffv1")
# The encoder settings of lossless HEVC, recorded in a dataset's info.json the way LeRobot records its
# own (``video.g``, ``video.extra_options``), so LeRobot's tools re-encode with the same settings.
# Intra-only (GOP 1), like FFV1: x265's lossless *inter* frames do not always decode to the input
# (libx265 in PyAV 15's wheels and in imageio-ffmpeg's ffmpeg 9, FFmpeg's decoder: at 16, 32 and 64 px a
# few frames of a 64-frame clip came back with 5x5-pixel blocks off by up to 174; at 24, 48, 96 and
# 160 px none did), while intra frames came back exact at every size tried. No B-frames (should a GOP
# be raised), x265's own log quiet.
HEVC_GOP = 1
HEVC_X265_PARAMS = "lossless=1:bframes=0:log-level=error"


def is_lossless(info: dict[str, Any]) -> bool:
    """Whether a video feature's ``info`` block (info.json) describes a lossless stream."""
    codec, pix_fmt = info.get("video.codec"), info.get("video.pix_fmt")
    if codec == "ffv1":
        return pix_fmt in ("bgra", "bgr0", "rgb24", "bgr24", "gbrp", "rgba")
    if codec == "hevc":  # lossless x265 on planar RGB, intra-only (see HEVC_GOP)
        params = str((info.get("video.extra_options") or {}).get("x265-params", ""))
        return pix_fmt == "gbrp" and "lossless=1" in params.split(":") and info.get("video.g") == 1
    return False


@functools.lru_cache(maxsize=None)
def ffmpeg_executable(encoder: str = "libx265") -> str | None:
    """An ``ffmpeg`` executable with ``encoder`` (imageio-ffmpeg's, else one on the PATH), or None."""
    candidates = []
    try:
        import imageio_ffmpeg

        candidates.append(imageio_ffmpeg.get_ffmpeg_exe())
    except Exception:  # not installed, or its binary missing
        pass
    if shutil.which("ffmpeg"):
        candidates.append(shutil.which("ffmpeg"))
    for exe in candidates:
        try:
            out = subprocess.run([exe, "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if f" {encoder} " in out:
            return exe
    return None


@functools.lru_cache(maxsize=None)
def _pyav_has_libx265() -> bool:
    try:
        import av

        return "gbrp" in [f.name for f in (av.codec.Codec("libx265", "w").video_formats or [])]
    except Exception:  # PyAV missing, or its FFmpeg without libx265
        return False


def hevc_backend() -> str | None:
    """How lossless HEVC gets encoded here: ``"pyav"``, ``"ffmpeg"`` (a subprocess), or None (no encoder)."""
    if _pyav_has_libx265():
        return "pyav"
    if ffmpeg_executable() is not None:
        return "ffmpeg"
    return None


class _PyAVHevc:
    def __init__(self, path: Path, fps: float, width: int, height: int):
        import av

        self._out = av.open(str(path), "w")
        self._stream = self._out.add_stream(
            "libx265",
            rate=Fraction(fps).limit_denominator(1000),
            options={"g": str(HEVC_GOP), "x265-params": HEVC_X265_PARAMS},
        )
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "gbrp"
        self._av = av

    def write(self, frame: np.ndarray) -> None:
        vf = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(format="gbrp")
        for packet in self._stream.encode(vf):
            self._out.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode():
            self._out.mux(packet)
        self._out.close()


#: the ffmpeg output options of each codec it encodes here: lossless HEVC (see :data:`HEVC_GOP`), and H.264
#: for watching (yuv420p, the index at the front so a browser starts playing before the whole file is in;
#: quality 23, libx264's default)
FFMPEG_OUTPUT = {
    "hevc": ["-c:v", "libx265", "-pix_fmt", "gbrp", "-g", str(HEVC_GOP), "-x265-params", HEVC_X265_PARAMS],
    "h264": ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "23", "-preset", "veryfast", "-movflags", "+faststart"],
}
ENCODERS = {"hevc": "libx265", "h264": "libx264"}


class _FFmpegWriter:
    """Raw RGB frames piped into an ``ffmpeg`` process that encodes ``codec`` (:data:`FFMPEG_OUTPUT`)."""

    def __init__(self, path: Path, fps: float, width: int, height: int, codec: str = "hevc"):
        exe = ffmpeg_executable(ENCODERS[codec])
        if exe is None:
            raise RuntimeError(f"no ffmpeg executable with {ENCODERS[codec]} found")
        self.path = path
        self._log = tempfile.TemporaryFile()
        rate = Fraction(fps).limit_denominator(1000)
        self._proc = subprocess.Popen(
            [
                exe,
                "-y",
                "-nostdin",
                "-hide_banner",
                "-loglevel",
                "error",
                "-f",
                "rawvideo",
                "-pix_fmt",
                "rgb24",
                "-s",
                f"{width}x{height}",
                "-framerate",
                f"{rate.numerator}/{rate.denominator}",
                "-i",
                "pipe:0",
                "-an",
                *FFMPEG_OUTPUT[codec],
                "-f",
                "mp4",
                str(path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def _failure(self) -> RuntimeError:
        self._log.seek(0)
        return RuntimeError(f"ffmpeg failed to encode {self.path}: {self._log.read().decode(errors='replace')[-2000:]}")

    def write(self, frame: np.ndarray) -> None:
        try:
            self._proc.stdin.write(np.ascontiguousarray(frame).tobytes())
        except BrokenPipeError:
            self._proc.wait()
            raise self._failure() from None

    def close(self) -> None:
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        if self._proc.wait() != 0:
            raise self._failure()
        self._log.close()


def watch_codec() -> str:
    """The codec of videos for people: ``h264`` where an ffmpeg with libx264 is installed (imageio-ffmpeg's
    is), else OpenCV's ``mp4v``."""
    return "h264" if ffmpeg_executable("libx264") is not None else "mp4v"


class VideoWriter:
    """Writes RGB frames to an mp4 (``codec``: one of :data:`CODECS`, default :func:`watch_codec`, H.264 for
    videos people watch; ``hevc`` (lossless) or ``ffv1`` for frames a model trains on); the file is
    complete once :meth:`close` returns. ``backend`` (``hevc`` only): ``"pyav"`` or ``"ffmpeg"``, default
    :func:`hevc_backend`. H.264 frames of an odd width or height get one black column or row (yuv420p
    needs even sizes)."""

    def __init__(self, path: str | os.PathLike, fps: float, codec: str | None = None, backend: str | None = None):
        codec = watch_codec() if codec is None else codec
        if codec not in CODECS:
            raise ValueError(f"codec={codec!r}: choose one of {', '.join(CODECS)}")
        if codec == "h264" and ffmpeg_executable("libx264") is None:
            raise RuntimeError("H.264 needs an ffmpeg with libx264 (imageio-ffmpeg ships one); or write codec='mp4v'")
        if codec == "hevc":
            backend = backend or hevc_backend()
            if backend not in ("pyav", "ffmpeg"):
                raise RuntimeError(
                    "lossless HEVC needs libx265: install PyAV (pip install av) or imageio-ffmpeg, "
                    "or put an ffmpeg with libx265 on the PATH; or write codec='ffv1'"
                )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps = fps
        self.codec = codec
        self.backend = backend if codec == "hevc" else "ffmpeg" if codec == "h264" else "opencv"
        self._writer: Any = None
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
            if self.codec == "hevc" and self.backend == "pyav":
                self._writer = _PyAVHevc(self.path, self.fps, w, h)
            elif self.codec in FFMPEG_OUTPUT:
                self._writer = _FFmpegWriter(
                    self.path,
                    self.fps,
                    w + w % 2 * (self.codec == "h264"),
                    h + h % 2 * (self.codec == "h264"),
                    self.codec,
                )
            else:
                fourcc = CODECS[self.codec][0]
                self._writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*fourcc), self.fps, (w, h))
                if not self._writer.isOpened():
                    raise RuntimeError(
                        f"OpenCV could not open a {self.codec} video writer for {self.path} "
                        "(its FFmpeg backend lacks the encoder?)"
                    )
        if self.codec == "h264" and (frame.shape[0] % 2 or frame.shape[1] % 2):
            frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)))
        if self.codec in FFMPEG_OUTPUT:
            self._writer.write(frame)
        else:
            self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.release() if isinstance(writer, cv2.VideoWriter) else writer.close()

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def video_codec(path: str | os.PathLike) -> str | None:
    """The codec of a video file's stream as ffprobe names it (``hevc``, ``ffv1``, ``mpeg4``, ``av1``,
    ``h264``), from OpenCV's FOURCC; None if unreadable."""
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            return None
        tag = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("ascii", "replace").strip("\x00 ").lower()
    finally:
        cap.release()
    return {
        "hev1": "hevc",
        "hvc1": "hevc",
        "hevc": "hevc",
        "ffv1": "ffv1",
        "mp4v": "mpeg4",
        "fmp4": "mpeg4",
        "av01": "av1",
        "avc1": "h264",
        "h264": "h264",
    }.get(tag, tag)


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
