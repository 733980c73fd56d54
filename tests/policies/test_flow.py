"""Flow VLA and its samplers: exact log-probabilities, limits, marginals, real-time chunking, tiny SFT."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

import policies
from policies.flow import sde as S
from policies.flow.rtc import rtc_sample, soft_mask

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)


def _obs(n: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, 2, 40, 40, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": ["pick up the cube", "open the drawer"] * (n // 2) + ["lift"] * (n % 2),
    }


def test_sde_transition_logprob_equals_torch_normal():
    g = torch.Generator().manual_seed(1)
    x_t, v, x_next = (torch.randn(5, 3, 7, generator=g) for _ in range(3))
    t = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2])
    mean, std = S.sde_step(x_t, v, t, 0.2, 0.5)
    expected = torch.distributions.Normal(mean, std).log_prob(x_next).flatten(1).sum(1)
    torch.testing.assert_close(S.gaussian_logprob(x_next, mean, std), expected, rtol=1e-6, atol=1e-5)
    expected_ent = torch.distributions.Normal(mean, std).entropy().flatten(1).sum(1)
    torch.testing.assert_close(S.gaussian_entropy(std), expected_ent, rtol=1e-6, atol=1e-5)
    # at t=1 the next time replaces t in 1 - t: sigma = a * sqrt(1 / dt)
    assert torch.allclose(
        S.sde_sigma(torch.tensor([1.0]), 0.2, 0.5, x_t[:1]).flatten(), torch.tensor([0.5 * math.sqrt(5.0)])
    )


@pytest.mark.parametrize("sampler", ["sde", "sde_full", "noise", "fpo", "steer"])
def test_sample_logprob_is_recomputed_exactly(sampler):
    policy = policies.make("flow", sampler=sampler, **TINY)
    obs = _obs()
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(3))
    assert sample.actions.shape == (4, 3, 7) and sample.actions.abs().max() <= 1.0
    logprob, entropy, value = policy.logprob(obs, sample.extras)
    torch.testing.assert_close(logprob, sample.logprob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, sample.value, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(entropy).all() and value.shape == (4,)
    # the recomputation is differentiable (PPO needs gradients through it); DSRL's reach the steering only
    logprob.sum().backward()
    trained = policy.steer.head.weight if sampler == "steer" else policy.velocity.weight
    assert trained.grad is not None


def test_fpo_samples_the_ode_and_its_surrogate_rises_with_flow_matching_on_the_chunk():
    """FPO acts with the flow's own ODE (what evaluation runs); its surrogate is minus the flow-matching
    error of the sampled chunk, so fitting the velocity field to that chunk raises it (ratio > 1)."""
    torch.manual_seed(0)
    policy = policies.make("flow", sampler="fpo", fpo_samples=6, **TINY)
    obs = _obs()
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(5))
    ode = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(sample.actions, ode.actions)
    assert sample.extras["fpo_t"].shape == (4, 6) and sample.extras["fpo_eps"].shape == (4, 6, 3, 7)
    assert (sample.logprob < 0).all()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    chunk = sample.extras["action"]
    assert torch.equal(policy.processor.normalize_actions(chunk), chunk)  # no action statistics: identity
    for _ in range(20):
        opt.zero_grad()
        policy.sft_loss(obs, chunk).backward()  # the unclipped chunk the surrogate scores
        opt.step()
    with torch.no_grad():
        after, entropy, _ = policy.logprob(obs, sample.extras)
    assert (after > sample.logprob).all() and (entropy == 0).all()
    with pytest.raises(ValueError, match="fpo_samples must be >= 1"):
        policies.make("flow", fpo_samples=0, **TINY)


def test_steering_starts_as_the_flow_and_trains_only_its_noise_policy(tmp_path):
    """DSRL: a fresh steering module reproduces the plain flow's ODE from the same noise; a PPO step
    on its log-probability changes the steering weights only; the bundle keeps them, and a once-steered
    policy's weights still load when another sampler is configured."""
    from embodied.algorithms.params import split_parameters

    torch.manual_seed(0)
    policy = policies.make("flow", sampler="ode", **TINY)
    obs = _obs()
    plain = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(7))
    steer = policy.add_steer()
    assert policy.config.sampler == "steer" and policy.rl_trainable == "steer"
    for mode in ("explore", "greedy"):  # both modes draw the noise from the steering Gaussian
        steered = policy.sample(obs, mode=mode, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(steered.actions, plain.actions)
    actor, critic = split_parameters(policy)
    assert {id(p) for p in actor + critic} == {id(p) for p in steer.parameters()}
    assert not any(p.requires_grad for n, p in policy.named_parameters() if not n.startswith("steer."))
    flow_before = {k: v.clone() for k, v in policy.state_dict().items() if not k.startswith("steer.")}
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(8))
    opt = torch.optim.Adam(actor, lr=1e-3)
    for _ in range(5):  # raise the first chunk's probability
        opt.zero_grad()
        lp, ent, _ = policy.logprob(obs, sample.extras)
        (-lp[0]).backward()
        opt.step()
    with torch.no_grad():
        lp, _, _ = policy.logprob(obs, sample.extras)
    assert lp[0] > sample.logprob[0] + 1.0
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in flow_before.items())
    # a bundle of the steered policy carries the steering weights and the sampler
    loaded = policies.load(policies.save(policy, tmp_path / "steered"))
    assert loaded.config.sampler == "steer"
    torch.testing.assert_close(
        loaded.sample(obs, generator=torch.Generator().manual_seed(9)).actions,
        policy.sample(obs, generator=torch.Generator().manual_seed(9)).actions,
    )
    policy.config.sampler = "sde"  # trained on with Flow-SDE afterwards: the steer.* weights stay loadable
    assert policy.rl_trainable is None
    again = policies.load(policies.save(policy, tmp_path / "after"))
    assert again.config.sampler == "sde" and again.steer is not None
    with pytest.raises(ValueError, match="steer_std_min"):
        policies.make("flow", sampler="steer", steer_std_min=0.0, **TINY)


