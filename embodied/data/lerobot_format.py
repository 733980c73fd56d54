"""Demonstration datasets in LeRobot's dataset v3.0 layout (parquet + mp4 + meta JSON).

Layout written by :class:`DatasetWriter` (readable without this project: pyarrow for the
tables, any FFmpeg-based decoder for the mp4 files; LeRobot reads it as a ``LeRobotDataset`` and its
dataset tools (``delete_episodes``, ``split_dataset``, ``LeRobotDataset.resume`` + ``add_frame`` /
``save_episode``) edit it: ``tests/lerobot_families/test_dataset_tools.py``)::

    DIR/
      meta/info.json                          codebase_version "v3.0", fps (an integer), features, paths
      meta/stats.json                         per feature: min/max/mean/std/count and q01/q10/q50/q90/q99
      meta/tasks.parquet                      column "task" (instruction) and "task_index"
      meta/episodes/chunk-000/file-000.parquet  one row per episode, exactly LeRobot's columns: length,
                                              tasks, row range, video timestamps, ``stats/<feature>/<stat>``
      meta/embodied/episodes.jsonl            our per-episode fields (success, suite task index and name,
                                              initial state, ...), one JSON object per episode
      meta/embodied/info.json                 our dataset fields (suite, task names, control rate, ...)
      data/chunk-000/file-000.parquet         one row per step
      videos/observation.images.<camera>/chunk-000/file-000.mp4   all episodes, back to back

Per-step columns: ``observation.state`` float32[S], ``observation.privileged`` float32[P],
``action`` float32[A], ``next.reward`` float32, ``next.done`` bool, ``next.success`` bool,
``timestamp`` float32 (seconds since the episode start), ``frame_index``, ``episode_index``,
``index`` (global row), ``task_index`` int64 (vectors as fixed-size lists, as LeRobot writes them).
Frame ``frame_index`` of episode ``e`` in a camera's video is at ``from_timestamp(e) + timestamp``
in the file that episode's row names (``videos/<key>/chunk_index``, ``file_index``).

What LeRobot's tools need, and how this layout meets it (lerobot 0.6.1):

- ``fps`` is an integer (LeRobot's ``DatasetInfo.fps: int``; with ``20.0`` its append fails, PyAV
  getting a float rate, and its re-encoding uses ``int(fps)``). The writer refuses a fractional rate; our
  control rate is 20 Hz. Datasets written before recorded ``20.0``; :class:`Dataset` reads both.
- Videos are lossless HEVC: libx265 with ``lossless=1`` on ``gbrp`` (planar 8-bit RGB: no RGB -> YUV
  conversion, no chroma subsampling), every frame intra-coded (x265's lossless inter frames do not always
  decode exactly: :data:`embodied.video.HEVC_GOP`), so what SFT decodes is the simulator's render bit
  for bit, the pixels RL and evaluation see. LeRobot's tools re-encode a video file that mixes kept and dropped
  episodes with the encoder its ``info.json`` names, and accept only ``h264``, ``hevc``, ``libsvtav1``,
  ``libaom-av1`` and hardware encoders (``lerobot.configs.video.VALID_VIDEO_CODECS``): our earlier
  ``mpeg4`` and ``ffv1`` are refused ("Invalid vcodec"). ``info.json`` records the stream
  (``video.codec`` ``"hevc"``, ``video.pix_fmt`` ``"gbrp"``) and the encoder settings the way LeRobot
  does (``video.g`` 1, ``video.extra_options`` ``{"x265-params": "lossless=1:..."}``), so LeRobot's
  re-encodes are lossless and intra-only too. H.264 cannot do this within LeRobot's list: libx264 takes
  YUV only (its RGB variant ``libx264rgb`` is not accepted), and qp 0 on yuv444p still rounds in the
  RGB -> YUV step.
  The encoder is PyAV where installed, else an ``ffmpeg`` executable with libx265 (imageio-ffmpeg's);
  where neither exists the writer falls back to FFV1 with a warning (lossless, but LeRobot's
  re-encoding tools refuse it). Datasets written before: FFV1 (``bgra``) or OpenCV's lossy MPEG-4 Part 2
  (``mpeg4``, ``yuv420p``); :class:`Dataset` reads all three.
- ``meta/episodes`` holds LeRobot's columns and only those, with the per-episode statistics LeRobot
  writes (``stats/<feature>/<stat>`` for every feature: min, max, mean, std, count and LeRobot's
  histogram quantiles q01..q99; images per channel ``[3, 1, 1]`` in [0, 1] over LeRobot's frame sample;
  mean and std in float64 where LeRobot's are float32), and ``meta/stats.json`` aggregates them as
  LeRobot does. So an episode LeRobot appends (in a new file of the same schema) loads with the
  others; before, our extra columns there made the reload fail (``CastError``). Those fields now live
  beside, in ``meta/embodied/`` (LeRobot leaves unknown files alone). LeRobot's tools do not carry
  them: a dataset ``delete_episodes`` / ``split_dataset`` make has none, episodes LeRobot appends have
  none (their ``success`` comes from ``next.success``), and LeRobot drops the ``embodied`` key of
  ``info.json`` when it rewrites it (:class:`Dataset` reads it back from ``meta/embodied/info.json``).
- Appending with LeRobot: pass the dataset's own encoder,
  ``LeRobotDataset.resume(..., rgb_encoder=lerobot_rgb_encoder(root))``; without it LeRobot encodes the new
  episodes with its default (lossy AV1, which OpenCV's FFmpeg may not even decode) while ``info.json``
  keeps naming HEVC (LeRobot records a camera's codec from episode 0 only); :attr:`Dataset.lossless_video`
  checks every video file's codec and turns False.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodied.runs import write_json
from embodied.video import CODECS, HEVC_GOP, HEVC_X265_PARAMS, VideoWriter, hevc_backend, is_lossless, video_codec
from policies.files import atomic_path, write_atomic

CODEBASE_VERSION = "v3.0"
DATA_FILE = "data/chunk-000/file-000.parquet"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EXTRA_EPISODES_FILE = "meta/embodied/episodes.jsonl"  # our per-episode fields (LeRobot ignores the folder)
EXTRA_INFO_FILE = "meta/embodied/info.json"
VIDEO_CODEC = "hevc"  # lossless and re-encodable by LeRobot's tools (see the module docstring)
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot's DEFAULT_QUANTILES, stats keys q01 ... q99
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
QUANTILE_BINS = 5000  # LeRobot's RunningQuantileStats
# the columns of LeRobot's meta/episodes rows besides videos/* and stats/*: an Episode's meta may not use them
RESERVED_EPISODE_KEYS = frozenset(
    {
        "episode_index",
        "tasks",
        "length",
        "data/chunk_index",
        "data/file_index",
        "dataset_from_index",
        "dataset_to_index",
        "meta/episodes/chunk_index",
        "meta/episodes/file_index",
    }
)


def video_key(camera: str) -> str:
    return f"observation.images.{camera}"


def lerobot_rgb_encoder(root: str | os.PathLike, camera: str | None = None):
    """LeRobot's encoder config for the dataset's camera videos (``RGBEncoderConfig``, from ``info.json``):
    what to pass as ``rgb_encoder`` to ``LeRobotDataset.resume`` so appended episodes are coded like
    the rest (lossless). Needs LeRobot."""
    from lerobot.configs.video import RGBEncoderConfig

    features = json.loads((Path(root) / "meta" / "info.json").read_text())["features"]
    keys = [video_key(camera)] if camera else [k for k, f in features.items() if f["dtype"] == "video"]
    if not keys:
        raise ValueError(f"{root} has no video features")
    return RGBEncoderConfig.from_video_info(features[keys[0]].get("info"))


def integer_fps(fps: float) -> int:
    """``fps`` as the integer LeRobot datasets record; raises ``ValueError`` for a fractional rate."""
    if not float(fps) > 0 or abs(float(fps) - round(float(fps))) > 1e-9:
        raise ValueError(f"fps={fps}: LeRobot datasets record an integer frame rate (control_hz in Hz)")
    return int(round(float(fps)))


# ---------------------------------------------------------------------------------------- statistics
def _sample_indices(n: int) -> np.ndarray:
    """The frames LeRobot computes an episode's image statistics on (``compute_stats.sample_indices``)."""
    num = max(min(100, n), min(int(n**0.75), 10_000))
    return np.round(np.linspace(0, n - 1, num)).astype(int)


