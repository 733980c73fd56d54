"""Checkpoint bundles: round trip, refusal of tampered or pickled files, env spec checks."""

from __future__ import annotations

import json

import pytest
import torch

import policies
import sims
from policies import CheckpointError, SpecMismatchError

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)


def _obs(n: int = 3) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "rgb": torch.randint(0, 256, (n, 2, 32, 32, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": ["open the drawer"] * n,
    }


def test_round_trip_gives_identical_outputs(tmp_path):
    policy = policies.make("flow", **TINY)
    policy.processor.set_stats(
        {"state_mean": [0.1] * 15, "state_std": [2.0] * 15, "action_mean": [0.05] * 7, "action_std": [0.5] * 7}
    )
    folder = policies.save(policy, tmp_path / "ckpt", extra={"step": 7})
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "stats.json"]
    loaded = policies.load(folder)
    assert loaded.processor.stats == policy.processor.stats
    obs = _obs()
    a = policy.eval().sample(obs, generator=torch.Generator().manual_seed(4))
    b = loaded.sample(obs, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(a.actions, b.actions)
    torch.testing.assert_close(a.logprob, b.logprob)
    meta = json.loads((folder / "config.json").read_text())
    assert meta["family"] == "flow" and meta["config"]["chunk_size"] == 3 and meta["extra"] == {"step": 7}


def test_load_with_overrides_builds_the_policy_with_them_and_refuses_unknown_fields(tmp_path):
    """overrides= change config fields before the policy is built (its weights stay the checkpoint's), the
    config validates them, and a misspelt field is refused with the closest name."""
    from policies.errors import ConfigOverrideError

    folder = policies.save(policies.make("flow", **TINY), tmp_path / "ckpt")
    plain = policies.load(folder)
    sde = policies.load(folder, overrides={"sampler": "sde", "sde_steps": 2})
    assert (plain.config.sde_steps, sde.config.sampler, sde.config.sde_steps) == (None, "sde", 2)
    assert policies.load(folder, overrides={"sampler": "noise"}).config.sampler == "noise"
    for name, weight in plain.state_dict().items():
        torch.testing.assert_close(sde.state_dict()[name], weight)
    out = sde.sample(_obs(), mode="explore", generator=torch.Generator().manual_seed(1))
    assert int(out.extras["step"].max()) < 2  # the stochastic step drawn from the first two only
    with pytest.raises(ConfigOverrideError, match="unknown flow config key 'sampeler': did you mean 'sampler'"):
        policies.load(folder, overrides={"sampeler": "sde"})
    with pytest.raises(ConfigOverrideError, match="sde_steps must lie in 1..num_steps"):
        policies.load(folder, overrides={"sampler": "sde", "sde_steps": 99})


def test_state_normalisation_floors_the_std_and_clips(tmp_path):
    """A dimension constant in the demonstrations (std 0) must not turn a millimetre into 1000 std."""
    policy = policies.make("flow", **TINY)
    policy.processor.set_stats({"state_mean": [0.0] * 15, "state_std": [0.0] * 14 + [1.0]})
    state = torch.zeros(2, 15)
    state[0, 0], state[1, 0], state[1, 14] = 0.001, 1.0, -100.0
    z = policy.processor.state(state, torch.device("cpu"))
    assert z[0, 0].item() == pytest.approx(0.1)  # 1 mm / the 1 cm floor
    assert z[1, 0].item() == 5.0 and z[1, 14].item() == -5.0  # clipped at state_clip
    # a bundle written before these fields existed loads with the normalisation it was trained with
    folder = policies.save(policy, tmp_path / "old")
    meta = json.loads((folder / "config.json").read_text())
    for key in ("state_std_floor", "state_clip"):
        del meta["config"][key]
    (folder / "config.json").write_text(json.dumps(meta))
    old = policies.load(folder)
    assert (old.config.state_std_floor, old.config.state_clip) == (1e-3, 0.0)
    assert old.processor.state(state, torch.device("cpu"))[1, 0].item() == pytest.approx(1000.0)
    assert policies.load(policies.save(policy, tmp_path / "new")).config.state_clip == 5.0


def test_tampered_pickled_and_missing_files_are_refused(tmp_path):
    folder = policies.save(policies.make("flow", **TINY), tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        policies.load(folder)
    # a pickled checkpoint in place of the weights is never unpickled
    weights.unlink()
    torch.save({"weights": torch.zeros(1)}, folder / "model.pt")
    with pytest.raises(CheckpointError, match="pickled checkpoints are never loaded"):
        policies.load(folder)
    with pytest.raises(CheckpointError, match="no checkpoint bundle"):
        policies.load(tmp_path / "nowhere")


def test_env_spec_mismatch_names_both_sides():
    policy = policies.make("flow", **TINY)
    with sims.make("mujoco", task="reach", num_envs=1, action_mode="joint_pos", image_size=32) as env:
        with pytest.raises(SpecMismatchError, match=r"7-D actions but the env expects 8-D"):
            policy.check_env(env)
    with sims.make("mujoco", task="reach", num_envs=1, cameras=("agentview",), image_size=32) as env:
        with pytest.raises(SpecMismatchError, match="cameras"):
            policy.check_env(env)
    with sims.make("mujoco", task="reach", num_envs=1, image_size=32) as env:
        policy.check_env(env)  # fits
