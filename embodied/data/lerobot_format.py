"""Demonstration datasets in LeRobot's dataset v3.0 layout (parquet + mp4 + meta JSON).

Layout written by :class:`DatasetWriter` (readable without this project: pyarrow for the
tables, any video decoder for the mp4 files; LeRobot >= 0.4 reads it as a ``LeRobotDataset``)::

    DIR/
      meta/info.json                          codebase_version "v3.0", fps, features, paths
      meta/stats.json                         mean/std/min/max/count per numeric feature
      meta/tasks.parquet                      column "task" (instruction) and "task_index"
      meta/episodes/chunk-000/file-000.parquet  one row per episode (length, task, success,
                                              row range, video timestamps, suite task name)
      data/chunk-000/file-000.parquet         one row per step
      videos/observation.images.<camera>/chunk-000/file-000.mp4   all episodes, back to back

Per-step columns: ``observation.state`` float32[S], ``observation.privileged`` float32[P],
``action`` float32[A], ``next.reward`` float32, ``next.done`` bool, ``next.success`` bool,
``timestamp`` float32 (seconds since the episode start), ``frame_index``, ``episode_index``,
``index`` (global row), ``task_index`` int64. Frame ``frame_index`` of episode ``e`` in a camera's
video is at ``from_timestamp(e) + timestamp``.

Videos are lossless: FFV1 (intra-only, 8-bit ``bgra``, no chroma subsampling) in the mp4
container, written by OpenCV and read by any FFmpeg-based decoder (LeRobot's too). The frames SFT
decodes are the simulator's renders bit for bit, the pixels RL and evaluation see, whatever the
FFmpeg build. ``info.json`` records the codec per camera (``video.codec`` ``"ffv1"``,
``video.pix_fmt`` ``"bgra"``). Datasets written before used OpenCV's lossy MPEG-4 Part 2 (``mp4v``,
``video.codec`` ``"mpeg4"``, ``yuv420p``); :class:`Dataset` reads both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodied.runs import write_json
from embodied.video import CODECS, VideoWriter
from policies.files import atomic_path

CODEBASE_VERSION = "v3.0"
DATA_FILE = "data/chunk-000/file-000.parquet"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
VIDEO_CODEC = "ffv1"  # lossless: what SFT decodes equals what was rendered (see the module docstring)


def video_key(camera: str) -> str:
    return f"observation.images.{camera}"


@dataclass
class Episode:
    """One finished episode, buffered before it is written.

    Arrays: ``state [T, S]``, ``privileged [T, P]``, ``action [T, A]``, ``reward [T]``,
    ``done [T]``, ``success [T]``, ``rgb [T, V, H, W, 3]`` uint8 (or None without cameras).
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
    """

    def __init__(self, root: str | os.PathLike, *, fps: float, cameras: Sequence[str], image_size: int,
                 state_names: Sequence[str], action_names: Sequence[str], privileged_dim: int,
                 robot_type: str = "panda", extra_info: dict[str, Any] | None = None):
        self.root = Path(root)
        if (self.root / "meta" / "info.json").exists():
            raise FileExistsError(f"{self.root} already holds a dataset: choose a new out=... folder")
        self.fps = float(fps)
        self.cameras = list(cameras)
        self.image_size = image_size
        self.state_names = list(state_names)
        self.action_names = list(action_names)
        self.privileged_dim = privileged_dim
        self.robot_type = robot_type
        self.extra_info = extra_info or {}
        self._tasks: dict[str, int] = {}
        self._rows: dict[str, list] = {k: [] for k in (
            "observation.state", "observation.privileged", "action", "next.reward", "next.done",
            "next.success", "timestamp", "frame_index", "episode_index", "index", "task_index")}
        self._episodes: list[dict[str, Any]] = []
        self._frames_written = 0
        self._videos = {c: VideoWriter(self.root / VIDEO_PATH.format(video_key=video_key(c), chunk_index=0,
                                                                      file_index=0), fps=self.fps,
                                         codec=VIDEO_CODEC)
                        for c in self.cameras}
        self._image_sums = np.zeros((len(self.cameras), 3))
        self._image_sq = np.zeros((len(self.cameras), 3))
        self._image_min = np.full((len(self.cameras), 3), np.inf)
        self._image_max = np.full((len(self.cameras), 3), -np.inf)
        self._image_count = 0

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
        e = len(self._episodes)
        start = len(self._rows["index"])
        task_index = self.task_index(ep.instruction)
        rows = self._rows
        rows["observation.state"] += list(ep.state.astype(np.float32))
        rows["observation.privileged"] += list(ep.privileged.astype(np.float32))
        rows["action"] += list(ep.action.astype(np.float32))
        rows["next.reward"] += ep.reward.astype(np.float32).tolist()
        rows["next.done"] += ep.done.astype(bool).tolist()
        rows["next.success"] += ep.success.astype(bool).tolist()
        rows["timestamp"] += (np.arange(t, dtype=np.float32) / self.fps).tolist()
        rows["frame_index"] += list(range(t))
        rows["episode_index"] += [e] * t
        rows["index"] += list(range(start, start + t))
        rows["task_index"] += [task_index] * t
        record: dict[str, Any] = {
            "episode_index": e,
            "tasks": [ep.instruction],
            "length": t,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": start,
            "dataset_to_index": start + t,
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
            "success": bool(ep.success.any()),
            "task_index": task_index,
        }
        record.update({k: v for k, v in ep.meta.items()})
        if self.cameras:
            if ep.rgb is None:
                raise ValueError("this dataset records cameras: the episode needs rgb frames")
            if ep.rgb.dtype != np.uint8 or ep.rgb.ndim != 5 or ep.rgb.shape[:2] != (t, len(self.cameras)) \
                    or ep.rgb.shape[-1] != 3:
                raise ValueError(f"episode rgb is {ep.rgb.dtype} {list(ep.rgb.shape)}, this dataset records uint8 "
                                 f"[{t}, {len(self.cameras)}, H, W, 3] (steps, cameras {self.cameras})")
            from_ts = self._frames_written / self.fps
            for v, cam in enumerate(self.cameras):
                for frame in ep.rgb[:, v]:
                    self._videos[cam].write(frame)
                key = video_key(cam)
                record[f"videos/{key}/chunk_index"] = 0
                record[f"videos/{key}/file_index"] = 0
                record[f"videos/{key}/from_timestamp"] = from_ts
                record[f"videos/{key}/to_timestamp"] = from_ts + t / self.fps
            self._frames_written += t
            pix = ep.rgb.reshape(t, len(self.cameras), -1, 3).astype(np.float64) / 255.0
            self._image_sums += pix.mean(axis=2).sum(axis=0)
            self._image_sq += (pix**2).mean(axis=2).sum(axis=0)
            self._image_min = np.minimum(self._image_min, pix.min(axis=(0, 2)))
            self._image_max = np.maximum(self._image_max, pix.max(axis=(0, 2)))
            self._image_count += t
        self._episodes.append(record)
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
        _, codec, pix_fmt = CODECS[VIDEO_CODEC]
        for cam in self.cameras:
            feats[video_key(cam)] = {
                "dtype": "video",
                "shape": [self.image_size, self.image_size, 3],
                "names": ["height", "width", "channels"],
                "info": {"video.height": self.image_size, "video.width": self.image_size, "video.codec": codec,
                         "video.pix_fmt": pix_fmt, "video.is_depth_map": False, "video.fps": self.fps,
                         "video.channels": 3, "has_audio": False},
            }
        return feats

    def _stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        for key in ("observation.state", "observation.privileged", "action"):
            arr = np.asarray(self._rows[key], np.float64)
            if arr.size == 0:
                continue
            stats[key] = {"mean": arr.mean(0).tolist(), "std": arr.std(0).tolist(), "min": arr.min(0).tolist(),
                          "max": arr.max(0).tolist(), "count": [len(arr)]}
        for key in ("next.reward",):
            arr = np.asarray(self._rows[key], np.float64)[:, None]
            stats[key] = {"mean": arr.mean(0).tolist(), "std": arr.std(0).tolist(), "min": arr.min(0).tolist(),
                          "max": arr.max(0).tolist(), "count": [len(arr)]}
        if self._image_count:
            mean = self._image_sums / self._image_count
            std = np.sqrt(np.maximum(self._image_sq / self._image_count - mean**2, 0.0))
            for v, cam in enumerate(self.cameras):  # LeRobot's layout: per channel, [3, 1, 1]
                stats[video_key(cam)] = {
                    "mean": [[[m]] for m in mean[v]], "std": [[[s]] for s in std[v]],
                    "min": [[[m]] for m in self._image_min[v]], "max": [[[m]] for m in self._image_max[v]],
                    "count": [self._image_count],
                }
        return stats

    def close(self) -> Path:
        """Write tables and metadata; returns the dataset root."""
        for w in self._videos.values():
            w.close()
        n_frames = len(self._rows["index"])
        data = {
            "observation.state": pa.array(self._rows["observation.state"], pa.list_(pa.float32())),
            "observation.privileged": pa.array(self._rows["observation.privileged"], pa.list_(pa.float32())),
            "action": pa.array(self._rows["action"], pa.list_(pa.float32())),
            "next.reward": pa.array(self._rows["next.reward"], pa.float32()),
            "next.done": pa.array(self._rows["next.done"], pa.bool_()),
            "next.success": pa.array(self._rows["next.success"], pa.bool_()),
            "timestamp": pa.array(self._rows["timestamp"], pa.float32()),
            "frame_index": pa.array(self._rows["frame_index"], pa.int64()),
            "episode_index": pa.array(self._rows["episode_index"], pa.int64()),
            "index": pa.array(self._rows["index"], pa.int64()),
            "task_index": pa.array(self._rows["task_index"], pa.int64()),
        }
        _write_table(pa.table(data), self.root / DATA_FILE)
        _write_table(pa.Table.from_pylist(self._episodes), self.root / EPISODES_FILE)
        tasks = sorted(self._tasks.items(), key=lambda kv: kv[1])
        # LeRobot reads tasks.parquet with pandas: the instruction is the index named "task"
        import pandas as pd

        frame = pd.DataFrame({"task_index": [i for _, i in tasks]}, index=pd.Index([t for t, _ in tasks], name="task"))
        _write_table(pa.Table.from_pandas(frame), self.root / "meta" / "tasks.parquet")
        write_json(self.root / "meta" / "stats.json", self._stats())
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
            "embodied": self.extra_info,
        }
        write_json(self.root / "meta" / "info.json", info)  # last: its presence marks a complete dataset
        return self.root


def _write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


class Dataset:
    """Reader of a v3.0 dataset (ours or LeRobot's single-file-chunk ones): tables via pyarrow,
    frames decoded with OpenCV (FFV1 exactly as written; older mp4v datasets as their codec left them)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        info_path = self.root / "meta" / "info.json"
        if not info_path.is_file():
            raise FileNotFoundError(f"no dataset at {self.root}: meta/info.json is missing (was the collection finished?)")
        self.info = json.loads(info_path.read_text())
        if not str(self.info.get("codebase_version", "")).startswith("v3"):
            raise ValueError(f"{self.root} is a LeRobot dataset {self.info.get('codebase_version')}, expected v3.x")
        self.fps = float(self.info["fps"])
        self.features = self.info["features"]
        self.cameras = [k.removeprefix("observation.images.") for k, f in self.features.items() if f["dtype"] == "video"]
        self.episodes = pq.read_table(self.root / EPISODES_FILE).to_pylist()
        tasks = pq.read_table(self.root / "meta" / "tasks.parquet").to_pydict()
        self.tasks = dict(zip(tasks["task_index"], tasks["task"]))
        self.stats = json.loads((self.root / "meta" / "stats.json").read_text())
        self._data = pq.read_table(self.root / DATA_FILE)

    def __len__(self) -> int:
        return self._data.num_rows

    @property
    def image_size(self) -> int | None:
        """Side of the recorded (square) camera frames, None for a dataset without cameras."""
        if not self.cameras:
            return None
        return int(self.features[video_key(self.cameras[0])]["shape"][0])

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def lossless_video(self) -> bool:
        """Whether every camera's video is losslessly coded (FFV1), so decoded frames are the recorded ones."""
        return bool(self.cameras) and all(
            self.features[video_key(c)].get("info", {}).get("video.codec") == "ffv1" for c in self.cameras)

    def column(self, name: str) -> np.ndarray:
        """A whole per-step column as numpy (``[N, D]`` for vectors)."""
        col = self._data.column(name)
        if pa.types.is_list(col.type):
            return np.asarray(col.to_pylist(), dtype=np.float32)
        return col.to_numpy()

    def episode(self, e: int, *, images: bool = True) -> dict[str, Any]:
        """Episode ``e``: numeric columns ``[T, ...]`` and, with images, ``rgb [T, V, H, W, 3]`` uint8."""
        ep = self.episodes[e]
        lo, hi = ep["dataset_from_index"], ep["dataset_to_index"]
        part = self._data.slice(lo, hi - lo)
        out: dict[str, Any] = {"instruction": ep["tasks"][0], "meta": ep}
        for name in part.column_names:
            col = part.column(name)
            out[name] = np.asarray(col.to_pylist(), np.float32) if pa.types.is_list(col.type) else col.to_numpy()
        if images and self.cameras:
            frames = [self._decode(cam, ep[f"videos/{video_key(cam)}/from_timestamp"], hi - lo) for cam in self.cameras]
            out["rgb"] = np.stack(frames, axis=1)
        return out

    def _decode(self, camera: str, from_timestamp: float, count: int) -> np.ndarray:
        import cv2

        path = self.root / self.info["video_path"].format(video_key=video_key(camera), chunk_index=0, file_index=0)
        cap = cv2.VideoCapture(str(path))
        first = int(round(from_timestamp * self.fps))
        cap.set(cv2.CAP_PROP_POS_FRAMES, first)
        frames = []
        for _ in range(count):
            ok, frame = cap.read()
            if not ok:
                raise ValueError(f"{path} ends before frame {first + len(frames)}: the video is truncated")
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        cap.release()
        return np.stack(frames)
