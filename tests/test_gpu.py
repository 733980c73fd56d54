"""The CUDA path of the policies (skipped without a GPU): sampling, exact log-probabilities,
SFT steps and bundles moving between devices. Run with ``pytest -m gpu``."""

from __future__ import annotations

import pytest
import torch

import policies

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _obs(n: int = 8) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "rgb": torch.randint(0, 256, (n, 2, 128, 128, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": ["put the red cube on the plate"] * n,
    }


@pytest.mark.parametrize(
    "family,sampler",
    [("flow", "sde"), ("flow", "sde_full"), ("flow", "noise"), ("autoregressive", None), ("diffusion", None)],
)
def test_family_on_cuda(family, sampler, tmp_path):
    kw = {"sampler": sampler} if sampler else {}
    policy = policies.make(family, **kw).cuda()
    obs = _obs()
    gen = torch.Generator(device="cuda").manual_seed(1)
    sample = policy.sample(obs, generator=gen)
    assert sample.actions.device.type == "cuda" and sample.actions.shape == (8, 5, 7)
    if family != "diffusion":
        lp, ent, value = policy.logprob(obs, sample.extras)
        torch.testing.assert_close(lp, sample.logprob, rtol=1e-4, atol=1e-3)
    chunks = torch.rand(8, 5, 7, device="cuda") * 2 - 1
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    first = None
    for _ in range(20):
        loss = policy.sft_loss(obs, chunks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < first
    folder = policies.save(policy, tmp_path / family)
    cpu = policies.load(folder, device="cpu")
    back = policies.load(folder, device="cuda")
    a = back.act(obs, generator=torch.Generator(device="cuda").manual_seed(3))
    b = policy.eval().act(obs, generator=torch.Generator(device="cuda").manual_seed(3))
    torch.testing.assert_close(a, b)
    assert next(cpu.parameters()).device.type == "cpu"


def test_cpu_generators_drive_cuda_policies():
    """A CPU generator (what the benchmarks and the evaluation harness pass) samples a CUDA policy of
    every family, reproducibly."""
    obs = _obs()
    for family in ("flow", "autoregressive", "diffusion"):
        policy = policies.make(family).cuda().eval()
        a = policy.sample(obs, generator=torch.Generator().manual_seed(5)).actions
        b = policy.sample(obs, generator=torch.Generator().manual_seed(5)).actions
        assert a.device.type == "cuda" and a.shape == (8, 5, 7)
        torch.testing.assert_close(a, b)