def _histogram_quantiles(a: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's quantiles of the columns of ``a [N, D]`` (N >= 2; ``RunningQuantileStats`` fed one
    batch): a 5000-bin histogram between each column's min and max, interpolated within the bin."""
    lo, hi = a.min(0), a.max(0)
    out = {key: np.empty(a.shape[1]) for key in QUANTILE_KEYS}
    for i in range(a.shape[1]):
        edges = np.linspace(lo[i] - 1e-10, hi[i] + 1e-10, QUANTILE_BINS + 1)  # in a's dtype, as there
        cumsum = np.cumsum(np.histogram(a[:, i], bins=edges)[0])
        for q, key in zip(QUANTILES, QUANTILE_KEYS):
            target = q * len(a)
            idx = int(np.searchsorted(cumsum, target))
            if idx == 0:
                value = edges[0]
            elif idx >= len(cumsum):
                value = edges[-1]
            else:
                before, inside = cumsum[idx - 1], cumsum[idx] - cumsum[idx - 1]
                value = (
                    edges[idx]
                    if inside == 0
                    else edges[idx] + (target - before) / inside * (edges[idx + 1] - edges[idx])
                )
            out[key][i] = value
    return out


def feature_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one feature over the steps of an episode (``compute_episode_stats``):
    ``values [T]`` or ``[T, D]`` -> min/max/mean/std/q01..q99 of shape ``[1]`` or ``[D]``, count ``[T]``.
    The quantiles are LeRobot's histogram estimate, on the values promoted as LeRobot promotes them
    (float32 at least), and the mean of the values with a single step; min, max, mean and std are
    computed in float64 (LeRobot's float32 variance loses digits where the mean dwarfs the spread)."""
    a = np.asarray(values)
    a = a.reshape(len(a), -1)
    exact = a.astype(np.float64)
    stats = {
        "min": exact.min(0),
        "max": exact.max(0),
        "mean": exact.mean(0),
        "std": exact.std(0),
        "count": np.array([len(a)]),
    }
    if len(a) >= 2:
        stats.update(_histogram_quantiles(a.astype(np.result_type(a.dtype, np.float32))))
    else:
        stats.update({key: stats["mean"].copy() for key in QUANTILE_KEYS})
    return stats


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's statistics of a camera over an episode, ``frames [T, H, W, 3]`` uint8: per channel,
    shape ``[3, 1, 1]``, scaled to [0, 1], over LeRobot's sample of the frames (its ``count``), each
    subsampled as LeRobot does from 300 px."""
    idx = _sample_indices(len(frames))
    imgs = frames[idx]
    h, w = imgs.shape[1:3]
    if max(h, w) >= 300:
        step = int(w / 150) if w > h else int(h / 150)
        imgs = imgs[:, ::step, ::step]
    stats = {
        k: v if k == "count" else v.reshape(3, 1, 1) / 255.0 for k, v in feature_stats(imgs.reshape(-1, 3)).items()
    }
    stats["count"] = np.array([len(idx)])
    return stats


def aggregate_stats(per_episode: Sequence[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Dataset statistics from episodes' as LeRobot aggregates them (``compute_stats.aggregate_stats``):
    min of mins, max of maxes, count-weighted mean, pooled std, count-weighted quantiles."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in dict.fromkeys(k for s in per_episode for k in s):
        parts = [s[key] for s in per_episode if key in s]
        means = np.stack([p["mean"] for p in parts])
        counts = np.stack([p["count"] for p in parts])  # [n, 1]
        total = counts.sum(0)
        w = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim)).astype(np.float64)
        mean = (means * w).sum(0) / total
        var = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * w).sum(0) / total
        agg = {
            "min": np.stack([p["min"] for p in parts]).min(0),
            "max": np.stack([p["max"] for p in parts]).max(0),
            "mean": mean,
            "std": np.sqrt(var),
            "count": total,
        }
        for q in QUANTILE_KEYS:
            if all(q in p for p in parts):
                agg[q] = (np.stack([p[q] for p in parts]) * w).sum(0) / total
        out[key] = agg
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@dataclass
class Episode:
    """One finished episode, buffered before it is written.

    Arrays: ``state [T, S]``, ``privileged [T, P]``, ``action [T, A]``, ``reward [T]``,
    ``done [T]``, ``success [T]``, ``rgb [T, V, H, W, 3]`` uint8 (or None without cameras).
    ``meta``: extra per-episode fields (JSON values), kept in ``meta/embodied/episodes.jsonl``.
    """

    task_index: int
    instruction: str
    state: np.ndarray
    privileged: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    success: np.ndarray
    rgb: np.ndarray | None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.action)


class DatasetWriter:
    """Appends episodes to a v3.0 dataset; :meth:`close` writes the tables and metadata.

    Steps are kept in memory as numpy (small for our sizes) and videos are encoded as episodes
    arrive. The tables are written atomically at close, so an interrupted collection leaves
    either no table or a complete, consistent one covering the episodes written so far.
    ``fps``: a whole number of frames per second (LeRobot records an integer). ``video_codec``:
    ``"hevc"`` (lossless, the default where an encoder exists) or ``"ffv1"`` (see the module docstring).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        fps: float,
        cameras: Sequence[str],
        image_size: int,
        state_names: Sequence[str],
        action_names: Sequence[str],
        privileged_dim: int,
        robot_type: str = "panda",
        extra_info: dict[str, Any] | None = None,
        video_codec: str | None = None,
    ):
        self.root = Path(root)
        if (self.root / "meta" / "info.json").exists():
            raise FileExistsError(f"{self.root} already holds a dataset: choose a new out=... folder")
        self.fps = integer_fps(fps)
        self.cameras = list(cameras)
        self.image_size = image_size
        self.state_names = list(state_names)
        self.action_names = list(action_names)
        self.privileged_dim = privileged_dim
        self.robot_type = robot_type
        self.extra_info = extra_info or {}
        if video_codec is None:
            video_codec = VIDEO_CODEC
            if self.cameras and hevc_backend() is None:
                warnings.warn(
                    "no libx265 encoder here (install PyAV or imageio-ffmpeg): the dataset's videos are "
                    "FFV1, lossless, but LeRobot's delete_episodes/split_dataset refuse to re-encode FFV1",
                    RuntimeWarning,
                    stacklevel=2,
                )
                video_codec = "ffv1"
        if video_codec not in ("hevc", "ffv1"):
            raise ValueError(f"video_codec={video_codec!r}: datasets store lossless video, 'hevc' or 'ffv1'")
        self.video_codec = video_codec
        self._tasks: dict[str, int] = {}
        self._rows: dict[str, list] = {
            k: []
            for k in (
                "observation.state",
                "observation.privileged",
                "action",
                "next.reward",
                "next.done",
                "next.success",
                "timestamp",
                "frame_index",
                "episode_index",
                "index",
                "task_index",
            )
        }
        self._episodes: list[dict[str, Any]] = []
        self._extras: list[dict[str, Any]] = []
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._frames_written = 0
        self._videos = {
            c: VideoWriter(
                self.root / VIDEO_PATH.format(video_key=video_key(c), chunk_index=0, file_index=0),
                fps=self.fps,
                codec=self.video_codec,
            )
            for c in self.cameras
        }

    def task_index(self, instruction: str) -> int:
        return self._tasks.setdefault(instruction, len(self._tasks))

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    def add_episode(self, ep: Episode) -> int:
        """Append one episode; returns its episode index."""
        t = ep.length
        if t == 0:
            raise ValueError("an episode needs at least one step")
        clash = sorted(k for k in ep.meta if k in RESERVED_EPISODE_KEYS or k.startswith(("videos/", "stats/")))
        if clash:
            raise ValueError(f"episode meta keys {clash} are LeRobot's episode columns: rename them")
        if self.cameras:
            if ep.rgb is None:
                raise ValueError("this dataset records cameras: the episode needs rgb frames")
            if (
                ep.rgb.dtype != np.uint8
                or ep.rgb.ndim != 5
                or ep.rgb.shape[:2] != (t, len(self.cameras))
                or ep.rgb.shape[-1] != 3
            ):
                raise ValueError(
                    f"episode rgb is {ep.rgb.dtype} {list(ep.rgb.shape)}, this dataset records uint8 "
                    f"[{t}, {len(self.cameras)}, H, W, 3] (steps, cameras {self.cameras})"
                )
        e = len(self._episodes)
        start = len(self._rows["index"])
        task_index = self.task_index(ep.instruction)
        steps = {
            "observation.state": ep.state.astype(np.float32).reshape(t, -1),
            "observation.privileged": ep.privileged.astype(np.float32).reshape(t, self.privileged_dim),
            "action": ep.action.astype(np.float32).reshape(t, -1),
            "next.reward": ep.reward.astype(np.float32).reshape(t),
            "next.done": ep.done.astype(bool).reshape(t),
            "next.success": ep.success.astype(bool).reshape(t),
            "timestamp": (np.arange(t, dtype=np.float32) / np.float32(self.fps)),
            "frame_index": np.arange(t, dtype=np.int64),
            "episode_index": np.full(t, e, np.int64),
            "index": np.arange(start, start + t, dtype=np.int64),
            "task_index": np.full(t, task_index, np.int64),
        }
        for key, values in steps.items():
            self._rows[key] += list(values) if values.ndim == 2 else values.tolist()
        stats = {key: feature_stats(values) for key, values in steps.items()}
        stats["timestamp"] = feature_stats(np.arange(t) / self.fps)  # LeRobot's are float64 at this point
        record: dict[str, Any] = {
            "episode_index": e,
            "tasks": [ep.instruction],
            "length": t,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": start,
            "dataset_to_index": start + t,
        }
        if self.cameras:
            from_ts = self._frames_written / self.fps
            for v, cam in enumerate(self.cameras):
                for frame in ep.rgb[:, v]:
                    self._videos[cam].write(frame)
                key = video_key(cam)
                record[f"videos/{key}/chunk_index"] = 0
                record[f"videos/{key}/file_index"] = 0
                record[f"videos/{key}/from_timestamp"] = from_ts
                record[f"videos/{key}/to_timestamp"] = from_ts + t / self.fps
                stats[key] = image_stats(ep.rgb[:, v])
            self._frames_written += t
        for feature, values in stats.items():
            for name, value in values.items():
                record[f"stats/{feature}/{name}"] = value.tolist()
        record["meta/episodes/chunk_index"] = 0
        record["meta/episodes/file_index"] = 0
        self._episodes.append(record)
        self._episode_stats.append(stats)
        self._extras.append(
            {"episode_index": e, "success": bool(ep.success.any()), "task_index": task_index, **ep.meta}
        )
        return e

    # ------------------------------------------------------------------ finalisation
    def _features(self) -> dict[str, Any]:
        feats: dict[str, Any] = {
            "observation.state": {"dtype": "float32", "shape": [len(self.state_names)], "names": self.state_names},
            "observation.privileged": {"dtype": "float32", "shape": [self.privileged_dim], "names": None},
            "action": {"dtype": "float32", "shape": [len(self.action_names)], "names": self.action_names},
            "next.reward": {"dtype": "float32", "shape": [1], "names": None},
            "next.done": {"dtype": "bool", "shape": [1], "names": None},
            "next.success": {"dtype": "bool", "shape": [1], "names": None},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": {"dtype": "int64", "shape": [1], "names": None},
            "episode_index": {"dtype": "int64", "shape": [1], "names": None},
            "index": {"dtype": "int64", "shape": [1], "names": None},
            "task_index": {"dtype": "int64", "shape": [1], "names": None},
        }
        _, codec, pix_fmt = CODECS[self.video_codec]
        for cam in self.cameras:
            # what LeRobot's get_video_info records: the stream, then the encoder's settings
            info: dict[str, Any] = {
                "video.height": self.image_size,
                "video.width": self.image_size,
                "video.codec": codec,
                "video.pix_fmt": pix_fmt,
                "video.fps": self.fps,
                "video.channels": 3,
                "has_audio": False,
            }
            if self.video_codec == "hevc":
                info.update(
                    {
                        "video.g": HEVC_GOP,
                        "video.crf": None,
                        "video.preset": None,
                        "video.fast_decode": 0,
                        "video.extra_options": {"x265-params": HEVC_X265_PARAMS},
                    }
                )
            info["is_depth_map"] = False
            feats[video_key(cam)] = {
                "dtype": "video",
                "shape": [self.image_size, self.image_size, 3],
                "names": ["height", "width", "channels"],
                "info": info,
            }
        return feats

    def _data_table(self) -> pa.Table:
        def vectors(key: str, dim: int) -> pa.Array:  # fixed-size lists, as LeRobot writes [D] features
            if dim == 0:  # pyarrow cannot read back a parquet column of fixed-size-0 lists
                return pa.array([[]] * len(self._rows[key]), pa.list_(pa.float32()))
            flat = np.asarray(self._rows[key], np.float32).reshape(-1)
            return pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim)

        return pa.table(
            {
                "observation.state": vectors("observation.state", len(self.state_names)),
                "observation.privileged": vectors("observation.privileged", self.privileged_dim),
                "action": vectors("action", len(self.action_names)),
                "next.reward": pa.array(self._rows["next.reward"], pa.float32()),
                "next.done": pa.array(self._rows["next.done"], pa.bool_()),
                "next.success": pa.array(self._rows["next.success"], pa.bool_()),
                "timestamp": pa.array(self._rows["timestamp"], pa.float32()),
                "frame_index": pa.array(self._rows["frame_index"], pa.int64()),
                "episode_index": pa.array(self._rows["episode_index"], pa.int64()),
                "index": pa.array(self._rows["index"], pa.int64()),
                "task_index": pa.array(self._rows["task_index"], pa.int64()),
            }
        )

    def _episodes_table(self) -> pa.Table:
        """The episode rows with the types LeRobot's own rows get (``pa.Table.from_pydict`` of python
        values): int64, double, list<string> and stats as (nested) lists of double, count list<int64>."""

        def arrow_type(key: str, value: Any) -> pa.DataType:
            if key == "tasks":
                return pa.list_(pa.string())
            if key.startswith("stats/"):
                t: pa.DataType = pa.int64() if key.endswith("/count") else pa.float64()
                depth, v = 0, value
                while isinstance(v, list):
                    depth, v = depth + 1, (v[0] if v else None)
                for _ in range(max(depth, 1)):
                    t = pa.list_(t)
                return t
            return pa.float64() if isinstance(value, float) else pa.int64()

        first = self._episodes[0]
        schema = pa.schema([(k, arrow_type(k, v)) for k, v in first.items()])
        return pa.Table.from_pylist(self._episodes, schema=schema)

    def close(self) -> Path:
        """Write tables and metadata; returns the dataset root."""
        for w in self._videos.values():
            w.close()
        n_frames = len(self._rows["index"])
        _write_table(self._data_table(), self.root / DATA_FILE)
        if self._episodes:
            _write_table(self._episodes_table(), self.root / EPISODES_FILE)
        tasks = sorted(self._tasks.items(), key=lambda kv: kv[1])
        # LeRobot reads tasks.parquet with pandas: the instruction is the index named "task"
        import pandas as pd

        frame = pd.DataFrame({"task_index": [i for _, i in tasks]}, index=pd.Index([t for t, _ in tasks], name="task"))
        _write_table(pa.Table.from_pandas(frame), self.root / "meta" / "tasks.parquet")
        stats = aggregate_stats(self._episode_stats) if self._episode_stats else {}
        write_json(
            self.root / "meta" / "stats.json", {k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()}
        )
        (self.root / EXTRA_EPISODES_FILE).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            self.root / EXTRA_EPISODES_FILE, "".join(json.dumps(row, default=_jsonable) + "\n" for row in self._extras)
        )
        write_json(self.root / EXTRA_INFO_FILE, self.extra_info)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(self._episodes),
            "total_frames": n_frames,
            "total_tasks": len(self._tasks),
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 500,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self._episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.cameras else None,
            "features": self._features(),
            # also in meta/embodied/info.json: LeRobot drops unknown keys when it rewrites info.json
            "embodied": self.extra_info,
        }
        write_json(self.root / "meta" / "info.json", info)  # last: its presence marks a complete dataset
        return self.root


