"""MuJoCo Warp's batched ray tracer (``renderer="warp"``, sims/mujoco/warp_render.py) on our scene,
checked against the OpenGL renderer on the same states. Runs on Warp's CPU device here (the render
kernels compile once, about 10 s, then come from Warp's kernel cache)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sims
from sims.mujoco.render import BatchRenderer

pytest.importorskip("mujoco_warp")

from sims.mujoco.warp_render import WarpBatchRenderer

CAMS = ("agentview", "wrist")
SIZE = 32
#: mean absolute RGB difference (0-255) allowed between the ray tracer and OpenGL on one state.
#: Measured on reset and moved states of goal tasks 0, 4, 8: agentview 0.6-0.8, wrist 1.5-3.8 (the
#: shading of the near gripper differs); against the other world's OpenGL image 2.6-12.4. Faults it
#: catches, measured: swapped colour channels 24-40, stale camera poses (no camlight) 40-137 on the
#: wrist, a BVH that is not refit about 5 on agentview and 14-21 on the wrist.
MAX_MAD = 6.0
UP_AND_SIDEWAYS = torch.tensor([[0.5, 0.5, 1.0, 0.0, 0.0, 0.0, -1.0]] * 2)


@pytest.fixture(scope="module")
def env():
    e = sims.make("mujoco_gpu", suite="goal", num_envs=2, seed=0, cameras=CAMS, image_size=SIZE, renderer="warp")
    yield e
    e.close()


@pytest.fixture(scope="module")
def gl(env):
    r = BatchRenderer(env.model, CAMS, SIZE, SIZE)
    yield r
    r.close()


def _gl_images(env, gl: BatchRenderer) -> np.ndarray:
    """OpenGL images ``[2, V, H, W, 3]`` of the env's current (host-mirrored) state."""
    buf = np.zeros((2, len(CAMS), SIZE, SIZE, 3), np.uint8)
    gl.render(env.sim, np.arange(2), buf)
    return buf


