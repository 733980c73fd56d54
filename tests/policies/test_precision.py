"""policies.precision: bf16 autocast and frozen weights, float32 bundles, torch.compile with its fallback, and
``precision`` / ``compile`` through embodied-sft, the RL learner (embodied-train) and the policy server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

import policies
from policies.precision import LOW_PRECISION_MODULES, PRECISIONS, compile_policy, lookup

BIN = Path(sys.executable).parent
TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)
TINY_ARGS = [
    "policy.d_model=32",
    "policy.image_size=32",
    "policy.vision_channels=[8,16]",
    "policy.chunk_size=3",
    "policy.prefix_layers=1",
    "policy.expert_layers=1",
    "batch_size=8",
    "log_every=1",
]


def _obs(n: int = 4, size: int = 32) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "rgb": torch.randint(0, 256, (n, 2, size, size, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": ["put the bowl on the plate"] * n,
    }


def _dtypes_inside(policy: nn.Module, run) -> dict[str, torch.dtype]:
    """The output dtype of one convolution and two linears of the policy while ``run()`` executes."""
    seen: dict[str, torch.dtype] = {}
    watched = {
        "vision conv": next(m for m in policy.prefix.vision.modules() if isinstance(m, nn.Conv2d)),
        "expert input": policy.expert.inp,
        "velocity": policy.velocity,
    }

    def hook(key: str):
        def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen.setdefault(key, output.dtype)

        return record

    hooks = [m.register_forward_hook(hook(k)) for k, m in watched.items()]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_bf16_autocast_runs_the_matmuls_in_bf16_and_the_master_weights_stay_fp32():
    torch.manual_seed(0)
    policy = policies.make("flow", **TINY)
    obs, chunks = _obs(), torch.rand(4, 3, 7) * 2 - 1
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        p = lookup(name)
        policy.zero_grad()

        def step() -> None:
            with p.autocast("cpu"):
                loss = policy.sft_loss(obs, chunks)
            assert loss.dtype == torch.float32 and torch.isfinite(loss)
            loss.backward()

        assert set(_dtypes_inside(policy, step).values()) == {dtype}, name
        assert p.cast_frozen(policy) == []  # nothing is frozen: every weight trains, in float32
        assert all(q.dtype == torch.float32 and q.grad.dtype == torch.float32 for q in policy.expert.parameters())


def test_frozen_weights_held_in_bf16_and_saved_as_float32(tmp_path):
    torch.manual_seed(0)
    policy = policies.make("flow", **TINY)
    policy.prefix.requires_grad_(False)  # as RL's freeze_prefix, or a frozen VLM
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    bf16 = lookup("bf16")
    cast = bf16.cast_frozen(policy)
    assert cast and all(name.startswith("prefix.") for name in cast)
    for name, p in policy.named_parameters():
        owner = policy.get_submodule(name.rsplit(".", 1)[0]) if "." in name else policy
        if name in cast:
            assert p.dtype == torch.bfloat16 and isinstance(owner, LOW_PRECISION_MODULES)
        else:  # trainable weights, norms and free parameters stay float32
            assert p.dtype == torch.float32, name
    assert any(isinstance(m, nn.LayerNorm) for m in policy.prefix.modules())
    # training goes on: the frozen part's bf16 weights under autocast, the optimizer on float32 weights
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    with bf16.autocast("cpu"):
        loss = policy.sft_loss(_obs(), torch.rand(4, 3, 7) * 2 - 1)
    loss.backward()
    opt.step()
    # the bundle holds float32 tensors: the frozen weights as their bf16 values, upcast exactly
    with bf16.full_weights(policy):
        folder = policies.save(policy, tmp_path / "b", extra={"precision": "bf16"})
    assert all(policy.get_parameter(n).dtype == torch.bfloat16 for n in cast)  # held in bf16 again after
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
        for name in cast:
            torch.testing.assert_close(f.get_tensor(name), before[name].bfloat16().float(), rtol=0, atol=0)
    loaded = policies.load(folder)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert loaded.act(_obs(), generator=torch.Generator().manual_seed(0)).shape == (4, 3, 7)


@pytest.mark.parametrize("family", ["flow", "autoregressive", "diffusion"])
def test_bf16_inference_of_every_family(family):
    kw = {k: v for k, v in TINY.items() if k != "expert_layers"}
    policy = policies.make(family, **kw)
    obs = _obs()
    ref = policy.eval().act(obs, generator=torch.Generator().manual_seed(1))
    bf16 = lookup("bf16")
    bf16.for_inference(policy)
    linears = [m.weight for m in policy.modules() if isinstance(m, nn.Linear)]
    assert linears and all(w.dtype == torch.bfloat16 for w in linears)
    with bf16.autocast("cpu"):
        out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.dtype == torch.float32 and out.shape == ref.shape and torch.isfinite(out).all()
    assert out.abs().max() <= 1.0


def test_unknown_precision_is_refused_with_the_closest_name(tmp_path):
    from embodied.algorithms.update import UpdateConfig

    with pytest.raises(ValueError, match="unknown precision 'bf61'; did you mean 'bf16'"):
        lookup("bf61")
    with pytest.raises(ValueError, match="precision='fp23': unknown precision 'fp23'; did you mean 'fp32'"):
        UpdateConfig(precision="fp23")
    assert PRECISIONS.names() == ["fp32", "bf16"]
    proc = _cli("embodied-sft", "data=/nonexistent", f"out={tmp_path / 'x'}", "precision=bf61")
    assert proc.returncode != 0 and "precision='bf61': unknown precision 'bf61'; did you mean 'bf16'" in proc.stderr


def test_compile_falls_back_with_a_warning_where_it_cannot_run(tmp_path):
    """In a process whose C++ compiler does not exist, Inductor cannot build CPU kernels: compile_policy
    warns, compiles nothing, and the policy runs eagerly with its usual numerics."""
    script = textwrap.dedent(
        """
        import warnings, torch, policies
        from policies.precision import compile_policy
        policy = policies.make("flow", d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            names = compile_policy(policy)
        a = policy.act({"rgb": torch.zeros(2, 2, 32, 32, 3, dtype=torch.uint8), "state": torch.zeros(2, 15),
                        "instruction": ["x", "y"]}, generator=torch.Generator().manual_seed(0))
        print(names, tuple(a.shape), [str(w.message) for w in caught])
        """
    )
    env = dict(
        os.environ, CXX=str(tmp_path / "no-such-compiler"), TORCHINDUCTOR_FX_GRAPH_CACHE="0", OMP_NUM_THREADS="1"
    )
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("[] (2, 3, 7) ") and "torch.compile does not run on cpu here" in last, last


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from embodied.data.collect import collect_suite

    root = tmp_path_factory.mktemp("demos") / "ds"
    collect_suite("goal", root, episodes_per_task=1, task_ids=[2], num_envs=1, image_size=32)
    return root


def _cli(command: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, env=env, timeout=900)


def _first_loss(out: Path) -> float:
    return float((out / "metrics.csv").read_text().splitlines()[1].split(",")[1])


def _check_run(out: Path, precision: str) -> None:
    """The run folder records the numerics; the bundle holds float32 tensors, loads and samples."""
    summary = json.loads((out / "sft.json").read_text())
    assert summary["precision"] == precision and summary["steps"] == 3 and summary["peak_memory_gb"]["rss"] > 0
    assert f"precision: {precision}" in (out / ".hydra" / "config.yaml").read_text()
    assert json.loads((out / "ckpt" / "config.json").read_text())["extra"]["precision"] == precision
    with safe_open(str(out / "ckpt" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    policy = policies.load(out / "ckpt")
    actions = policy.act(_obs(2), generator=torch.Generator().manual_seed(0))
    assert actions.shape == (2, 3, 7) and torch.isfinite(actions).all()


def test_sft_in_bf16_and_compiled(demos, tmp_path):
    """SFT of 3 steps in fp32, in bf16, and compiled (fp32): each finishes, records its numerics, and its
    bundle loads and samples. The first step's loss (before any update) agrees: bf16 to its rounding,
    the compiled forward to float32's."""
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["precision=bf16"]), ("compiled", ["compile=true"])):
        out = tmp_path / name
        proc = _cli("embodied-sft", f"data={demos}", f"out={out}", "steps=3", "save_every=2", *TINY_ARGS, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _check_run(out, "bf16" if name == "bf16" else "fp32")
        runs[name] = out
    assert json.loads((runs["compiled"] / "sft.json").read_text())["compiled"] == ["prefix", "expert"]
    assert json.loads((runs["fp32"] / "sft.json").read_text())["compiled"] == []
    ref = _first_loss(runs["fp32"])
    assert _first_loss(runs["compiled"]) == pytest.approx(ref, rel=1e-4)
    assert _first_loss(runs["bf16"]) == pytest.approx(ref, rel=5e-2)


def test_rl_learner_in_bf16_keeps_its_frozen_prefix_in_bf16(tmp_path):
    """embodied-train with algo.precision=bf16: train.json and the config record it, the learner held the
    frozen prefix in bf16 (the saved prefix is the initial one rounded to bf16, stored as float32) while
    the action expert trained in float32."""
    torch.manual_seed(0)
    init_policy = policies.make("flow", **TINY)
    init = policies.save(init_policy, tmp_path / "sft")
    out = tmp_path / "rl"
    run = ["suite=goal", "tasks=[2]", "num_envs=2", "image_size=32", "chunks_per_iter=3", "algo.minibatch_size=4"]
    proc = _cli(
        "embodied-train", f"init={init}", "algo=flow_sde", f"out={out}", "iterations=1", "algo.precision=bf16", *run
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train.json").read_text())
    assert summary["precision"] == "bf16" and summary["compile"] is False
    assert np.isfinite(summary["last"]["approx_kl_first"]) and summary["last"]["actor_updated"] == 1.0
    assert "precision: bf16" in (out / ".hydra" / "config.yaml").read_text()
    folder = out / "checkpoint" / "policy"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
        saved = {k: f.get_tensor(k) for k in f.keys()}
    start = init_policy.state_dict()
    rounded = [k for k in saved if k.startswith("prefix.") and k.endswith(".weight") and saved[k].dim() >= 2]
    assert rounded
    for k in rounded:  # a frozen linear / conv weight: its bf16 value
        torch.testing.assert_close(saved[k], start[k].bfloat16().float(), rtol=0, atol=0)
    assert any(not torch.equal(saved[k], start[k]) for k in saved if k.startswith("expert."))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_and_compile_on_cuda():
    """On CUDA: bf16 autocast runs the flow policy's matmuls in bf16 with a frozen prefix held in bf16, SFT
    steps lower the loss; the compiled policy (Triton) gives eager's loss; every family serves in bf16."""
    torch.manual_seed(0)
    policy = policies.make("flow").cuda()
    policy.prefix.requires_grad_(False)
    bf16 = lookup("bf16")
    assert bf16.cast_frozen(policy)
    obs, chunks = _obs(16, 64), torch.rand(16, 5, 7, device="cuda") * 2 - 1
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(20):

        def step() -> None:
            with bf16.autocast("cuda"):
                loss = policy.sft_loss(obs, chunks)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())

        seen = _dtypes_inside(policy, step)
    assert set(seen.values()) == {torch.bfloat16} and losses[-1] < losses[0]
    eager = policies.make("flow").cuda()
    compiled = policies.make("flow").cuda()
    compiled.load_state_dict(eager.state_dict())
    assert compile_policy(compiled) == ["prefix", "expert"]
    loss = {}
    for name, p in (("eager", eager), ("compiled", compiled)):
        torch.manual_seed(1)
        loss[name] = p.sft_loss(obs, chunks)
    torch.testing.assert_close(loss["compiled"], loss["eager"], rtol=1e-3, atol=1e-4)
    for family in ("flow", "autoregressive", "diffusion"):
        served = bf16.for_inference(policies.make(family).cuda())
        with bf16.autocast("cuda"):
            actions = served.act(_obs(8, 128), generator=torch.Generator(device="cuda").manual_seed(0))
        assert actions.shape == (8, 5, 7) and torch.isfinite(actions).all()


def test_server_in_bf16_answers_as_fp32_does_within_rounding():
    """embodied-serve's inference path in bf16: the served policy holds bf16 weights, a plain request and a
    real-time-chunking request are answered with finite chunks close to the fp32 server's (the same
    weights and noise)."""
    from conftest import SERVED_TINY, openpi_obs
    from websockets.sync.client import connect

    from real_robot import protocol
    from real_robot.server import PolicyServer, ServerThread
    from real_robot.spec import RTC_FROZEN_KEY, RTC_PREV_KEY

    torch.manual_seed(0)
    weights = policies.make("flow", chunk_size=6, **SERVED_TINY).state_dict()
    rtc = {**openpi_obs(), RTC_PREV_KEY: np.full((3, 7), 0.2, np.float32), RTC_FROZEN_KEY: 2}
    answers = {}
    for precision in ("fp32", "bf16"):
        policy = policies.make("flow", chunk_size=6, **SERVED_TINY)
        policy.load_state_dict(weights)
        server = PolicyServer(policy, precision=precision)
        assert (server.policy.velocity.weight.dtype == torch.bfloat16) == (precision == "bf16")
        with ServerThread(server) as port, connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
            ws.recv(timeout=10)  # metadata
            answers[precision] = []
            for request in (openpi_obs(), rtc):
                ws.send(protocol.packb(request))
                reply = ws.recv(timeout=60)
                assert not isinstance(reply, str), reply
                answers[precision].append(protocol.unpackb(reply)["actions"])
    for fp32, bf16 in zip(answers["fp32"], answers["bf16"]):
        assert bf16.shape == (6, 7) and np.isfinite(bf16).all()
        np.testing.assert_allclose(bf16, fp32, atol=0.05)


def test_compiled_bf16_inference_matches_eager():
    """Serving with precision=bf16 compile=true: the compiled prefix and expert (their transformer layers in
    eval mode, no gradients, bf16 weights) give eager bf16's chunk."""
    torch.manual_seed(0)
    eager = policies.make("flow", **TINY)
    compiled = policies.make("flow", **TINY)
    compiled.load_state_dict(eager.state_dict())
    bf16 = lookup("bf16")
    actions = {}
    for name, policy in (("eager", eager), ("compiled", compiled)):
        bf16.for_inference(policy)
        if name == "compiled":
            assert compile_policy(policy) == ["prefix", "expert"]
        with bf16.autocast("cpu"):
            actions[name] = policy.act(_obs(), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(actions["compiled"], actions["eager"], rtol=0, atol=2e-2)