def test_accelerated_sde_draws_one_stochastic_step_per_sample():
    policy = policies.make("flow", sampler="sde", **TINY)
    steps = torch.cat(
        [policy.sample(_obs(), generator=torch.Generator().manual_seed(s)).extras["step"] for s in range(30)]
    )
    assert steps.min() >= 0 and steps.max() < policy.config.num_steps
    assert len(steps.unique()) == policy.config.num_steps  # uniform over the K steps
    # sde_steps=2: only the first two (the noisiest) steps are stochastic; logprob() scores the same step
    policy.config.sde_steps = 2
    obs = _obs()
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(0))
    steps = torch.cat(
        [policy.sample(obs, generator=torch.Generator().manual_seed(s)).extras["step"] for s in range(30)]
    )
    assert sorted(steps.unique().tolist()) == [0, 1]
    torch.testing.assert_close(policy.logprob(obs, sample.extras)[0], sample.logprob, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="sde_steps must lie in 1..num_steps"):
        policies.make("flow", sampler="sde", sde_steps=policy.config.num_steps + 1, **TINY)


def test_small_noise_sde_approaches_ode():
    obs = _obs()
    policy = policies.make("flow", sampler="sde_full", noise_level=1e-4, **TINY)
    sde = policy.sample(obs, generator=torch.Generator().manual_seed(5)).extras["chain"]
    ode = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(5)).extras["chain"]
    # same initial noise; only the injected noise differs
    torch.testing.assert_close(sde[:, 0], ode[:, 0])
    assert (sde[:, -1] - ode[:, -1]).abs().max() < 2e-3
    policy.config.noise_level = 0.5
    wide = policy.sample(obs, generator=torch.Generator().manual_seed(5)).extras["chain"]
    assert (wide[:, -1] - ode[:, -1]).abs().max() > 0.05


def test_sde_step_keeps_the_flow_marginals():
    """Data a ~ N(m, s^2): x_t ~ N((1-t) m, t^2 + (1-t)^2 s^2) along the flow; the exact velocity is
    linear in x. Running the SDE from x_1 ~ N(0, 1) must keep those marginals (up to Euler error)."""
    m, s, k_steps, a = 0.7, 0.3, 20, 0.5
    dt = 1.0 / k_steps
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, 1, 1, generator=g, dtype=torch.float64)

    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
        mu, var = (1 - t) * m, t**2 + (1 - t) ** 2 * s**2
        return -m + (t - (1 - t) * s**2) / var * (x - mu)

    for k in range(k_steps):
        t = 1.0 - k * dt
        mean, std = S.sde_step(x, velocity(x, t), t, dt, a)
        x = mean + std * torch.randn(x.shape, generator=g, dtype=torch.float64)
        t_next = t - dt
        if t_next > 0.05:
            mu, var = (1 - t_next) * m, t_next**2 + (1 - t_next) ** 2 * s**2
            assert abs(x.mean().item() - mu) < 0.03, (t_next, x.mean().item(), mu)
            assert abs(x.var().item() - var) < 0.06 * var + 0.01, (t_next, x.var().item(), var)
    assert abs(x.mean().item() - m) < 0.03 and abs(x.std().item() - s) < 0.08


