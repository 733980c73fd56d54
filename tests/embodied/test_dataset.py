"""The demonstration datasets (embodied/data: collect_suite, the LeRobot format reader and writer, the
training loader): round trips, frames bit for bit, lossless video, DART action noise. The
embodied-collect command: tests/embodied/test_pipeline.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def test_dataset_reader_round_trip(tmp_path):
    import sims
    from embodied.data.collect import collect_suite
    from embodied.data.lerobot_format import Dataset

    result = collect_suite("goal", tmp_path / "ds", episodes_per_task=1, task_ids=[2, 8], num_envs=2, image_size=32)
    ds = Dataset(result.root)
    assert ds.num_episodes == 2 and ds.cameras == ["agentview", "wrist"]
    ep = ds.episode(1)
    t = ep["meta"]["length"]
    assert ep["observation.state"].shape == (t, 15) and ep["action"].shape == (t, 7)
    assert ep["rgb"].shape == (t, 2, 32, 32, 3)
    assert ep["instruction"] in {s.instruction for s in sims.suites.tasks("goal")}
    # the decoded frames are the rendered ones (lossless video: see the test below)
    with sims.make("mujoco", suite="goal", num_envs=1, image_size=32) as env:
        obs = env.reset(task_ids=[ep["meta"]["suite_task_index"]], init_ids=[ep["meta"]["init_id"]])
        np.testing.assert_allclose(obs["state"][0].numpy(), ep["observation.state"][0], atol=1e-6)
        np.testing.assert_array_equal(obs["rgb"][0].numpy(), ep["rgb"][0])
    assert ds.stats["action"]["count"] == [len(ds)]


def test_sft_frames_are_the_rendered_frames_bit_for_bit(tmp_path, record_property):
    """What SFT trains on is what RL and evaluation see: the frames ``load_demonstrations`` yields for
    episode e, step t equal (max abs pixel error 0) both the env observation the collector recorded
    and the render of a fresh env reset to the episode's initial state and stepped with its actions."""
    import torch

    import sims
    from embodied.data.collect import collect_suite
    from embodied.data.lerobot_format import Dataset, video_key
    from embodied.data.training import load_demonstrations

    recorded = {}
    result = collect_suite(
        "goal",
        tmp_path / "ds",
        episodes_per_task=2,
        task_ids=[8],
        num_envs=2,
        image_size=32,
        on_episode=lambda ep: recorded.setdefault(ep["init_id"], ep["rgb"]),
    )
    ds = Dataset(result.root)
    assert ds.num_episodes == 2 and ds.cameras == ["agentview", "wrist"]
    demos = load_demonstrations(str(result.root), chunk_size=4, image_size=32)
    max_err = {"recorded": 0, "replayed": 0}
    for e, meta in enumerate(ds.episodes):
        sft = demos.rgb[demos.episode == e].numpy().astype(np.int64)  # [T, 2, 32, 32, 3]
        actions = demos.actions[demos.episode == e]
        assert len(sft) == meta["length"] and sft.shape[1:] == (2, 32, 32, 3)
        max_err["recorded"] = max(max_err["recorded"], int(np.abs(sft - recorded[meta["init_id"]]).max()))
        with sims.make("mujoco", suite="goal", num_envs=1, image_size=32) as env:
            obs = env.reset(task_ids=[meta["suite_task_index"]], init_ids=[meta["init_id"]])
            for t in range(meta["length"]):
                max_err["replayed"] = max(max_err["replayed"], int(np.abs(sft[t] - obs["rgb"][0].numpy()).max()))
                obs, *_ = env.step(torch.as_tensor(actions[t])[None])
    print(f"max abs pixel error, SFT frames vs env observations: {max_err}")
    record_property("max_abs_pixel_error", max_err)
    assert max_err == {"recorded": 0, "replayed": 0}
    assert ds.lossless_video
    for cam in ds.cameras:
        info = ds.features[video_key(cam)]["info"]
        assert (info["video.codec"], info["video.pix_fmt"], info["video.g"]) == ("hevc", "gbrp", 1)


def _write_random_dataset(root: Path, frames: np.ndarray, video_codec: str | None = None) -> None:
    """A dataset of one episode with the given frames ``[T, V, H, W, 3]``."""
    from embodied.data.lerobot_format import DatasetWriter, Episode

    t, v, size = frames.shape[0], frames.shape[1], frames.shape[2]
    writer = DatasetWriter(
        root,
        fps=20.0,
        cameras=["agentview", "wrist"][:v],
        image_size=size,
        state_names=["s"],
        action_names=["a"],
        privileged_dim=0,
        video_codec=video_codec,
    )
    writer.add_episode(
        Episode(
            task_index=0,
            instruction="x",
            state=np.zeros((t, 1)),
            privileged=np.zeros((t, 0)),
            action=np.zeros((t, 1)),
            reward=np.zeros(t),
            done=np.arange(t) == t - 1,
            success=np.zeros(t, bool),
            rgb=frames,
        )
    )
    writer.close()


