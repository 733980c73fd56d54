"""Diffusion-policy baseline (policies/diffusion) at tiny sizes, on CPU."""

from __future__ import annotations

import pytest
import torch

import policies
from policies.base import ChunkSample
from policies.diffusion.configuration_diffusion import DiffusionConfig
from policies.diffusion.modeling_diffusion import ChunkDenoiser, DiffusionPolicy

TINY = {"d_model": 32, "image_size": 32, "vision_channels": [8, 16], "chunk_size": 2}
N = 3


def _policy(seed: int = 0, **over) -> DiffusionPolicy:
    torch.manual_seed(seed)
    return policies.make("diffusion", **{**TINY, **over})


def _obs(n: int = N, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, 2, 40, 40, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": ["pick up the cube", "open the drawer", "put the cube on the plate"][:n],
    }


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_make_default_and_overrides():
    policy = policies.make("diffusion")
    assert isinstance(policy, DiffusionPolicy) and policy.family == "diffusion"
    assert isinstance(policy.config, DiffusionConfig)
    assert (policy.chunk_size, policy.action_dim) == (5, 7)
    assert policy.config.inference_steps == 10 and policy.config.prediction_type == "epsilon"
    small = _policy(inference_steps=4, train_timesteps=20)
    assert small._sample_timesteps == [15, 10, 5, 0]
    with pytest.raises(ValueError, match="unknown diffusion config key"):
        policies.make("diffusion", not_a_field=1)
    with pytest.raises(ValueError, match="beta_schedule"):
        policies.make("diffusion", beta_schedule="nope")
    with pytest.raises(ValueError, match="inference_steps"):
        policies.make("diffusion", inference_steps=200, train_timesteps=100)


def test_sample_shapes_and_range():
    policy = _policy().eval()
    for mode in ("explore", "greedy"):
        out = policy.sample(_obs(), mode=mode, generator=_gen(0))
        assert isinstance(out, ChunkSample)
        assert out.actions.shape == (N, 2, 7) and out.actions.dtype == torch.float32
        assert torch.isfinite(out.actions).all()
        assert out.actions.min() >= -1.0 and out.actions.max() <= 1.0
        assert out.logprob.shape == (N,) and out.value.shape == (N,)
        assert torch.all(out.logprob == 0) and torch.all(out.value == 0)
        assert out.extras == {}
    with pytest.raises(ValueError, match="mode"):
        policy.sample(_obs(), mode="argmax")


def test_sample_uses_action_statistics():
    """Chunks are unnormalised with the dataset stats: a tiny std pins them to the mean."""
    policy = _policy().eval()
    policy.processor.set_stats({"action_mean": [0.5] * 7, "action_std": [1e-3] * 7})
    actions = policy.sample(_obs(), generator=_gen(0)).actions
    assert torch.allclose(actions, torch.full_like(actions, 0.5), atol=0.05)
    policy.processor.set_stats({"action_mean": [3.0] * 7, "action_std": [1e-3] * 7})
    assert torch.all(policy.sample(_obs(), generator=_gen(0)).actions == 1.0)  # clipped to the env's range


def test_determinism_with_seeded_generator():
    policy = _policy(ddim_eta=1.0).eval()  # eta > 0: per-step noise also comes from the generator
    obs = _obs()
    a = policy.sample(obs, mode="explore", generator=_gen(7)).actions
    b = policy.sample(obs, mode="explore", generator=_gen(7)).actions
    c = policy.sample(obs, mode="explore", generator=_gen(8)).actions
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    g1 = policy.sample(obs, mode="greedy").actions  # no generator: the fixed greedy_seed
    g2 = policy.sample(obs, mode="greedy").actions
    assert torch.equal(g1, g2)
    assert torch.equal(
        policy.sample(obs, mode="greedy", generator=_gen(3)).actions,
        policy.sample(obs, mode="greedy", generator=_gen(3)).actions,
    )


