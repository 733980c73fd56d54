"""Chunk rollouts from a real VecEnv, training batches and the learner's chunk PPO loss on them (tiny
sizes). The update itself runs through the RLlib algorithm: tests/embodied/test_train.py."""

from __future__ import annotations

import pytest
import torch

import policies
import sims
from embodied.algorithms.batch import grpo_batch, ppo_batch
from embodied.algorithms.loss import LossConfig, chunk_ppo_loss, evaluate_minibatch, policy_obs
from embodied.algorithms.rollout import collect_chunks

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)


@pytest.mark.parametrize(
    "family,extra",
    [
        ("flow", {"sampler": "sde", "expert_layers": 1}),
        ("flow", {"sampler": "noise", "expert_layers": 1}),
        ("autoregressive", {"decoder_layers": 1}),
    ],
)
def test_rollout_then_the_chunk_ppo_loss(family, extra):
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
    batch = ppo_batch(rollout)
    assert batch["rgb"].shape == (t * n, 2, 32, 32, 3) and batch["advantages"].shape == (t * n,)
    assert abs(float(batch["advantages"].mean())) < 1e-5
    # truncation=fail: the step limit ends the episode like a termination, so the truncated chunk's
    # target is its reward alone (bootstrap: plus the discounted value of the final observation)
    fail = ppo_batch(rollout, truncation="fail", normalize=False)["value_targets"].reshape(t, n)
    boot = ppo_batch(rollout, normalize=False)["value_targets"].reshape(t, n)
    torch.testing.assert_close(fail[1], rollout.reward[1])
    torch.testing.assert_close(boot[1], rollout.reward[1] + 0.99 * rollout.final_value[1])
    with pytest.raises(ValueError, match="truncation must be one of"):
        ppo_batch(rollout, truncation="never")
    # the learner's loss on a minibatch (what ChunkPPOLearner.compute_loss_for_module evaluates): on the
    # weights that sampled it the ratio is 1, and its gradient reaches the actor and the value head
    policy.train()
    mb = {k: v[:6] for k, v in batch.items()}
    lp, ent, val = evaluate_minibatch(policy, mb, rollout.instructions)
    loss, stats = chunk_ppo_loss(lp, ent, val, mb, LossConfig())
    assert torch.isfinite(loss) and all(torch.isfinite(torch.tensor(v)) for v in vars(stats).values())
    assert abs(stats.approx_kl) < 1e-5 and stats.clip_fraction == 0.0 and stats.value_loss > 0.0
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith("value_mlp."))
    assert any(g.abs().sum() > 0 for n, g in grads.items() if not n.startswith("value_mlp."))