def test_dataset_video_is_lossless_and_older_mp4v_datasets_still_load(tmp_path):
    """Random frames (every channel independent, so a swapped R/B or any chroma subsampling shows) come
    back bit for bit, from lossless HEVC (new datasets) and FFV1 (datasets from before); a dataset from
    before that, its videos in lossy mp4v and its fps a float, still loads."""
    import json

    from embodied.data.lerobot_format import Dataset, video_key
    from embodied.data.training import load_demonstrations
    from embodied.video import VideoWriter

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (12, 2, 32, 32, 3), dtype=np.uint8)
    for codec in ("hevc", "ffv1"):
        _write_random_dataset(tmp_path / codec, frames, video_codec=codec)
        ds = Dataset(tmp_path / codec)
        assert ds.lossless_video and ds.features[video_key("wrist")]["info"]["video.codec"] == codec
        np.testing.assert_array_equal(ds.episode(0)["rgb"], frames)
    # an old dataset: the same layout, videos in mp4v and info.json saying so
    smooth = np.broadcast_to(
        np.linspace(0, 255, 32, dtype=np.uint8)[None, None, None, :, None], (12, 2, 32, 32, 3)
    ).copy()
    smooth[..., 1] = np.arange(12, dtype=np.uint8)[:, None, None, None] * 10
    _write_random_dataset(tmp_path / "old", smooth)
    info = json.loads((tmp_path / "old" / "meta" / "info.json").read_text())
    for v, cam in enumerate(ds.cameras):
        with VideoWriter(
            tmp_path / "old" / info["video_path"].format(video_key=video_key(cam), chunk_index=0, file_index=0),
            fps=20.0,
        ) as w:
            for f in smooth[:, v]:
                w.write(f)
        info["features"][video_key(cam)]["info"].update(
            {"video.codec": "mpeg4", "video.pix_fmt": "yuv420p", "video.fps": 20.0}
        )
    info["fps"] = 20.0
    (tmp_path / "old" / "meta" / "info.json").write_text(json.dumps(info))
    old = Dataset(tmp_path / "old")
    assert not old.lossless_video
    rgb = old.episode(0)["rgb"]
    assert rgb.shape == smooth.shape and np.abs(rgb.astype(float) - smooth).mean() < 8.0
    assert load_demonstrations(str(tmp_path / "old"), chunk_size=2, image_size=32).rgb.shape == smooth.shape


def test_dataset_video_decodes_identically_with_another_ffmpeg(tmp_path):
    """Lossless video is bit-exact by design: a separate FFmpeg build (imageio-ffmpeg's binary) decodes the
    same frames."""
    import subprocess

    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frames = np.random.default_rng(1).integers(0, 256, (6, 1, 16, 16, 3), dtype=np.uint8)
    _write_random_dataset(tmp_path / "ds", frames)
    path = tmp_path / "ds" / "videos" / "observation.images.agentview" / "chunk-000" / "file-000.mp4"
    raw = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    np.testing.assert_array_equal(np.frombuffer(raw, np.uint8).reshape(6, 16, 16, 3), frames[:, 0])


def _replay_states(ep: dict) -> np.ndarray:
    """The states ``[T, 15]`` that replaying the episode's recorded actions open loop visits."""
    import torch

    import sims

    with sims.make("mujoco", suite="goal", num_envs=1, cameras=()) as env:
        obs = env.reset(task_ids=[ep["meta"]["suite_task_index"]], init_ids=[ep["meta"]["init_id"]])
        states = []
        for action in ep["action"]:
            states.append(obs["state"][0].numpy())
            obs, *_ = env.step(torch.as_tensor(action)[None])
    return np.stack(states)