def _write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _parquet_files(folder: Path) -> list[Path]:
    """``chunk-XXX/file-YYY.parquet`` files under ``folder`` in (chunk, file) order."""

    def order(p: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", p.relative_to(folder).as_posix()))

    return sorted(folder.glob("chunk-*/file-*.parquet"), key=order)


def _column_to_numpy(col: pa.ChunkedArray) -> np.ndarray:
    """A column as numpy: scalars as their dtype, (fixed-size) lists of numbers as ``[N, D]``."""
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_fixed_size_list(col.type):
        return np.asarray(col.flatten().to_numpy(zero_copy_only=False)).reshape(len(col), col.type.list_size)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        rows = col.to_pylist()
        width = len(rows[0]) if rows else 0
        return np.asarray(rows, dtype=None if width else np.float32).reshape(len(rows), width)
    return col.to_numpy(zero_copy_only=False)


class Dataset:
    """Reader of a v3.0 dataset (ours, and LeRobot's: several data and video files, datasets LeRobot's
    tools edited): tables via pyarrow, frames decoded with OpenCV (HEVC and FFV1 exactly as written;
    older mp4v datasets as their codec left them). ``fps`` may be an integer or, in datasets written
    before, a float."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        info_path = self.root / "meta" / "info.json"
        if not info_path.is_file():
            raise FileNotFoundError(
                f"no dataset at {self.root}: meta/info.json is missing (was the collection finished?)"
            )
        self.info = json.loads(info_path.read_text())
        if not str(self.info.get("codebase_version", "")).startswith("v3"):
            raise ValueError(f"{self.root} is a LeRobot dataset {self.info.get('codebase_version')}, expected v3.x")
        if "embodied" not in self.info and (self.root / EXTRA_INFO_FILE).is_file():
            self.info["embodied"] = json.loads((self.root / EXTRA_INFO_FILE).read_text())
        self.fps = float(self.info["fps"])
        self.features = self.info["features"]
        self.cameras = [
            k.removeprefix("observation.images.") for k, f in self.features.items() if f["dtype"] == "video"
        ]
        tasks = pq.read_table(self.root / "meta" / "tasks.parquet").to_pydict()
        self.tasks = dict(zip(tasks["task_index"], tasks["task"]))
        self.stats = json.loads((self.root / "meta" / "stats.json").read_text())
        self._columns = self._read_data()
        self._episode_stats: dict[int, dict[str, Any]] = {}
        self.episodes = self._read_episodes()
        self._cursors: dict[Path, list] = {}
        self._lossless: bool | None = None

    def _read_data(self) -> dict[str, np.ndarray]:
        files = _parquet_files(self.root / "data")
        if not files:
            raise FileNotFoundError(f"no data files under {self.root / 'data'}")
        tables = [pq.read_table(p) for p in files]
        names = tables[0].column_names
        columns = {n: np.concatenate([_column_to_numpy(t.column(n)) for t in tables]) for n in names}
        if np.any(np.diff(columns["index"]) < 0):  # files in (chunk, file) order hold rows in index order
            order = np.argsort(columns["index"], kind="stable")
            columns = {n: c[order] for n, c in columns.items()}
        index = columns["index"]
        if len(index) and not np.array_equal(index, index[0] + np.arange(len(index))):
            raise ValueError(f"{self.root}: the data rows' index column is not contiguous")
        return columns

    def _read_episodes(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for path in _parquet_files(self.root / "meta" / "episodes"):
            rows += pq.read_table(path).to_pylist()
        rows.sort(key=lambda r: r["episode_index"])
        extras: dict[int, dict[str, Any]] = {}
        if (self.root / EXTRA_EPISODES_FILE).is_file():
            for line in (self.root / EXTRA_EPISODES_FILE).read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    extras[int(row["episode_index"])] = row
        episodes = []
        base = int(self._columns["index"][0]) if len(self._columns["index"]) else 0
        for row in rows:
            e = int(row["episode_index"])
            self._episode_stats[e] = {k.removeprefix("stats/"): v for k, v in row.items() if k.startswith("stats/")}
            meta = {**extras.get(e, {}), **{k: v for k, v in row.items() if not k.startswith("stats/")}}
            if "success" not in meta and "next.success" in self._columns:
                lo, hi = row["dataset_from_index"] - base, row["dataset_to_index"] - base
                meta["success"] = bool(self._columns["next.success"][lo:hi].any())
            episodes.append(meta)
        return episodes

    def __len__(self) -> int:
        return len(self._columns["index"])

    @property
    def image_size(self) -> int | None:
        """Side of the recorded (square) camera frames, None for a dataset without cameras."""
        if not self.cameras:
            return None
        return int(self.features[video_key(self.cameras[0])]["shape"][0])

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def episode_stats(self, e: int) -> dict[str, Any]:
        """Episode ``e``'s LeRobot statistics, ``{"<feature>/<stat>": value}`` (empty for older datasets)."""
        return self._episode_stats.get(int(self.episodes[e]["episode_index"]), {})

    @property
    def lossless_video(self) -> bool:
        """Whether every camera's video is losslessly coded (HEVC lossless or FFV1), so decoded frames are
        the recorded ones: ``info.json`` says so and every video file of the dataset has the codec it names
        (LeRobot records a camera's codec from its first episode only)."""
        if self._lossless is None:
            ok = bool(self.cameras)
            for cam in self.cameras:
                info = self.features[video_key(cam)].get("info", {})
                ok = ok and is_lossless(info)
                for path in {self._video_path(cam, ep) for ep in self.episodes}:
                    ok = ok and video_codec(path) == info.get("video.codec")
            self._lossless = ok
        return self._lossless

    def column(self, name: str) -> np.ndarray:
        """A whole per-step column as numpy (``[N, D]`` for vectors)."""
        col = self._columns[name]
        return col.astype(np.float32) if col.ndim == 2 else col

    def episode(self, e: int, *, images: bool = True) -> dict[str, Any]:
        """Episode ``e``: numeric columns ``[T, ...]`` and, with images, ``rgb [T, V, H, W, 3]`` uint8."""
        ep = self.episodes[e]
        base = int(self._columns["index"][0])
        lo, hi = ep["dataset_from_index"] - base, ep["dataset_to_index"] - base
        out: dict[str, Any] = {"instruction": ep["tasks"][0], "meta": ep}
        for name, col in self._columns.items():
            out[name] = col[lo:hi].astype(np.float32) if col.ndim == 2 else col[lo:hi]
        if images and self.cameras:
            frames = [
                self._decode(
                    self._video_path(cam, ep),
                    int(round(ep[f"videos/{video_key(cam)}/from_timestamp"] * self.fps)),
                    hi - lo,
                )
                for cam in self.cameras
            ]
            out["rgb"] = np.stack(frames, axis=1)
        return out

    def _video_path(self, camera: str, ep: dict[str, Any]) -> Path:
        key = video_key(camera)
        return self.root / self.info["video_path"].format(
            video_key=key,
            chunk_index=ep.get(f"videos/{key}/chunk_index", 0),
            file_index=ep.get(f"videos/{key}/file_index", 0),
        )

    def _decode(self, path: Path, first: int, count: int) -> np.ndarray:
        """Frames ``first .. first + count - 1`` of a video file, read forward from the file's start or
        from where the last read of it ended (no seeking: exact for every codec, and episodes read in
        order decode each file once)."""
        import cv2

        cursor = self._cursors.get(path)
        if cursor is None or cursor[1] > first:
            if cursor is not None:
                cursor[0].release()
            cap = cv2.VideoCapture(str(path))
            if not cap.isOpened():
                raise FileNotFoundError(f"cannot open the video {path}")
            cursor = self._cursors[path] = [cap, 0]
        cap = cursor[0]

        def failure(at: int) -> ValueError:
            if at == 0:
                return ValueError(
                    f"OpenCV decodes no frame of {path} ({video_codec(path)} video): its FFmpeg "
                    "lacks the decoder, or the file is damaged"
                )
            return ValueError(f"{path} ends at frame {at}, before frame {first + count - 1}: the video is truncated")

        while cursor[1] < first:
            if not cap.grab():
                raise failure(cursor[1])
            cursor[1] += 1
        frames = []
        for _ in range(count):
            ok, frame = cap.read()
            if not ok:
                raise failure(cursor[1])
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            cursor[1] += 1
        return np.stack(frames)

    def close(self) -> None:
        """Release the open video files (reading again reopens them)."""
        for cap, _ in self._cursors.values():
            cap.release()
        self._cursors.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
