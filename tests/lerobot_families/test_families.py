"""LeRobot's pi0 and SmolVLA behind our Policy contract: ODE parity with LeRobot's own sampling, exact
Flow-SDE log-probabilities, the frozen VLM, SFT, bundles, and checkpoints that LeRobot itself loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "lerobot",
    reason="LeRobot is not installed here: these tests run in .venv-lerobot "
    "(bash scripts/setup.sh makes it; bash scripts/test.sh runs them there)",
)

import policies  # noqa: E402
from embodied.algorithms.params import split_parameters  # noqa: E402
from policies.lerobot.modeling_lerobot import TokenizerMissingError  # noqa: E402
from policies.lerobot.sizes import model_sizes  # noqa: E402

N = 3


def obs(n: int = N, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "rgb": torch.as_tensor(rng.integers(0, 256, (n, 2, 48, 48, 3), dtype=np.uint8)),
        "state": torch.as_tensor(rng.normal(size=(n, 15)), dtype=torch.float32),
        "instruction": ["pick up the red cube", "put the bowl on the plate", "open the top drawer"][:n],
    }


#: each family's VLM parameters (frozen by train_expert_only) and action-expert parameters
VLM = {"pi0": ".paligemma.", "pi05": ".paligemma.", "smolvla": ".vlm."}
EXPERT = {"pi0": ".gemma_expert.", "pi05": ".gemma_expert.", "smolvla": ".lm_expert."}


@pytest.fixture(scope="module", params=["pi0", "pi05", "smolvla"])
def family_kwargs(request, tiny_pi0_kwargs, tiny_pi05_kwargs, tiny_smolvla_kwargs):
    return request.param, {"pi0": tiny_pi0_kwargs, "pi05": tiny_pi05_kwargs, "smolvla": tiny_smolvla_kwargs}[
        request.param
    ]


@pytest.fixture(scope="module")
def pi0(family_kwargs):
    family, kwargs = family_kwargs
    torch.manual_seed(0)
    return policies.make(family, **kwargs)


def test_ode_equals_lerobot_predict_action_chunk(pi0):
    o = obs()
    noise = torch.randn(N, 4, pi0.max_action_dim, generator=torch.Generator().manual_seed(1))
    ours = pi0.sample(o, mode="greedy", noise=noise).actions
    batch = pi0.lerobot_batch(o)
    theirs = pi0.lerobot.predict_action_chunk(batch, noise=noise)  # normalised; identity stats here
    assert theirs.shape == ours.shape == (N, 4, 7)
    torch.testing.assert_close(ours, theirs.clamp(-1, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sampler", ["sde", "sde_full", "noise"])
def test_flow_sde_logprob_is_recomputed_exactly(pi0, sampler):
    pi0.config.sampler = sampler
    try:
        o = obs()
        s = pi0.sample(o, mode="explore", generator=torch.Generator().manual_seed(3))
        lp, ent, value = pi0.logprob(o, s.extras)
        torch.testing.assert_close(lp, s.logprob, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(value, s.value)
        assert torch.isfinite(ent).all() and bool((s.logprob != 0).all())
        greedy = pi0.sample(o, mode="greedy", noise=torch.zeros(N, 4, pi0.max_action_dim)).actions
        assert not torch.allclose(s.actions, greedy)  # exploration moved the chunk
        if sampler == "noise":  # the learned std is trained by the log-probability
            pi0.zero_grad(set_to_none=True)
            lp.sum().backward()
            assert pi0.noise_head.weight.grad.abs().sum() > 0
            pi0.zero_grad(set_to_none=True)
    finally:
        pi0.config.sampler = "sde"


def test_rl_gradients_reach_the_action_expert_not_the_vlm(pi0):
    o = obs()
    s = pi0.sample(o, generator=torch.Generator().manual_seed(4))
    pi0.zero_grad(set_to_none=True)
    lp, _, value = pi0.logprob(o, s.extras)
    (lp.sum() + value.sum()).backward()
    named = dict(pi0.named_parameters())
    vlm_mark, expert_mark = VLM[pi0.family], EXPERT[pi0.family]
    expert = [n for n in named if expert_mark in n and named[n].grad is not None]
    assert expert and named["lerobot.model.action_out_proj.weight"].grad.abs().sum() > 0
    assert all(p.grad is None for n, p in named.items() if vlm_mark in n)  # train_expert_only
    assert named["value_mlp.mlp.0.weight"].grad.abs().sum() > 0
    actor, critic = split_parameters(pi0, freeze_prefix=True)
    assert {id(p) for p in critic} == {id(p) for p in pi0.value_mlp.parameters()}
    vlm = {id(p) for n, p in named.items() if vlm_mark in n}
    assert vlm and not vlm & {id(p) for p in actor}
    pi0.zero_grad(set_to_none=True)


def test_sft_lowers_the_flow_matching_loss(family_kwargs):
    family, kwargs = family_kwargs
    torch.manual_seed(0)
    policy = policies.make(family, **kwargs)
    o = obs()
    target = torch.linspace(-0.5, 0.5, 4 * 7).reshape(1, 4, 7).repeat(N, 1, 1)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)

    def loss() -> float:
        torch.manual_seed(123)
        with torch.no_grad():
            return float(policy.sft_loss(o, target))

    before = loss()
    for _ in range(30):
        opt.zero_grad()
        policy.sft_loss(o, target).backward()
        opt.step()
    assert loss() < 0.5 * before


STATS = {
    "state_mean": [0.1] * 15,
    "state_std": [2.0] * 15,
    "action_mean": [0.05] * 7,
    "action_std": [0.5] * 7,
    "state_q01": [-2.0] * 15,
    "state_q99": [2.5] * 15,
    "action_q01": [-0.8] * 7,
    "action_q99": [0.6] * 7,
}


def test_pi05_prompts_are_lerobots(tiny_pi05_kwargs):
    """pi0.5's prompt (task and discretised state) is the one LeRobot's processor step writes."""
    from lerobot.lerobot_types import TransitionKey
    from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep

    from policies.lerobot.adapters import adapter

    state = torch.linspace(-1.2, 1.2, 2 * 15).reshape(2, 15)
    texts = ["pick_up the cube\n", " open the drawer"]
    step = Pi05PrepareStateTokenizerProcessorStep()
    out = step(
        {TransitionKey.OBSERVATION: {"observation.state": state}, TransitionKey.COMPLEMENTARY_DATA: {"task": texts}}
    )
    assert adapter("pi05").prompts(texts, state) == out[TransitionKey.COMPLEMENTARY_DATA]["task"]


def test_bundle_round_trip(pi0, tmp_path, family_kwargs):
    pi0.processor.set_stats({k: v for k, v in STATS.items() if pi0.family == "pi05" or "_q" not in k})
    try:
        policies.save(pi0, tmp_path / "ckpt")
        loaded = policies.load(tmp_path / "ckpt")
        assert loaded.family == pi0.family and loaded.config == pi0.config
        noise = torch.randn(N, 4, pi0.max_action_dim, generator=torch.Generator().manual_seed(5))
        torch.testing.assert_close(
            loaded.sample(obs(), mode="greedy", noise=noise).actions,
            pi0.sample(obs(), mode="greedy", noise=noise).actions,
        )
    finally:
        pi0.processor.set_stats(None)


def test_export_loads_in_lerobot_and_back(pi0, tmp_path, family_kwargs):
    family, kwargs = family_kwargs
    pi0.processor.set_stats(
        {"state_mean": [0.0] * 15, "state_std": [1.0] * 15, "action_mean": [0.1] * 7, "action_std": [0.5] * 7}
    )
    try:
        folder = policies.lerobot.export_lerobot(pi0, tmp_path / "lerobot")
        o = obs()
        noise = torch.randn(N, 4, pi0.max_action_dim, generator=torch.Generator().manual_seed(6))
        with model_sizes(family, kwargs.get("model_sizes")):  # LeRobot's own loading of the folder
            theirs = pi0.adapter.policy_class().from_pretrained(str(folder), local_files_only=True)
        out = theirs.predict_action_chunk(pi0.lerobot_batch(o), noise=noise)
        ours = pi0.sample(o, mode="greedy", noise=noise).actions
        torch.testing.assert_close(pi0.processor.unnormalize_actions(out), ours, atol=1e-5, rtol=0)
        back = policies.lerobot.load_lerobot(
            folder, tokenizer=kwargs.get("tokenizer", ""), model_sizes_override=kwargs.get("model_sizes")
        )
        assert back.config.cameras == ["agentview", "wrist"] and back.config.action_dim == 7
        assert back.processor.stats == pi0.processor.stats
        renamed = policies.load(folder, cameras=["front", "hand"])
        assert renamed.config.cameras == ["front", "hand"] and renamed.config.image_keys() == pi0.config.image_keys()
        torch.testing.assert_close(
            back.lerobot.predict_action_chunk(back.lerobot_batch(o), noise=noise), out, atol=1e-5, rtol=0
        )
    finally:
        pi0.processor.set_stats(None)


def test_missing_tokenizer_names_what_to_do(tiny_pi0_kwargs, tmp_path):
    policy = policies.make("pi0", **{**tiny_pi0_kwargs, "tokenizer": str(tmp_path / "nowhere")})
    with pytest.raises(TokenizerMissingError, match="local folder"):
        policy.sample(obs(), mode="greedy")
