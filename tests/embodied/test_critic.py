"""The separate critic on privileged state (asymmetric actor-critic): its pieces as pure functions,
then a real rollout valued by it (tiny sizes, real MuJoCo)."""

from __future__ import annotations

import pytest
import torch

import policies
import sims
from embodied.algorithms.batch import ppo_batch
from embodied.algorithms.critic import (
    CriticInputs,
    EpisodeClock,
    PrivilegedCritic,
    RunningNorm,
    build_critic,
    critic_features,
    critic_input_dim,
)
from embodied.algorithms.params import split_parameters
from embodied.algorithms.rollout import collect_chunks
from embodied.rllib.module import PolicyRLModule, module_config

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)


def test_episode_clock_counts_executed_steps_and_restarts_ended_episodes():
    clock = EpisodeClock(3)
    executed = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    end = clock.advance(executed, torch.tensor([False, True, False]))
    assert end.tolist() == [3, 2, 3] and clock.elapsed.tolist() == [3, 0, 3]
    end = clock.advance(torch.ones(3, 3, dtype=torch.bool), torch.tensor([False, False, True]))
    assert end.tolist() == [6, 3, 6] and clock.elapsed.tolist() == [6, 3, 0]
    clock.reset()
    assert clock.elapsed.tolist() == [0, 0, 0]


def test_running_norm_matches_the_statistics_of_all_batches():
    torch.manual_seed(0)
    norm = RunningNorm(4, clip=100.0, min_std=1e-6)
    chunks = [torch.randn(n, 4) * torch.tensor([1.0, 0.01, 5.0, 2.0]) + 3.0 for n in (5, 17, 1, 40)]
    for c in chunks:
        norm.update(c)
    norm.update(torch.zeros(0, 4))  # an empty batch changes nothing
    allx = torch.cat(chunks)
    assert int(norm.count) == len(allx)
    torch.testing.assert_close(norm.mean, allx.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var, allx.var(0, unbiased=False), rtol=1e-4, atol=1e-6)
    z = norm(allx)
    torch.testing.assert_close(z.mean(0), torch.zeros(4), rtol=0, atol=1e-4)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(4), rtol=1e-3, atol=1e-3)
    # clipping and the std floor keep a constant feature (std 0) from exploding
    flat = RunningNorm(1)
    flat.update(torch.ones(10, 1))
    assert float(flat(torch.tensor([[2.0]]))) == 5.0


def test_critic_features_layout():
    obs = {"state": torch.arange(6.0).view(2, 3), "privileged": torch.ones(2, 2), "task_id": torch.tensor([1, 0])}
    f = critic_features(obs, torch.tensor([10, 30]), torch.tensor([40, 100, 50]), num_tasks=3)
    assert f.shape == (2, critic_input_dim(3, 2, 3)) == (2, 9)
    torch.testing.assert_close(f, torch.tensor([[0, 1, 2, 1, 1, 0, 1, 0, 10 / 100], [3, 4, 5, 1, 1, 1, 0, 0, 30 / 40]]))


def test_privileged_critic_checks_and_build():
    critic = PrivilegedCritic(9, hidden=(16, 16))
    assert critic(torch.zeros(5, 9)).shape == (5,)
    assert float(critic(torch.randn(64, 9)).detach().abs().max()) < 0.5  # values start near 0
    with pytest.raises(ValueError, match="expects 9 input features, got 8"):
        critic(torch.zeros(5, 8))
    with pytest.raises(ValueError, match="hidden sizes >= 1"):
        PrivilegedCritic(9, hidden=())
    assert build_critic(None) is None and build_critic({"kind": "policy"}) is None
    assert isinstance(build_critic({"kind": "privileged", "input_dim": 9, "hidden": [8]}), PrivilegedCritic)
    with pytest.raises(ValueError, match="unknown critic kind 'oracle'"):
        build_critic({"kind": "oracle", "input_dim": 9})
    with pytest.raises(ValueError, match="step limits must be >= 1"):
        CriticInputs(critic, 2, [0])