def test_prefix_is_computed_once_per_chunk_and_value_placements():
    for features, placement in (("shared", "expert"), ("shared", "prefix"), ("detached", "expert")):
        policy = policies.make("flow", value_features=features, value_head=placement, **TINY)
        calls = []
        policy.prefix.register_forward_hook(lambda *_: calls.append(1))
        sample = policy.sample(_obs())
        assert len(calls) == 1 and sample.value.shape == (4,)


def test_greedy_is_deterministic_and_sft_loss_decreases():
    torch.manual_seed(0)
    policy = policies.make("flow", **TINY)
    obs = _obs(6)
    a1 = policy.act(obs, generator=torch.Generator().manual_seed(1))
    a2 = policy.act(obs, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a1, a2)
    target = torch.tanh(obs["state"][:, :7])[:, None, :].repeat(1, 3, 1)  # learnable from the state
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = policy.sft_loss(obs, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:5]) / 5


def test_bad_inputs_are_clear():
    policy = policies.make("flow", **TINY)
    obs = _obs()
    with pytest.raises(KeyError, match="instruction"):
        policy.sample({k: v for k, v in obs.items() if k != "instruction"})
    with pytest.raises(ValueError, match="views"):
        policy.sample({**obs, "rgb": obs["rgb"][:, :1]})
    with pytest.raises(ValueError, match="unknown flow sampler"):
        policies.make("flow", sampler="langevin")
    with pytest.raises(ValueError, match="unknown flow config key"):
        policies.make("flow", chunk=5)


def _value_loss_grads(policy, value: torch.Tensor) -> dict[str, torch.Tensor | None]:
    policy.zero_grad(set_to_none=True)
    ((value - 1.0) ** 2).mean().backward()
    return {n: p.grad for n, p in policy.named_parameters()}


def _no_grad(grad: torch.Tensor | None) -> bool:
    return grad is None or not bool(grad.abs().sum() > 0)


@pytest.mark.parametrize("sampler", ["sde", "steer"])
def test_detached_value_loss_reaches_the_value_head_only(sampler):
    """The default critic reads detached features: a value loss (through ``value`` and through the
    ``logprob`` PPO evaluates) moves neither the prefix encoder nor the action expert, only the value
    head (DSRL: the steering module's own value head, not its noise policy)."""
    torch.manual_seed(0)
    policy = policies.make("flow", sampler=sampler, **TINY)
    assert policy.config.value_features == "detached"
    obs = {**_obs(), "time_left": torch.tensor([1.0, 0.7, 0.3, 0.0])}
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(1))
    head = "steer.value_mlp." if sampler == "steer" else "value_mlp."
    for value in (lambda: policy.value(obs), lambda: policy.logprob(obs, sample.extras)[2]):
        grads = _value_loss_grads(policy, value())
        assert any(n.startswith("prefix.") for n in grads) and any(n.startswith("expert.") for n in grads)
        assert all(_no_grad(g) for n, g in grads.items() if not n.startswith(head)), sorted(
            n for n, g in grads.items() if not n.startswith(head) and not _no_grad(g)
        )[:5]
        assert any(not _no_grad(g) for n, g in grads.items() if n.startswith(head))


