"""Chunk rollouts from a real VecEnv and the PPO update on them (tiny sizes)."""

from __future__ import annotations

import pytest
import torch

import policies
import sims
from embodied.rl.ppo_update import PPOConfig, ppo_update
from embodied.rl.rollout import collect_chunks

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)


@pytest.mark.parametrize("family,extra", [("flow", {"sampler": "sde", "expert_layers": 1}),
                                          ("flow", {"sampler": "noise", "expert_layers": 1}),
                                          ("autoregressive", {"decoder_layers": 1})])
def test_rollout_then_ppo_update(family, extra):
    torch.manual_seed(0)
    policy = policies.make(family, **TINY, **extra)
    with sims.make("mujoco", suite="goal", num_envs=3, image_size=32, max_steps=5) as env:
        obs = env.reset(seed=0)
        gen = torch.Generator().manual_seed(0)
        rollout, obs = collect_chunks(env, policy, obs, num_chunks=4, generator=gen)
    t, n = rollout.shape
    assert (t, n) == (4, 3) and rollout.rgb.shape == (4, 3, 2, 32, 32, 3)
    assert rollout.env_steps == 3 * 2 * 5  # each env ran two 5-step episodes (chunks stop at episode ends)
    # a 5-step limit with 3-step chunks: each env is truncated inside its second chunk
    assert rollout.trunc[1].all() and rollout.done[1].all() and not rollout.done[0].any()
    assert (rollout.final_value[1] != 0).all() and (rollout.final_value[0] == 0).all()
    assert len(rollout.episode_lengths) >= 3 and set(rollout.episode_lengths) == {5}
    # before any update the recomputed log-probabilities equal the stored ones (ratio 1)
    idx = torch.arange(t * n)
    lp, _, val = policy.logprob(rollout.policy_obs(idx), rollout.flat_extras(idx))
    torch.testing.assert_close(lp, rollout.logprob.flatten(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(val, rollout.value.flatten(), rtol=1e-4, atol=1e-4)
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    stats = ppo_update(policy, opt, rollout, PPOConfig(epochs=1, minibatch_size=6), generator=gen)
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert stats["approx_kl"] >= 0.0 and 0.0 <= stats["clip_fraction"] <= 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
