"""Autoregressive (OpenVLA-style) policy: tokenisation, KV-cache decoding, exact log-probs, SFT, bundles."""

from __future__ import annotations

import math

import pytest
import torch

import policies
from policies.autoregressive.configuration_autoregressive import AutoregressiveConfig
from policies.autoregressive.modeling_autoregressive import AutoregressivePolicy
from policies.autoregressive.tokenization import actions_to_bins, bin_width, bins_to_actions

N = 3
TINY = {
    "d_model": 32,
    "image_size": 32,
    "vision_channels": [8, 16],
    "chunk_size": 2,
    "prefix_layers": 1,
    "prefix_heads": 2,
    "max_text_len": 16,
    "temperature": 0.8,
}


def make_obs(n: int = N, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    texts = ["pick up the red cube", "open the drawer", "put the bowl on the plate", "close it"]
    return {
        "rgb": torch.randint(0, 256, (n, 2, 40, 40, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": [texts[i % len(texts)] for i in range(n)],
    }


@pytest.fixture(scope="module")
def policy() -> AutoregressivePolicy:
    torch.manual_seed(0)
    p = policies.make("autoregressive", **TINY).eval()
    with torch.no_grad():  # sharper than the near-uniform init, so comparisons are not trivial
        p.head.weight.normal_(0.0, 0.5)
    return p


def test_bins_round_trip() -> None:
    for num_bins in (256, 7):
        a = torch.cat([torch.linspace(-1, 1, 2001), torch.rand(5000) * 2 - 1, torch.tensor([-1.0, 1.0, 0.0])])
        b = actions_to_bins(a, num_bins)
        assert b.dtype == torch.long and int(b.min()) >= 0 and int(b.max()) <= num_bins - 1
        assert (bins_to_actions(b, num_bins) - a).abs().max() <= bin_width(num_bins) / 2 + 1e-6
    centers = bins_to_actions(torch.arange(256))
    assert torch.equal(actions_to_bins(centers), torch.arange(256))
    assert torch.equal(actions_to_bins(torch.tensor([-3.0, 3.0])), torch.tensor([0, 255]))  # clipped
    with pytest.raises(ValueError, match="NaN"):
        actions_to_bins(torch.tensor([float("nan")]))


def test_sample_shapes_and_logprob_matches_teacher_forcing(policy: AutoregressivePolicy) -> None:
    obs = make_obs()
    s = policy.sample(obs, mode="explore", generator=torch.Generator().manual_seed(1))
    h, a = policy.chunk_size, policy.action_dim
    assert s.actions.shape == (N, h, a) and s.logprob.shape == (N,) and s.value.shape == (N,)
    assert s.extras["tokens"].shape == (N, h * a) and s.extras["tokens"].dtype == torch.long
    assert float(s.actions.abs().max()) < 1.0
    assert torch.equal(actions_to_bins(s.actions).flatten(1), s.extras["tokens"])
    lp, ent, val = policy.logprob(obs, s.extras)
    # float32 sums of h * a token log-probs (|lp| ~ 36 here): 1e-5 absolute alone failed once at 1.1e-5
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(val, s.value, atol=1e-5, rtol=0)
    # the log-prob is the one of the temperature-scaled distribution that was sampled from
    logits, _ = policy.decode_teacher_forced(*policy.encode(obs), s.extras["tokens"])
    manual = torch.log_softmax(logits / policy.config.temperature, -1).gather(-1, s.extras["tokens"][..., None])
    torch.testing.assert_close(manual.squeeze(-1).sum(-1), lp, atol=1e-5, rtol=0)
    # entropy of the categoricals: positive, at most H*A*log(num_bins)
    assert bool((ent > 0).all()) and bool((ent <= h * a * math.log(policy.config.num_bins) + 1e-4).all())
    assert policy.max_entropy() == pytest.approx(h * a * math.log(256))
    # the critic is a state value: it does not depend on which tokens were sampled
    _, _, val_other = policy.logprob(obs, {"tokens": torch.randint(0, 256, (N, h * a))})
    torch.testing.assert_close(val_other, val, atol=1e-6, rtol=0)
    torch.testing.assert_close(policy.sample(obs, mode="greedy").value, val, atol=1e-5, rtol=0)


def test_logprob_is_differentiable(policy: AutoregressivePolicy) -> None:
    obs = make_obs()
    s = policy.sample(obs, generator=torch.Generator().manual_seed(2))
    assert not s.logprob.requires_grad  # sampling runs without autograd
    policy.zero_grad()
    lp, ent, val = policy.logprob(obs, s.extras)
    (lp.sum() + ent.sum() + val.sum()).backward()
    assert policy.head.weight.grad is not None and policy.head.weight.grad.abs().sum() > 0
    assert policy.prefix.state[0].weight.grad is not None
    policy.zero_grad()


def test_kv_cache_matches_recomputation(policy: AutoregressivePolicy) -> None:
    obs = make_obs()
    for mode in ("greedy", "explore"):
        fast = policy.generate(obs, mode=mode, generator=torch.Generator().manual_seed(3))
        slow = policy.generate(obs, mode=mode, generator=torch.Generator().manual_seed(3), use_cache=False)
        assert torch.equal(fast["tokens"], slow["tokens"])
        torch.testing.assert_close(fast["logits"], slow["logits"], atol=1e-5, rtol=0)
        torch.testing.assert_close(fast["value"], slow["value"], atol=1e-5, rtol=0)
        # and the single teacher-forced pass over the decoded tokens gives the same logits
        logits, _ = policy.decode_teacher_forced(*policy.encode(obs), fast["tokens"])
        torch.testing.assert_close(fast["logits"], logits, atol=1e-5, rtol=0)


def test_layer_cache_prefill_in_blocks(policy: AutoregressivePolicy) -> None:
    """A layer fed its sequence in blocks through the cache equals one causal pass."""
    layer = policy.layers[0]
    torch.manual_seed(4)
    x = torch.randn(2, 6, 32)
    prefix, pad = torch.randn(2, 5, 32), torch.tensor([[False] * 5, [False, False, False, True, True]])
    kv, mask = layer.cross_kv(prefix), (~pad)[:, None, None, :]
    with torch.no_grad():
        full = layer(x, kv, mask)
        cache = {k: torch.empty(2, layer.heads, 6, layer.head_dim) for k in ("k", "v")}
        parts = [
            layer(x[:, :2], kv, mask, cache=cache, pos=0),
            layer(x[:, 2:3], kv, mask, cache=cache, pos=2),
            layer(x[:, 3:], kv, mask, cache=cache, pos=3),
        ]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_prefix_padding_is_masked(policy: AutoregressivePolicy) -> None:
    """Text padding does not leak: changing padded prefix tokens leaves the logits unchanged."""
    obs = make_obs()
    prefix, pad = policy.encode(obs)
    assert bool(pad.any())
    tokens = torch.randint(0, 256, (N, policy.num_tokens))
    with torch.no_grad():
        a, _ = policy.decode_teacher_forced(prefix, pad, tokens)
        b, _ = policy.decode_teacher_forced(prefix.masked_fill(pad[..., None], 123.0), pad, tokens)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_greedy_is_deterministic(policy: AutoregressivePolicy) -> None:
    obs = make_obs()
    a = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(5))
    b = policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.actions, b.actions) and torch.equal(a.extras["tokens"], b.extras["tokens"])
    assert torch.equal(a.logprob, torch.zeros(N))
    e1 = policy.sample(obs, generator=torch.Generator().manual_seed(7))
    e2 = policy.sample(obs, generator=torch.Generator().manual_seed(7))
    assert torch.equal(e1.extras["tokens"], e2.extras["tokens"])


def test_save_load_round_trip(policy: AutoregressivePolicy, tmp_path) -> None:
    policies.save(policy, tmp_path / "ckpt")
    loaded = policies.load(tmp_path / "ckpt")
    assert isinstance(loaded, AutoregressivePolicy) and loaded.config == policy.config
    obs = make_obs()
    a = policy.sample(obs, generator=torch.Generator().manual_seed(8))
    b = loaded.sample(obs, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.extras["tokens"], b.extras["tokens"]) and torch.equal(a.actions, b.actions)
    torch.testing.assert_close(a.logprob, b.logprob, atol=0, rtol=0)
    torch.testing.assert_close(a.value, b.value, atol=0, rtol=0)


def test_sft_loss_decreases() -> None:
    torch.manual_seed(0)
    p = policies.make("autoregressive", **TINY).train()
    obs = make_obs(seed=9)
    actions = torch.rand(N, p.chunk_size, p.action_dim, generator=torch.Generator().manual_seed(9)) * 2 - 1
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = p.sft_loss(obs, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), abs=0.3)  # near-uniform at init
    assert losses[-1] < 0.7 * losses[0], losses


