"""benchmarks/gradient_signal.py: the statistics on gradients of known signal and noise, the per-chunk
gradients against one batched pass, and a real run on a tiny policy in a real MuJoCo suite."""

import json

import pytest
import torch

import policies
from benchmarks import gradient_signal as gs

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1)


def test_noise_scale_of_known_signal_and_noise():
    """Chunks g_i = G + n_i with |G|^2 = 1 and tr(Sigma) = 200: noise scale ~200; one huge chunk shows in
    the top share and the effective count."""
    gen = torch.Generator().manual_seed(0)
    n, p = 4000, 50
    signal = torch.zeros(p)
    signal[0] = 1.0
    grads = signal + torch.randn(n, p, generator=gen) * (200.0 / p) ** 0.5
    out = gs.signal_summary(grads, torch.Generator().manual_seed(1))
    assert out["noise_scale"] == pytest.approx(200.0, rel=0.25)
    assert out["trace_sigma"] == pytest.approx(200.0, rel=0.05) and out["chunks"] == n
    assert 0.8 * n < out["effective_chunks"] <= n and out["top_share_1pct"] < 0.05
    grads[0] *= 1000.0
    heavy = gs.signal_summary(grads, torch.Generator().manual_seed(1))
    assert heavy["top_share_1pct"] > 0.9 and heavy["effective_chunks"] < 0.1 * n
    steps = torch.arange(n) % 2
    per = gs.by_step(grads, steps)
    assert per["0"]["share"] > 0.9 and per["1"]["chunks"] == n // 2 and "signal_sq_norm" in per["1"]
    with pytest.raises(ValueError, match="at least 4"):
        gs.signal_summary(grads[:3])


def test_real_run_and_per_chunk_gradients_add_up(tmp_path):
    """A tiny state-only flow policy in the goal suite: the per-chunk gradients average to the batch's
    gradient taken in one pass, and the run writes its summary with the stochastic steps' breakdown."""
    import sims
    from embodied.algorithms.batch import ppo_batch
    from embodied.algorithms.params import split_parameters
    from embodied.algorithms.rollout import collect_chunks

    with sims.make("mujoco", suite="goal", num_envs=2, cameras=(), state_obs="privileged") as env:
        width = int(env.observation_spec["state"].shape[0])
        policy = policies.make(
            "flow",
            **{**TINY, "cameras": [], "state_dim": width, "state_obs": "privileged"},
            sampler="sde",
            expert_layers=1,
        )
        obs = env.reset(seed=0, task_ids=[2, 2])
        rollout, _ = collect_chunks(env, policy, obs, 2, generator=torch.Generator().manual_seed(0))
    batch = ppo_batch(rollout, normalize=False, truncation="fail")
    batch["advantages"] = torch.linspace(-1.0, 1.0, batch["advantages"].shape[0])
    actor, _ = split_parameters(policy, freeze_prefix=True)
    per_chunk = gs.chunk_gradients(policy, rollout, batch["advantages"], actor)
    rows = torch.arange(per_chunk.shape[0])
    logprob, _, _ = policy.logprob(rollout.policy_obs(rows), rollout.flat_extras(rows))
    whole = torch.autograd.grad(-(batch["advantages"] * logprob).mean(), actor, allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(whole, actor)])
    torch.testing.assert_close(per_chunk.mean(0), flat, rtol=1e-4, atol=1e-6)

    ckpt = policies.save(policy, tmp_path / "policy")
    out = tmp_path / "signal"
    assert (
        gs.main(
            [
                "--checkpoint",
                str(ckpt),
                "--suite",
                "goal",
                "--tasks",
                "2",
                "--num-envs",
                "2",
                "--chunks",
                "2",
                "--warmup",
                "1",
                "--sde-steps",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads((out / "gradient_signal.json").read_text())
    assert saved["chunks"] == 4 and saved["sde_steps"] == 2 and set(saved["by_step"]) <= {"0", "1"}
    assert saved["trace_sigma"] >= 0 and 0 < saved["effective_chunks"] <= 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "goal", "--tasks", "2", "--num-envs", "1", "--chunks", "2"], "at least 4 chunks"),
        (["--suite", "goal", "--tasks", "99"], "has tasks 0.."),
        (["--suite", "libero_spatial", "--tasks", "10"], "'libero_spatial' has tasks 0..9"),  # real LIBERO's too
        (["--suite", "nope", "--tasks", "0"], "'libero_spatial'"),  # the suites named include real LIBERO's
    ],
)
def test_refusals(tmp_path, capsys, argv, message):
    ckpt = policies.save(policies.make("flow", expert_layers=1, **TINY), tmp_path / "policy")
    with pytest.raises(SystemExit):
        gs.main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), *argv])
    assert message in capsys.readouterr().err