def test_collect_with_action_noise_records_the_experts_clean_actions(tmp_path):
    """DART: the executed actions carry noise, the dataset holds the expert's action at each visited state."""
    from embodied.data.collect import collect_suite
    from embodied.data.lerobot_format import Dataset

    eps = {}
    for noise in (0.0, 0.1):
        result = collect_suite(
            "goal",
            tmp_path / f"ds{noise}",
            episodes_per_task=1,
            task_ids=[2],
            num_envs=1,
            cameras=(),
            action_noise=noise,
        )
        ds = Dataset(result.root)
        assert ds.info["embodied"]["action_noise"] == noise and ds.episodes[0]["success"]
        eps[noise] = ds.episode(0, images=False)
    clean, noisy = eps[0.0], eps[0.1]
    # without noise the recorded actions are the executed ones: replaying them retraces the episode
    np.testing.assert_allclose(_replay_states(clean), clean["observation.state"], atol=1e-5)
    # with noise the states drift from where the clean actions alone lead, yet the expert still succeeds
    drift = np.abs(_replay_states(noisy)[:, :3] - noisy["observation.state"][:, :3]).max()
    assert drift > 5e-3
    assert not np.allclose(
        noisy["observation.state"][: len(clean["action"])][:, :3],
        clean["observation.state"][: len(noisy["action"])][:, :3],
        atol=1e-3,
    )
    with pytest.raises(ValueError, match="action_noise"):
        collect_suite(
            "goal", tmp_path / "bad", episodes_per_task=1, task_ids=[2], num_envs=1, cameras=(), action_noise=-0.1
        )


def test_collect_a_policys_rollouts_from_the_protocol_states(tmp_path):
    """A policy as the actor: its executed chunks are recorded (replaying them retraces the episode),
    episodes start from the protocol's states in turn, a seed reproduces the collection, and the
    settings that make no sense with a policy (experts on the protocol's states, DART noise) are refused."""
    import policies
    from embodied.data.collect import PolicyActor, collect_suite
    from embodied.data.lerobot_format import Dataset
    from embodied.data.training import load_demonstrations

    tiny = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)
    policy = policies.make("flow", **tiny)
    runs = []
    for name in ("a", "b"):
        result = collect_suite(
            "goal",
            tmp_path / name,
            episodes_per_task=2,
            task_ids=[2],
            num_envs=2,
            image_size=32,
            keep_failures=True,
            max_attempts_per_task=2,
            actor=PolicyActor(policy, "greedy", seed=3),
            init_pool="protocol",
        )
        ds = Dataset(result.root)
        assert ds.num_episodes == 2 and ds.info["embodied"]["init_pool"] == "protocol"
        assert ds.info["embodied"]["actor"] == "policy (greedy)"
        runs.append([ds.episode(e, images=False) for e in range(2)])
    assert [ep["meta"]["init_id"] for ep in runs[0]] == [0, 1]
    # the views are rendered where the policy reads them (every 3rd step); SFT starts samples there alone
    assert ds.info["embodied"]["decision_every"] == 3
    frames = ds.episode(0)["rgb"]
    assert all((frames[t] == frames[t - t % 3]).all() for t in range(len(frames)))
    assert not all((frames[t] == frames[0]).all() for t in range(len(frames)))
    demos = load_demonstrations(str(tmp_path / "b"), chunk_size=3, image_size=32)
    lengths = [len(ep["action"]) for ep in runs[1]]
    assert len(demos) == sum(-(-n // 3) for n in lengths) and len(demos.state) == sum(lengths)
    assert demos.starts[: -(-lengths[0] // 3)].tolist() == list(range(0, lengths[0], 3))
    # both collections together, and only their successful episodes (an untrained policy has none)
    both = load_demonstrations([str(tmp_path / "a"), str(tmp_path / "b")], chunk_size=3, image_size=32)
    assert len(both) == 2 * len(demos) and both.episode.unique().tolist() == [0, 1, 2, 3]
    assert all(not ep["success"] for ep in Dataset(tmp_path / "a").episodes)
    with pytest.raises(ValueError, match="succeeded"):
        load_demonstrations(str(tmp_path / "a"), chunk_size=3, image_size=32, only_successes=True)
    for first, again in zip(*runs):
        np.testing.assert_array_equal(first["action"], again["action"])
    # (a flailing untrained arm's contacts are chaotic: float rounding shows after ~130 steps)
    replay, recorded = _replay_states(runs[0][1])[:100], runs[0][1]["observation.state"][:100]
    np.testing.assert_allclose(replay, recorded, atol=1e-4)
    with pytest.raises(ValueError, match="rollouts"):
        collect_suite("goal", tmp_path / "c", episodes_per_task=1, task_ids=[2], init_pool="protocol")
    with pytest.raises(ValueError, match="DART"):
        collect_suite(
            "goal", tmp_path / "d", episodes_per_task=1, task_ids=[2], actor=PolicyActor(policy), action_noise=0.1
        )