def test_make_default_and_config_validation() -> None:
    p = policies.make("autoregressive", chunk_size=3)
    assert p.chunk_size == 3 and p.num_tokens == 3 * 7 and p.config.num_bins == 256
    s = p.sample(make_obs(n=1), generator=torch.Generator().manual_seed(0))
    assert s.actions.shape == (1, 3, 7) and s.extras["tokens"].shape == (1, 21)
    with pytest.raises(ValueError, match="temperature"):
        AutoregressiveConfig(temperature=0.0)
    with pytest.raises(ValueError, match="decoder_heads"):
        AutoregressiveConfig(d_model=30, decoder_heads=4)
    with pytest.raises(ValueError, match="unknown"):
        policies.make("autoregressive", bins=3)


def test_bad_inputs_give_clear_errors(policy: AutoregressivePolicy) -> None:
    obs = make_obs()
    bad = {k: v for k, v in obs.items() if k != "instruction"}
    with pytest.raises(KeyError, match="instruction"):
        policy.sample(bad)
    with pytest.raises(ValueError, match="mode"):
        policy.sample(obs, mode="random")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="tokens"):
        policy.logprob(obs, {})
    with pytest.raises(ValueError, match=r"\[3, 14\]"):
        policy.logprob(obs, {"tokens": torch.zeros(3, 5, dtype=torch.long)})
    with pytest.raises(ValueError, match="bin indices"):
        policy.logprob(obs, {"tokens": torch.full((3, 14), 256)})
    with pytest.raises(ValueError, match="actions must be"):
        policy.sft_loss(obs, torch.zeros(3, 7))


def test_inverse_cdf_draws_follow_the_probabilities():
    from policies.autoregressive.modeling_autoregressive import sample_categorical

    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]])
    # the bin edges: [0, .1) -> 0, [.1, .7) -> 2 (bin 1 is empty), [.7, 1) -> 3
    u = torch.tensor([[0.0], [0.0999], [0.1001], [0.69], [0.7001], [0.9999]])
    assert sample_categorical(probs.expand(6, 4), u).tolist() == [0, 0, 2, 2, 3, 3]
    g = torch.Generator().manual_seed(0)
    draws = sample_categorical(probs.expand(20000, 4), torch.rand(20000, 1, generator=g))
    freq = torch.bincount(draws, minlength=4).float() / 20000
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)