def test_module_with_a_separate_critic_splits_parameters_and_values_from_it():
    policy = policies.make("flow", expert_layers=1, **TINY)
    cfg = module_config(policy, ["a task"], critic={"kind": "privileged", "input_dim": 7, "hidden": [8]})
    module = PolicyRLModule(observation_space=None, action_space=None, inference_only=False, model_config=cfg)
    actor, critic = split_parameters(module)
    names = {id(p): n for n, p in module.named_parameters()}
    assert critic and all(names[id(p)].startswith("critic.") for p in critic)
    assert not any(".value_mlp." in names[id(p)] for p in actor + critic)  # the unused value head steps in neither
    assert not any(p.requires_grad for n, p in module.named_parameters() if ".value_mlp." in n)
    assert set(module.critic_state()) >= {"norm.mean", "norm.var", "norm.count", "head.weight"}
    plain = PolicyRLModule(
        observation_space=None, action_space=None, inference_only=False, model_config=module_config(policy, ["a task"])
    )
    assert plain.critic is None and plain.critic_state() == {}
    plain_names = {id(p): n for n, p in plain.named_parameters()}
    assert all(".value_mlp." in plain_names[id(p)] for p in split_parameters(plain)[1])


def test_rollout_valued_by_the_privileged_critic():
    torch.manual_seed(0)
    with sims.make("mujoco", suite="goal", num_envs=3, image_size=32, max_steps=5) as env:
        policy = policies.make("flow", expert_layers=1, sampler="sde", **TINY)
        s, p = env.observation_spec["state"].shape[0], env.observation_spec["privileged"].shape[0]
        dim = critic_input_dim(s, p, len(env.tasks))
        inputs = CriticInputs(PrivilegedCritic(dim, hidden=(16,)), env.num_envs, [5] * len(env.tasks))
        obs = env.reset(seed=0, task_ids=[0, 1, 2])
        rollout, obs = collect_chunks(
            env, policy, obs, num_chunks=4, generator=torch.Generator().manual_seed(0), critic=inputs
        )
    assert rollout.critic_obs.shape == (4, 3, dim)
    # the time input: 0, 3 steps into the 5-step episode, then a new episode (truncated at step 5)
    torch.testing.assert_close(rollout.critic_obs[:, :, -1], torch.tensor([0.0, 0.6, 0.0, 0.6])[:, None].expand(4, 3))
    # the policy's obs["time_left"] comes from the same clock: the fraction of the limit still left
    torch.testing.assert_close(rollout.time_left, 1.0 - rollout.critic_obs[:, :, -1])
    onehot = rollout.critic_obs[0, :, s + p : s + p + len(env.tasks)]
    assert onehot.argmax(1).tolist() == [0, 1, 2]
    torch.testing.assert_close(rollout.value, inputs.critic(rollout.critic_obs.flatten(0, 1)).view(4, 3).detach())
    assert rollout.trunc[1].all() and rollout.trunc[3].all() and inputs.clock.elapsed.tolist() == [0, 0, 0]
    # a truncated episode's final observation is valued at the limit (fraction 1), not at the reset's 0:
    # weights that make the value tanh(fraction) show which time each value was computed at
    with torch.no_grad():
        for prm in inputs.critic.parameters():
            prm.zero_()
        inputs.critic.mlp[0].weight[0, -1] = 1.0
        inputs.critic.head.weight[0, 0] = 1.0
        inputs.critic.norm.var.fill_(1.0)
    with sims.make("mujoco", suite="goal", num_envs=3, image_size=32, max_steps=5) as env:
        inputs.clock.reset()
        timed, _ = collect_chunks(
            env,
            policy,
            env.reset(seed=0, task_ids=[0, 1, 2]),
            num_chunks=2,
            generator=torch.Generator().manual_seed(0),
            critic=inputs,
        )
    fractions = torch.tensor([0.0, 0.6])[:, None].expand(2, 3)
    torch.testing.assert_close(timed.value, torch.tanh(fractions))
    torch.testing.assert_close(timed.final_value[1], torch.tanh(torch.ones(3)))
    torch.testing.assert_close(timed.last_value, torch.zeros(3))  # the new episodes' first observations
    batch = ppo_batch(rollout, normalize=False)
    assert batch["critic_obs"].shape == (12, dim)
    torch.testing.assert_close(batch["old_values"], rollout.value.flatten())