def test_save_load_round_trip(tmp_path):
    policy = _policy(inference_steps=5).eval()
    policy.processor.set_stats(
        {"state_mean": [0.1] * 15, "state_std": [2.0] * 15, "action_mean": [0.05] * 7, "action_std": [0.5] * 7}
    )
    policies.save(policy, tmp_path / "ckpt")
    loaded = policies.load(tmp_path / "ckpt")
    assert isinstance(loaded, DiffusionPolicy)
    assert loaded.config == policy.config
    assert loaded.processor.stats == policy.processor.stats
    assert not any("scheduler" in k for k in policy.state_dict())  # schedulers are rebuilt, not saved
    assert loaded._sample_timesteps == policy._sample_timesteps
    sd0, sd1 = policy.state_dict(), loaded.state_dict()
    assert sd0.keys() == sd1.keys() and all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    obs = _obs()
    for mode in ("explore", "greedy"):
        assert torch.equal(
            policy.sample(obs, mode=mode, generator=_gen(11)).actions,
            loaded.sample(obs, mode=mode, generator=_gen(11)).actions,
        )


def test_sft_loss_decreases():
    policy = _policy(seed=0).train()
    obs = _obs()
    actions = torch.rand(N, 2, 7, generator=_gen(2)) * 2 - 1

    def fixed_eval() -> float:  # same timesteps and noise before and after training
        with torch.no_grad():
            return sum(policy.sft_loss(obs, actions, generator=_gen(100 + i)).item() for i in range(8)) / 8

    initial = fixed_eval()
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for step in range(60):
        loss = policy.sft_loss(obs, actions, generator=_gen(step))
        assert loss.ndim == 0 and torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = fixed_eval()
    assert final < 0.7 * initial, (initial, final)
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("prediction_type", ["sample", "v_prediction"])
def test_other_prediction_types(prediction_type):
    policy = _policy(prediction_type=prediction_type, inference_steps=3)
    obs = _obs()
    loss = policy.sft_loss(obs, torch.zeros(N, 2, 7))
    loss.backward()
    assert torch.isfinite(loss)
    assert policy.sample(obs, generator=_gen(0)).actions.shape == (N, 2, 7)


def test_sft_loss_rejects_bad_shapes():
    policy = _policy()
    with pytest.raises(ValueError, match="actions must be"):
        policy.sft_loss(_obs(), torch.zeros(N, 3, 7))


def test_denoiser_ignores_padded_prefix_tokens():
    torch.manual_seed(0)
    den = ChunkDenoiser(DiffusionConfig(**TINY)).eval()
    prefix = torch.randn(N, 6, 32)
    pad = torch.zeros(N, 6, dtype=torch.bool)
    pad[:, 4:] = True
    noisy, t = torch.randn(N, 2, 7), torch.tensor([0, 50, 99])
    out = den(noisy, t, prefix, pad)
    changed = prefix.clone()
    changed[:, 4:] = 100.0
    assert torch.allclose(out, den(noisy, t, changed, pad), atol=1e-6)
    assert not torch.allclose(out, den(noisy, t, changed, torch.zeros_like(pad)), atol=1e-3)


def test_logprob_not_implemented():
    policy = _policy()
    with pytest.raises(NotImplementedError, match="flow.*autoregressive"):
        policy.logprob(_obs(), {})


def test_policy_bench_smoke_on_diffusion(tmp_path):
    """``bench=policy`` (benchmarks/policy.py) on the diffusion family at tiny sizes: files and
    fields only, never timing values."""
    import csv
    import json

    from benchmarks.policy import PolicyBenchConfig, run

    over = {k: v for k, v in TINY.items() if k != "image_size"}
    cfg = PolicyBenchConfig(
        out=str(tmp_path),
        families=["diffusion"],
        batch_sizes=[1, 2],
        repeats=2,
        warmup=0,
        image_size=32,
        obs_image_size=40,
        policy_overrides=over,
    )
    run(cfg, tmp_path, progress=False)
    res = json.loads((tmp_path / "policy.json").read_text())
    fam = res["families"]["diffusion"]
    assert fam["available"] and fam["params"] > 0 and fam["config"]["chunk_size"] == 2
    for n in ("1", "2"):
        case = fam["samplers"]["ddim"]["batches"][n]
        assert case["error"] is None and len(case["latency_ms_samples"]) == 2
        assert case["peak_mem_mb"] is None or case["peak_mem_mb"] >= 0
    assert res["targets"]["sde_vs_ode"]["pass"] is None  # flow not run
    assert {"python", "torch"} <= set(res["machine"])
    with open(tmp_path / "policy.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["family"], r["sampler"], r["batch"]) for r in rows] == [
        ("diffusion", "ddim", "1"),
        ("diffusion", "ddim", "2"),
    ]
