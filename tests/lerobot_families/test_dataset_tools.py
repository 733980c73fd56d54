"""Our demonstration datasets (``embodied.data.lerobot_format``, LeRobot v3.0) under LeRobot's own
dataset API: LeRobot opens a dataset ``collect_suite`` wrote, its ``delete_episodes`` and
``split_dataset`` edit it (re-encoding the video files that mix kept and dropped episodes, with the
encoder ``info.json`` names) and ``LeRobotDataset.resume`` + ``add_frame`` / ``save_episode`` append
to it; every result reloads with LeRobot and with our :class:`Dataset`, and the frames both decode
equal the simulator's renders (max abs pixel error :data:`MAX_PIXEL_ERROR`: the videos are lossless
HEVC, and stay so through LeRobot's re-encoding)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip(
    "lerobot",
    reason="LeRobot is not installed here: these tests run in .venv-lerobot "
    "(bash scripts/setup.sh makes it; bash scripts/test.sh runs them there)",
)

from lerobot.configs.video import encoder_config_from_video_info  # noqa: E402
from lerobot.datasets.dataset_tools import delete_episodes, split_dataset  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from embodied.data.collect import collect_suite  # noqa: E402
from embodied.data.lerobot_format import (  # noqa: E402
    QUANTILE_KEYS,
    Dataset,
    DatasetWriter,
    integer_fps,
    lerobot_rgb_encoder,
    video_key,
)
from embodied.video import video_codec  # noqa: E402

MAX_PIXEL_ERROR = 0  # lossless storage: what SFT decodes is what the simulator rendered


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A two-episode dataset of the goal suite (tasks 2 and 3, 32 px, two cameras) and each episode's
    frames as rendered, ``[T, V, H, W, 3]``, in the dataset's episode order."""
    base = tmp_path_factory.mktemp("lerobot_tools")
    rendered = {}
    result = collect_suite(
        "goal",
        base / "ds",
        episodes_per_task=1,
        task_ids=[2, 3],
        num_envs=2,
        image_size=32,
        on_episode=lambda ep: rendered.__setitem__((ep["task"], ep["init_id"]), ep["rgb"]),
    )
    ours = Dataset(result.root)
    renders = [rendered[(m["suite_task_index"], m["init_id"])] for m in ours.episodes]
    return base, result.root, renders


def _lerobot(repo_id: str, root) -> LeRobotDataset:
    return LeRobotDataset(repo_id, root=root, video_backend="pyav")  # torchcodec needs a system FFmpeg


def _lerobot_frames(dataset: LeRobotDataset, cameras: list[str], e: int) -> np.ndarray:
    """Episode ``e``'s frames as LeRobot's ``__getitem__`` decodes them, ``[T, V, H, W, 3]`` uint8."""
    ep = dataset.meta.episodes[e]
    steps = []
    for i in range(ep["dataset_from_index"], ep["dataset_to_index"]):
        item = dataset[i]
        steps.append(np.stack([(item[video_key(c)] * 255).round().byte().permute(1, 2, 0).numpy() for c in cameras]))
    return np.stack(steps)


def _error(a: np.ndarray, b: np.ndarray) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())


def _check_frames(root, repo_id: str, renders: list[np.ndarray]) -> dict[str, int]:
    """Reload ``root`` with LeRobot and with our reader; max abs pixel error of each against ``renders``."""
    lerobot, ours = _lerobot(repo_id, root), Dataset(root)
    assert lerobot.num_episodes == ours.num_episodes == len(renders)
    assert lerobot.num_frames == len(ours) == sum(len(r) for r in renders)
    assert lerobot.meta.fps == 20 and isinstance(lerobot.meta.fps, int)
    err = {"lerobot": 0, "ours": 0}
    for e, render in enumerate(renders):
        err["lerobot"] = max(err["lerobot"], _error(_lerobot_frames(lerobot, ours.cameras, e), render))
        err["ours"] = max(err["ours"], _error(ours.episode(e)["rgb"], render))
    assert ours.lossless_video  # info.json names lossless HEVC and every video file is HEVC
    return err


def test_lerobot_opens_our_dataset_with_integer_fps_and_a_codec_its_tools_accept(collected):
    base, root, renders = collected
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["fps"] == 20 and isinstance(info["fps"], int)
    for cam in ("agentview", "wrist"):
        vinfo = info["features"][video_key(cam)]["info"]
        assert (vinfo["video.codec"], vinfo["video.pix_fmt"], vinfo["video.fps"]) == ("hevc", "gbrp", 20)
        encoder = encoder_config_from_video_info(vinfo)  # what delete/split re-encode with; raises for ffv1/mpeg4
        assert encoder.vcodec == "hevc" and "lossless=1" in encoder.get_codec_options()["x265-params"]
    assert _check_frames(root, "local/ds", renders) == {"lerobot": MAX_PIXEL_ERROR, "ours": MAX_PIXEL_ERROR}
    # our per-episode fields live beside LeRobot's columns, which hold its statistics
    ours = Dataset(root)
    assert [m["suite_task_index"] for m in ours.episodes] == [2, 3] and all(m["success"] for m in ours.episodes)
    assert ours.episode_stats(0)["action/count"] == [len(renders[0])]
    assert set(QUANTILE_KEYS) <= set(ours.stats["action"])
    assert np.shape(ours.stats[video_key("wrist")]["q99"]) == (3, 1, 1)
    # LeRobot takes integer rates only
    assert integer_fps(20.0) == 20
    with pytest.raises(ValueError, match="integer"):
        DatasetWriter(
            base / "bad", fps=20.5, cameras=(), image_size=32, state_names=["s"], action_names=["a"], privileged_dim=0
        )