def _gray(rgb: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(rgb, dtype=np.float32).mean(axis=-1)


def _mad(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    """Mean absolute difference per image: ``[..., H, W, 3] -> [...]``."""
    return np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean(axis=(-3, -2, -1))


def _assert_agrees_with_gl(warp_rgb: torch.Tensor, gl_rgb: np.ndarray) -> None:
    same = _mad(warp_rgb, gl_rgb)  # [2, V]
    assert (same < MAX_MAD).all(), same
    # and each image is closer to OpenGL's view of its own world than to the other world's
    other = _mad(warp_rgb, gl_rgb[::-1])
    assert (same < other).all(), (same, other)


def test_renders_every_camera_of_every_world_from_the_warp_state(env):
    assert env.renderer == "warp" and isinstance(env._renderer, WarpBatchRenderer)
    rgb = env.reset(task_ids=[8, 8], init_ids=[0, 1])["rgb"]
    assert rgb.shape == (2, len(CAMS), SIZE, SIZE, 3) and rgb.dtype == torch.uint8
    flat = rgb.reshape(2, len(CAMS), -1, 3).float()
    assert (flat.std(dim=(2, 3)) > 20).all()  # not blank (measured 62-76)
    assert ((flat.sum(-1) == 0).float().mean(-1) < 0.5).all()  # mostly not background
    # the worlds start in different states (objects, arm noise): their images differ on every camera
    assert (_mad(rgb[0], rgb[1]) > 1.0).all()


def test_agrees_with_the_opengl_renderer_and_follows_the_state(env, gl):
    before = env.reset(task_ids=[8, 8], init_ids=[0, 1])["rgb"]
    gl_before = _gl_images(env, gl)
    _assert_agrees_with_gl(before, gl_before)
    for _ in range(10):  # move the arm up and sideways
        after = env.step(UP_AND_SIDEWAYS)[0]["rgb"]
    gl_after = _gl_images(env, gl)
    _assert_agrees_with_gl(after, gl_after)
    change_w, change_gl = _gray(after) - _gray(before), _gray(gl_after) - _gray(gl_before)
    assert (np.abs(change_w).mean(axis=(-2, -1)) > [1.0, 10.0]).all()  # the arm moved in both views
    for i in range(2):  # where OpenGL sees the scene change, so does the ray tracer (measured > 0.98)
        for v in range(len(CAMS)):
            assert np.corrcoef(change_w[i, v].ravel(), change_gl[i, v].ravel())[0, 1] > 0.9
    # a reset moves the arm without a physics step: the camera poses must follow it too
    _assert_agrees_with_gl(env.reset(task_ids=[8, 8], init_ids=[2, 3])["rgb"], _gl_images(env, gl))


def test_torch_view_and_partial_ids(env):
    r = env._renderer
    obs = env.reset(task_ids=[8, 8], init_ids=[0, 1])
    t = r.render_torch(env.sim)
    on = "cuda" if str(env.sim.device).startswith("cuda") else "cpu"  # the images stay on the Warp device
    assert t.shape == (2, len(CAMS), SIZE, SIZE, 3) and t.dtype == torch.uint8 and t.device.type == on
    assert torch.equal(t.cpu(), obs["rgb"])
    assert t.data_ptr() == r.render_device(env.sim).ptr  # no copy
    out = np.full((2, len(CAMS), SIZE, SIZE, 3), 7, np.uint8)
    r.render(env.sim, np.array([1]), out)
    assert (out[0] == 7).all() and np.array_equal(out[1], obs["rgb"][1].numpy())


def test_history_cameras_with_the_warp_renderer():
    env = sims.make(
        "mujoco_gpu",
        suite="goal",
        num_envs=2,
        seed=0,
        cameras=("wrist", "wrist_prev2"),
        image_size=SIZE,
        renderer="warp",
    )
    try:
        rgb = env.reset(task_ids=[8, 8])["rgb"]
        assert torch.equal(rgb[:, 0], rgb[:, 1])  # a fresh episode repeats its first frame
        frames = [rgb[:, 0]]
        for _ in range(3):
            rgb = env.step(UP_AND_SIDEWAYS)[0]["rgb"]
            frames.append(rgb[:, 0])
            assert torch.equal(rgb[:, 1], frames[max(len(frames) - 3, 0)])
        assert not torch.equal(frames[-1], frames[-3])
    finally:
        env.close()


def test_renderer_option_and_errors(env):
    with pytest.raises(ValueError, match="physics='warp'"):
        sims.make("mujoco", task="reach", num_envs=1, cameras=("agentview",), image_size=SIZE, renderer="warp")
    with pytest.raises(ValueError, match="renderer must be one of"):
        sims.make("mujoco", task="reach", num_envs=1, cameras=(), renderer="vulkan")
    cpu_env = sims.make("mujoco", task="reach", num_envs=1, cameras=(), image_size=SIZE)
    assert cpu_env.renderer == "gl"
    cpu_env.close()
    auto = sims.make("mujoco_gpu", task="reach", num_envs=1, cameras=(), image_size=SIZE)
    # "auto" picks the ray tracer on CUDA only
    assert auto.renderer == ("warp" if str(auto.sim.device).startswith("cuda") else "gl")
    with pytest.raises(ValueError, match="unknown camera"):
        WarpBatchRenderer(env.sim, ("agentview", "topview"), SIZE, SIZE)
    with pytest.raises(TypeError, match="WarpBatch"):
        env._renderer.render(cpu_env.sim, np.arange(1), np.zeros((2, 2, SIZE, SIZE, 3), np.uint8))
    with pytest.raises(ValueError, match="built for 2 worlds"):
        env._renderer.render(auto.sim, np.arange(1), np.zeros((2, 2, SIZE, SIZE, 3), np.uint8))
    with pytest.raises(ValueError, match="out must be uint8"):
        env._renderer.render(env.sim, np.arange(2), np.zeros((2, 1, SIZE, SIZE, 3), np.uint8))
    auto.close()


def test_sim_benchmark_camera_rows_use_the_chosen_renderer():
    from types import SimpleNamespace

    from benchmarks.sim_gpu import run_gpu_backends

    cfg = SimpleNamespace(
        seed=0,
        gpu_backends=["mujoco_gpu"],
        gpu_num_envs=[2],
        gpu_image_size=SIZE,
        gpu_renderer="warp",
        warmup_steps=1,
        gpu_steps=2,
        gpu_repeats=1,
    )
    rows = run_gpu_backends(cfg)
    assert [(r["camera"], r["renderer"]) for r in rows] == [(False, None), (True, "warp")]
    assert all(r["env_steps_per_s"] > 0 for r in rows)


def test_env_rgb_comes_from_the_device_buffer_and_is_not_aliased(env):
    obs = env.reset(seed=3)
    host = np.zeros((2, len(CAMS), SIZE, SIZE, 3), np.uint8)
    env._renderer.render(env.sim, np.arange(2), host)  # the host path on the same state
    assert torch.equal(obs["rgb"], torch.from_numpy(host))
    kept = obs["rgb"].clone()
    moved, *_ = env.step(UP_AND_SIDEWAYS)
    assert torch.equal(obs["rgb"], kept)  # the next render did not overwrite an earlier observation
    assert not torch.equal(moved["rgb"], kept)
    # only env 0 steps: env 1's rows are re-rendered from its unchanged state, identical
    still, *_ = env.step(UP_AND_SIDEWAYS, active=torch.tensor([True, False]))
    assert torch.equal(still["rgb"][1], moved["rgb"][1]) and not torch.equal(still["rgb"][0], moved["rgb"][0])