def test_grpo_batch_keeps_first_episodes_of_mixed_groups():
    """Two groups of two envs: group 0 mixed (one success), group 1 all failures -> only group 0's
    first-episode chunks are kept, with advantages +-0.707 (normalised returns 1 and 0)."""
    from embodied.algorithms.rollout import Rollout

    t, n = 3, 4
    done = torch.tensor([[False, False, False, False], [True, True, True, True], [False, False, False, False]])
    success = torch.zeros(t, n, dtype=torch.bool)
    success[1, 0] = True
    reward = success.float()
    z = torch.zeros(t, n)
    rollout = Rollout(
        rgb=torch.zeros(t, n, 1, 2, 2, 3, dtype=torch.uint8),
        state=torch.zeros(t, n, 15),
        task_id=torch.zeros(t, n, dtype=torch.long),
        extras={"noise": torch.randn(t, n, 2)},
        logprob=z,
        value=z,
        reward=reward,
        done=done,
        trunc=torch.zeros_like(done),
        success=success,
        final_value=z,
        last_value=torch.zeros(n),
        instructions=["x"],
        env_steps=0,
    )
    batch, info = grpo_batch(rollout, group_size=2)
    assert info == {"groups": 2.0, "groups_kept": 1.0}
    assert batch["advantages"].shape == (4,) and batch["x.noise"].shape == (4, 2)
    torch.testing.assert_close(
        batch["advantages"].sort().values, torch.tensor([-0.7071, -0.7071, 0.7071, 0.7071]), atol=1e-3, rtol=0
    )
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_batch(rollout, group_size=3)
    with pytest.raises(ValueError, match="weighting must be one of"):
        grpo_batch(rollout, group_size=2, weighting="token")
    with pytest.raises(ValueError, match="keep must be one of"):
        grpo_batch(rollout, group_size=2, keep="all")
    assert grpo_batch(rollout, group_size=2, keep="return")[1]["groups_kept"] == 1.0  # sparse: the same
    # shaped rewards: group 1's failures made different progress (0.2 vs 0.5), so keep="return" keeps it
    # too, its rollout that got further being the one pushed up
    shaped = rollout.reward.clone()
    shaped[0, 2:] = torch.tensor([0.2, 0.5])
    rollout.reward = shaped
    assert grpo_batch(rollout, group_size=2)[1]["groups_kept"] == 1.0
    both, info = grpo_batch(rollout, group_size=2, keep="return")
    assert info["groups_kept"] == 2.0 and both["advantages"].shape == (8,)
    adv = both["advantages"].view(2, 4)  # [chunk, env]: every env's 2 first-episode chunks
    assert (adv[:, 3] > 0).all() and (adv[:, 2] < 0).all()
    rollout.reward = success.float()
    # group 0 again, its success ending after 1 chunk and its failure after 2: per episode, the
    # chunks' advantages sum to 0; per chunk, the longer failure outweighs the success
    rollout.done = torch.tensor([[True, False, False, False], [False, True, True, True], [False, False, False, False]])
    rollout.success = torch.zeros(t, n, dtype=torch.bool)
    rollout.success[0, 0] = True
    rollout.reward = rollout.success.float()
    even, _ = grpo_batch(rollout, group_size=2, weighting="episode")
    plain, _ = grpo_batch(rollout, group_size=2)
    assert even["advantages"].shape == plain["advantages"].shape == (3,)
    assert abs(float(even["advantages"].sum())) < 1e-5 and float(plain["advantages"].sum()) < -0.5
    # episode statistics of the first episodes only: env 0 ended a quick success, then a second episode
    rollout.episode_envs, rollout.episode_returns = [0, 1, 0, 2], [1.0, 0.0, 1.0, 0.0]
    rollout.episode_lengths, rollout.episode_success = [4, 9, 3, 9], [True, False, True, False]
    assert rollout.first_episodes() == ([1.0, 0.0, 0.0], [4, 9, 9], [True, False, False])


def test_per_dimension_ratio_is_the_geometric_mean():
    """ratio="per_dim" (log-probabilities times 1/D) turns a chunk's log-ratio of D dimensions into its
    per-dimension mean: a shift of 0.35 nats over 35 dimensions is a ratio of e^0.01, inside the clip
    range. The loss needs D (the learner passes its policy's H*A)."""
    from embodied.algorithms.loss import chunk_ppo_loss

    mb = {"old_logprob": torch.zeros(4), "advantages": torch.ones(4)}
    new = torch.full((4,), 0.35, requires_grad=True)
    _, whole = chunk_ppo_loss(new, torch.zeros(4), torch.zeros(4), mb, LossConfig(use_critic=False))
    per_dim_config = LossConfig(use_critic=False, ratio="per_dim")
    _, per_dim = chunk_ppo_loss(new, torch.zeros(4), torch.zeros(4), mb, per_dim_config, action_dims=35)
    assert whole.clip_fraction == 1.0 and per_dim.clip_fraction == 0.0
    assert abs(per_dim.policy_loss + float(torch.exp(torch.tensor(0.01)))) < 1e-6
    assert per_dim_config.logprob_scale(35) == 1 / 35 and LossConfig().logprob_scale(None) == 1.0
    with pytest.raises(ValueError, match="needs the policy's action dimensions"):
        chunk_ppo_loss(new, torch.zeros(4), torch.zeros(4), mb, per_dim_config)


def test_negative_advantages_scaled():
    """neg_adv_scale multiplies negative advantages only: at 0 the failures give no gradient at all."""
    from embodied.algorithms.loss import chunk_ppo_loss

    mb = {"old_logprob": torch.zeros(4), "advantages": torch.tensor([1.0, -1.0, -2.0, 0.5])}
    for scale, expected in (
        (1.0, -(1.0 - 1.0 - 2.0 + 0.5) / 4),
        (0.0, -(1.0 + 0.5) / 4),
        (0.5, -(1.0 - 0.5 - 1.0 + 0.5) / 4),
    ):
        new = torch.zeros(4, requires_grad=True)
        loss, st = chunk_ppo_loss(
            new, torch.zeros(4), torch.zeros(4), mb, LossConfig(use_critic=False, neg_adv_scale=scale)
        )
        loss.backward()
        assert abs(st.policy_loss - expected) < 1e-6
        assert (new.grad[1:3] == 0).all() == (scale == 0.0)