def test_delete_episodes_and_split_dataset_keep_the_frames(collected, record_property):
    base, root, renders = collected
    source = _lerobot("local/ds", root)
    delete_episodes(source, [0], output_dir=base / "deleted", repo_id="local/deleted")
    err = {"deleted": _check_frames(base / "deleted", "local/deleted", renders[1:])}
    video = lambda r: r / "videos" / video_key("agentview") / "chunk-000" / "file-000.mp4"  # noqa: E731
    # the file held both episodes: LeRobot re-encoded it, with the codec info.json names
    assert video(base / "deleted").read_bytes() != video(root).read_bytes()
    assert video_codec(video(base / "deleted")) == "hevc"
    split_dataset(source, {"first": [0], "second": [1]}, output_dir=base / "split")
    err["first"] = _check_frames(base / "split" / "first", "local/ds_first", renders[:1])
    err["second"] = _check_frames(base / "split" / "second", "local/ds_second", renders[1:])
    print(f"max abs pixel error after LeRobot's tools: {err}")
    record_property("max_abs_pixel_error", err)
    assert all(e == {"lerobot": MAX_PIXEL_ERROR, "ours": MAX_PIXEL_ERROR} for e in err.values())
    # LeRobot carried the per-episode statistics over (they are its columns) and aggregated them
    kept = Dataset(base / "deleted")
    assert kept.episode_stats(0)["action/mean"] == pytest.approx(Dataset(root).episode_stats(1)["action/mean"])
    assert kept.stats["action"]["count"] == [len(renders[1])]
    assert kept.episodes[0]["success"]  # from next.success: LeRobot's tools drop our extra fields


def test_resume_and_append_an_episode_then_reload(collected, record_property):
    base, root, renders = collected
    app = base / "appended"
    shutil.copytree(root, app)
    ours = Dataset(root)
    ep = ours.episode(1)
    writer = LeRobotDataset.resume(
        "local/appended", root=app, rgb_encoder=lerobot_rgb_encoder(app), video_backend="pyav"
    )
    for t in range(len(ep["action"])):
        frame = {
            "observation.state": ep["observation.state"][t],
            "observation.privileged": ep["observation.privileged"][t],
            "action": ep["action"][t],
            "next.reward": np.array([ep["next.reward"][t]], np.float32),
            "next.done": np.array([ep["next.done"][t]]),
            "next.success": np.array([ep["next.success"][t]]),
            "task": ep["instruction"],
        }
        for v, cam in enumerate(ours.cameras):
            frame[video_key(cam)] = ep["rgb"][t, v]
        writer.add_frame(frame)
    writer.save_episode(parallel_encoding=False)
    writer.finalize()

    # LeRobot wrote the new episode's row in a new file of meta/episodes with our file's schema
    files = sorted((app / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    import pyarrow.parquet as pq

    assert len(files) == 2 and pq.read_schema(files[0]) == pq.read_schema(files[1])
    err = _check_frames(app, "local/appended", renders + [renders[1]])
    print(f"max abs pixel error after LeRobot's append: {err}")
    record_property("max_abs_pixel_error", err)
    assert err == {"lerobot": MAX_PIXEL_ERROR, "ours": MAX_PIXEL_ERROR}

    got = Dataset(app)
    np.testing.assert_array_equal(got.episode(2)["action"], ep["action"])
    assert got.episodes[1]["init_id"] == ours.episodes[1]["init_id"] and "init_id" not in got.episodes[2]
    assert got.episodes[2]["success"] == ours.episodes[1]["success"]  # derived from next.success
    assert got.info["embodied"]["suite"] == "goal"  # LeRobot rewrote info.json; meta/embodied/info.json kept it
    # our statistics of episode 1 are LeRobot's of its copy (episode 2): the same stats, its quantile
    # estimate; the variance to float32 precision (LeRobot's is E[x^2] - E[x]^2 in float32)
    mine, theirs = got.episode_stats(1), got.episode_stats(2)
    assert set(mine) == set(theirs)
    for key in mine:
        feature, stat = key.rsplit("/", 1)
        if feature in ("index", "episode_index"):
            continue
        a, b = np.asarray(mine[key], np.float64), np.asarray(theirs[key], np.float64)
        if stat == "count":
            np.testing.assert_array_equal(a, b, err_msg=key)
        elif stat in ("min", "max"):  # the same values (LeRobot divides images' by 255 in float32)
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=0, err_msg=key)
        elif stat == "std":
            second_moment = np.asarray(mine[f"{feature}/mean"], np.float64) ** 2 + a**2  # E[x^2]
            np.testing.assert_array_less(np.abs(a**2 - b**2), 1e-4 * second_moment + 1e-9, err_msg=key)
        else:
            assert stat == "mean" or stat in QUANTILE_KEYS
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)
