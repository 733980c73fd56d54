"""Render on demand: ``step_chunk`` draws only the observations it returns, with the pixels that
rendering every step gives; the per-step API and frame histories keep rendering every step."""

from __future__ import annotations

import pytest
import torch

import sims

VIEWS = ("agentview", "wrist")


def _chunks(
    suite: str,
    every: bool,
    *,
    n: int = 3,
    horizon: int = 4,
    chunks: int = 8,
    max_steps: int = 10,
    cameras: tuple[str, ...] = VIEWS,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The returned observations' views, the final observations' views of the episodes that ended
    (short episodes: several end inside a chunk) and the states, over random chunks."""
    env = sims.make("mujoco", suite=suite, num_envs=n, seed=5, cameras=cameras, image_size=32, max_steps=max_steps)
    obs = env.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    views, finals, states = [obs["rgb"].clone()], [], [obs["state"].clone()]
    try:
        for _ in range(chunks):
            res = env.step_chunk(torch.rand(n, horizon, 7, generator=gen) * 2 - 1, render_every_step=every)
            views.append(res.obs["rgb"].clone())
            states.append(res.obs["state"].clone())
            finals.append(res.final_obs["rgb"][res.done].clone())
    finally:
        env.close()
    return views, finals, states


@pytest.mark.parametrize("suite", ["goal", "spatial"])
def test_chunks_return_the_pixels_of_rendering_every_step(suite):
    every = _chunks(suite, True)
    lazy = _chunks(suite, False)
    assert sum(len(f) for f in every[1]) >= 2  # episodes ended inside chunks: their final frames count too
    for a, b in zip(every, lazy):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_step_without_render_keeps_the_last_frames():
    env = sims.make("mujoco", suite="goal", num_envs=2, seed=0, cameras=("agentview",), image_size=32)
    try:
        obs = env.reset(seed=0)
        move = torch.zeros(2, 7)
        move[:, 0] = 1.0  # the arm moves in x: its view changes
        skipped = env.step(move, render=False)[0]
        assert not torch.equal(skipped["state"], obs["state"])
        assert torch.equal(skipped["rgb"], obs["rgb"])  # not drawn: the frames of the reset
        drawn = env.step(move)[0]
        assert not torch.equal(drawn["rgb"], obs["rgb"])
    finally:
        env.close()


def test_a_frame_history_renders_every_step():
    cams = ("agentview", "agentview_prev2")
    every = _chunks("goal", True, cameras=cams, chunks=4)
    lazy = _chunks("goal", False, cameras=cams, chunks=4)
    for a, b in zip(every[0], lazy[0]):
        assert torch.equal(a, b)
    # the lagged view is the frame of two control steps before, which only a per-step render has
    assert not torch.equal(lazy[0][-1][:, 0], lazy[0][-1][:, 1])