def test_split_parameters_actor_critic_and_frozen_prefix():
    from embodied.rllib.learner import split_parameters

    policy = policies.make("flow", expert_layers=1, **TINY)
    actor, critic = split_parameters(policy)
    assert len(actor) + len(critic) == len(list(policy.parameters()))
    assert {id(p) for p in critic} == {id(p) for p in policy.value_mlp.parameters()}
    actor_f, critic_f = split_parameters(policy, freeze_prefix=True)
    prefix = {id(p) for p in policy.prefix.parameters()}
    assert prefix and not prefix & {id(p) for p in actor_f + critic_f}
    assert not any(p.requires_grad for p in policy.prefix.parameters())
    assert len(critic_f) == len(critic)


def test_state_only_policy_rollout():
    """A policy without cameras reading the privileged state: rollouts carry empty image batches (its
    update through the RLlib algorithm: tests/test_train.py)."""
    torch.manual_seed(0)
    with sims.make("mujoco", suite="goal", num_envs=2, cameras=(), max_steps=4, state_obs="privileged") as env:
        s = env.observation_spec["state"].shape[0]
        policy = policies.make(
            "flow", **{**TINY, "cameras": [], "state_dim": s, "state_obs": "privileged"}, sampler="sde", expert_layers=1
        )
        assert policy.prefix.vision is None
        policy.check_env(env)
        rollout, _ = collect_chunks(env, policy, env.reset(seed=0), num_chunks=2, generator=torch.Generator())
    assert rollout.rgb.shape[:3] == (2, 2, 0) and rollout.state.shape == (2, 2, s)
    idx = torch.arange(4)  # before any update the recomputed log-probabilities are the stored ones
    lp, _, _ = policy.logprob(rollout.policy_obs(idx), rollout.flat_extras(idx))
    torch.testing.assert_close(lp, rollout.logprob.flatten(), rtol=1e-4, atol=1e-4)
    batch = ppo_batch(rollout)
    assert batch["rgb"].shape[:2] == (4, 0) and batch["state"].shape == (4, s)
    with torch.no_grad():
        lp, _, val = evaluate_minibatch(policy, batch, rollout.instructions)
    torch.testing.assert_close(lp, rollout.logprob.flatten(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(val, rollout.value.flatten(), rtol=1e-4, atol=1e-4)
    with sims.make("mujoco", suite="goal", num_envs=1, cameras=()) as plain:
        with pytest.raises(policies.checkpoint.SpecMismatchError, match="state_obs='privileged'"):
            policy.check_env(plain)


def test_rollout_time_left_column_reaches_the_value_and_the_learner():
    """``time_left``: 1 at an episode's start, less at each later chunk, 0 for the final observation
    of an episode cut at its limit, 1 again after the reset; it continues across calls through the
    returned obs; the batch carries it and the learner's value equals the rollout's."""
    torch.manual_seed(0)
    policy = policies.make("flow", sampler="sde", expert_layers=1, **TINY)
    seen: list[torch.Tensor] = []
    value = policy.value
    policy.value = lambda o: (seen.append(o["time_left"].clone()), value(o))[1]  # final and last values
    with sims.make("mujoco", suite="goal", num_envs=3, image_size=32, max_steps=5) as env:
        gen = torch.Generator().manual_seed(0)
        first, obs = collect_chunks(env, policy, env.reset(seed=0), num_chunks=1, generator=gen)
        assert obs["elapsed"].tolist() == [3, 3, 3]
        rollout, obs = collect_chunks(env, policy, obs, num_chunks=3, generator=gen)  # continues the episodes
    # 5-step episodes, 3-step chunks: chunks start at steps 0, 3 | 0, 3 (truncated at step 5)
    torch.testing.assert_close(first.time_left, torch.ones(1, 3))
    torch.testing.assert_close(rollout.time_left, torch.tensor([0.4, 1.0, 0.4])[:, None].expand(3, 3))
    assert float(rollout.time_left.min()) >= 0.0 and float(rollout.time_left.max()) <= 1.0
    assert rollout.trunc[0].all() and rollout.trunc[2].all()
    # values of first's last obs (0.4), then rollout's final observations at the limit (0), its last obs (1)
    torch.testing.assert_close(torch.stack(seen), torch.tensor([0.4, 0.0, 0.0, 1.0])[:, None].expand(4, 3))
    assert obs["elapsed"].tolist() == [0, 0, 0]
    batch = ppo_batch(rollout)
    torch.testing.assert_close(batch["time_left"], rollout.time_left.flatten())
    assert "time_left" in policy_obs(batch, rollout.instructions)
    with torch.no_grad():
        _, _, val = evaluate_minibatch(policy, batch, rollout.instructions)
        torch.testing.assert_close(val, rollout.value.flatten(), rtol=1e-5, atol=1e-6)
        blind = policy.logprob(
            {k: v for k, v in policy_obs(batch, rollout.instructions).items() if k != "time_left"},
            rollout.flat_extras(torch.arange(9)),
        )[2]
    assert not torch.allclose(blind, val)  # the column matters: without it the value reads time_left=1


def test_token_vla_value_is_detached_and_reads_time_left():
    """The token VLA's default critic: detached features plus the time left, as the flow policy's."""
    torch.manual_seed(0)
    policy = policies.make("autoregressive", decoder_layers=1, **TINY)
    g = torch.Generator().manual_seed(0)
    obs = {
        "rgb": torch.randint(0, 256, (4, 2, 32, 32, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(4, 15, generator=g),
        "instruction": ["a", "b", "c", "d"],
        "time_left": torch.tensor([1.0, 0.6, 0.3, 0.0]),
    }
    sample = policy.sample(obs, generator=g)
    _, _, value = policy.logprob(obs, sample.extras)
    torch.testing.assert_close(value, sample.value)
    torch.testing.assert_close(policy.value(obs), value)
    ((value - 1.0) ** 2).mean().backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    assert all(g is None or not g.abs().sum() > 0 for n, g in grads.items() if not n.startswith("value_mlp."))
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith("value_mlp."))
    with torch.no_grad():
        late = policy.value({**obs, "time_left": torch.full((4,), 0.1)})
        early = policy.value({**obs, "time_left": torch.full((4,), 0.9)})
    assert not torch.allclose(early, late)


@pytest.mark.parametrize(
    "family,extra", [("flow", {"sampler": "sde", "expert_layers": 1}), ("autoregressive", {"decoder_layers": 1})]
)
def test_learner_encodes_each_row_once_with_a_frozen_encoder(family, extra):
    """With the encoder frozen (RL's freeze_prefix) the module keeps each row's prefix tokens from the
    first minibatch that holds it: later minibatches (other rows mixed, instructions of other lengths, so
    other padding) encode nothing and get the log-probs, entropies and values of encoding afresh."""
    from embodied.algorithms.batch import ROW
    from embodied.algorithms.params import split_parameters
    from embodied.rllib.module import PolicyRLModule, module_config

    torch.manual_seed(0)
    policy = policies.make(family, **TINY, **extra)
    with sims.make("mujoco", suite="goal", num_envs=3, image_size=32, max_steps=5) as env:
        obs = env.reset(seed=0, task_ids=[0, 1, 8])  # three instructions of different lengths
        rollout, _ = collect_chunks(env, policy, obs, num_chunks=2, generator=torch.Generator().manual_seed(0))
        instructions = rollout.instructions
    assert len({len(instructions[i]) for i in (0, 1, 8)}) == 3
    batch = ppo_batch(rollout)
    module = PolicyRLModule(
        observation_space=None,
        action_space=None,
        inference_only=False,
        model_config=module_config(policy, instructions),
    )
    module.policy.load_state_dict(policy.state_dict())
    split_parameters(module, freeze_prefix=True)
    assert module.policy.frozen_prefix
    encoded_rows = []
    module.policy.prefix.register_forward_hook(lambda m, inp, out: encoded_rows.append(out[0].shape[0]))

    def forward(rows: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.tensor(rows)
        return module._forward_train({**{k: v[idx] for k, v in batch.items()}, ROW: idx})

    module.keep_prefix_tokens(True)
    forward([0, 1, 2])
    forward([3, 4, 5])
    assert encoded_rows == [3, 3]
    mixed = [5, 0, 4, 2]  # one row of each instruction but the longest in a short one: other padding
    kept = forward(mixed)
    assert encoded_rows == [3, 3]  # nothing encoded again
    module.keep_prefix_tokens(False)
    fresh = forward(mixed)
    assert encoded_rows == [3, 3, 4]
    for key in ("logprob", "entropy", "value"):
        torch.testing.assert_close(kept[key], fresh[key], rtol=1e-5, atol=1e-5)
    kept["logprob"].sum().backward()  # the actor still gets its gradient through the kept tokens
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0
        for n, p in module.named_parameters()
        if not n.startswith("policy.prefix.")
    )
    # an encoder that trains is never kept: its tokens change with every step
    for p in module.policy.prefix.parameters():
        p.requires_grad_(True)
    module.keep_prefix_tokens(True)
    forward([0, 1])
    forward([0, 1])
    assert encoded_rows == [3, 3, 4, 2, 2]