def test_value_reads_the_time_left():
    """Same observations, different time left: the value head fits a target that is the time left
    itself (a critic without the input cannot: its error stays at the target's variance, 1/12)."""
    torch.manual_seed(0)
    policy = policies.make("flow", **TINY)
    n = 4
    obs = _obs(n)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        tl = torch.rand(n, generator=g)
        loss = ((policy.value({**obs, "time_left": tl}) - tl) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        tl = torch.rand(n, generator=g)
        assert float(((policy.value({**obs, "time_left": tl}) - tl) ** 2).mean()) < 0.01
        late = policy.value({**obs, "time_left": torch.full((n,), 0.1)})
        early = policy.value({**obs, "time_left": torch.full((n,), 0.9)})
        assert (early - late).min() > 0.5
        # no time_left (serving, evaluation): read as the start of an episode
        torch.testing.assert_close(policy.value(obs), policy.value({**obs, "time_left": torch.ones(n)}))
        sample = policy.sample({**obs, "time_left": tl})
        torch.testing.assert_close(policy.logprob({**obs, "time_left": tl}, sample.extras)[2], sample.value)


def _strip_value_fields(folder) -> None:
    """Make ``folder`` look like a bundle written before ``value_features`` existed."""
    cfg = folder / "config.json"
    meta = json.loads(cfg.read_text())
    for key in ("value_features", "value_hidden"):
        del meta["config"][key]
    cfg.write_text(json.dumps(meta))


@pytest.mark.parametrize("sampler", ["sde", "steer"])
def test_old_bundle_keeps_its_value_head_and_a_misfit_head_is_reinitialised(tmp_path, sampler, caplog):
    """A bundle without ``value_features`` loads as before it existed (``shared``: the same weights and
    values); weights of a head that does not fit the config's are replaced by a fresh head, logged;
    ``use_value_features`` moves an old (SFT) bundle to the detached critic."""
    torch.manual_seed(0)
    obs = _obs()
    old = policies.make("flow", sampler=sampler, value_features="shared", **TINY)
    folder = policies.save(old, tmp_path / "old")
    _strip_value_fields(folder)
    with caplog.at_level(logging.WARNING, logger="policies"):
        loaded = policies.load(folder)
    assert not caplog.records
    assert loaded.config.value_features == "shared" and loaded.config.sampler == sampler
    assert all(torch.equal(v, old.state_dict()[k]) for k, v in loaded.state_dict().items())
    torch.testing.assert_close(loaded.value(obs), old.value(obs))
    a = loaded.sample(obs, generator=torch.Generator().manual_seed(2))
    b = old.sample(obs, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a.actions, b.actions)
    torch.testing.assert_close(a.value, b.value)
    # the new default head saved, then its config stripped: the head no longer fits, so it is fresh
    new = policies.make("flow", sampler=sampler, **TINY)
    folder = policies.save(new, tmp_path / "new")
    _strip_value_fields(folder)
    with caplog.at_level(logging.WARNING, logger="policies"):
        misfit = policies.load(folder)
    assert any("freshly initialised" in r.getMessage() for r in caplog.records)
    assert misfit.config.value_features == "shared"
    kept = {k: v for k, v in new.state_dict().items() if ".value_mlp." not in f".{k}"}
    assert all(torch.equal(v, misfit.state_dict()[k]) for k, v in kept.items())
    torch.testing.assert_close(
        misfit.sample(obs, generator=torch.Generator().manual_seed(2)).actions,
        new.sample(obs, generator=torch.Generator().manual_seed(2)).actions,
    )
    # RL from an old SFT bundle: switch it to the detached critic (a fresh head; nothing else moves)
    before = {k: v.clone() for k, v in loaded.state_dict().items() if ".value_mlp." not in f".{k}"}
    loaded.use_value_features("detached")
    assert loaded.config.value_features == "detached"
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in before.items())
    early = loaded.value({**obs, "time_left": torch.ones(4)})
    again = policies.load(policies.save(loaded, tmp_path / "switched"))
    assert again.config.value_features == "detached"
    torch.testing.assert_close(again.value({**obs, "time_left": torch.ones(4)}), early)
    with pytest.raises(ValueError, match="value_features must be one of"):
        loaded.use_value_features("oracle")
    assert loaded.config.value_features == "detached"


@pytest.mark.parametrize("family", ["flow", "autoregressive", "diffusion"])
def test_trimmed_instruction_padding_changes_no_output(family):
    """The processor drops token columns that are padding in the whole batch: every family's prefix,
    samples, log-probabilities and values equal those of the full max_text_len width."""
    tiny = {k: v for k, v in TINY.items() if family == "flow" or k not in ("expert_layers",)}
    policy = policies.make(family, **tiny).eval()
    obs = _obs(n=5)
    tokens, _ = policy.processor.tokens(obs["instruction"], torch.device("cpu"))
    assert tokens.shape[1] == len("pick up the cube")  # the longest instruction, not max_text_len
    outs = {}
    for trim in (True, False):
        policy.processor.trim_padding = trim
        with torch.no_grad():
            sample = policy.sample(obs, generator=torch.Generator().manual_seed(5))
            recomputed = policy.logprob(obs, sample.extras)[0] if family != "diffusion" else sample.actions
            encoder = policy.encoder if family == "diffusion" else policy.prefix
            prefix = encoder(policy.processor.prepare(obs, policy.device))[0]
            outs[trim] = (sample.actions, prefix[:, :8], prefix[:, -1], recomputed)  # image and state tokens
    for a, b in zip(outs[True], outs[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


RTC_TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1)


def test_soft_mask_shape():
    w = soft_mask(8, torch.tensor([2]), torch.tensor([6]))[0]
    assert w[:2].tolist() == [1.0, 1.0] and (w[6:] == 0).all()
    assert all(w[i] >= w[i + 1] for i in range(2, 6)) and 0 < w[5] < 1


def test_rtc_returns_exactly_the_committed_actions_on_the_frozen_steps():
    torch.manual_seed(0)
    policy = policies.make("flow", chunk_size=6, expert_layers=1, **RTC_TINY).eval()
    obs = {
        "rgb": torch.randint(0, 255, (3, 2, 32, 32, 3), dtype=torch.uint8),
        "state": torch.randn(3, 15),
        "instruction": ["a", "b", "c"],
    }
    prev = torch.rand(3, 6, 7) * 2 - 1
    valid = torch.zeros(3, 6, dtype=torch.bool)
    valid[:, :4] = True
    valid[2, 1:] = False  # one env has a single queued action: only it is frozen
    out = rtc_sample(policy, obs, prev, valid, frozen=3, generator=torch.Generator().manual_seed(1))
    assert out.shape == (3, 6, 7)
    assert torch.equal(out[:2, :3], prev[:2, :3]) and torch.equal(out[2, :1], prev[2, :1])
    assert not torch.equal(out[:2, 3:], prev[:2, 3:])
    # guidance pulls the soft region toward the previous plan compared with no guidance
    free = rtc_sample(policy, obs, prev, torch.zeros_like(valid), frozen=0, generator=torch.Generator().manual_seed(1))
    near = (out[:2, 3] - prev[:2, 3]).abs().mean()
    far = (free[:2, 3] - prev[:2, 3]).abs().mean()
    assert near < far
    with pytest.raises(ValueError, match="needs a flow policy"):
        rtc_sample(policies.make("autoregressive", chunk_size=6, decoder_layers=1, **RTC_TINY), obs, prev, valid, 2)


def test_a_new_sampler_is_one_registered_class():
    """A sampler is added in one place: its class, registered. The config accepts its name, ``sample``
    draws with it and ``logprob`` recomputes its chunks' log-probability from the extras it left."""
    from policies.flow.samplers import SAMPLERS, ChainSampler, register_sampler

    class JitterSampler(ChainSampler):  # the ODE's mean with a fixed std on every step
        name = "ode_jitter"

        def gaussian(self, policy, x, t, feats, v, dt):
            return S.ode_step(x, v, dt), torch.full_like(x, 0.1)

    register_sampler(JitterSampler)
    try:
        torch.manual_seed(0)
        policy = policies.make("flow", **TINY, sampler="ode_jitter")
        obs = _obs()
        with torch.no_grad():
            chunk = policy.sample(obs, generator=torch.Generator().manual_seed(3))
            lp, ent, _ = policy.logprob(obs, chunk.extras)
            greedy = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(3))
        assert chunk.extras["chain"].shape == (4, policy.config.num_steps + 1, 3, policy.config.action_dim)
        torch.testing.assert_close(lp, chunk.logprob, rtol=1e-5, atol=1e-4)
        assert torch.all(ent == ent[0]) and not torch.equal(chunk.actions, greedy.actions)
    finally:
        SAMPLERS._entries.pop("ode_jitter")
    with pytest.raises(ValueError, match="unknown flow sampler 'ode_jitter'"):
        policies.make("flow", sampler="ode_jitter")
