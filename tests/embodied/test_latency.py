"""Latency module: queue semantics, execution modes, the delayed env (real MuJoCo)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import policies
import sims
from embodied.latency import (
    ActionQueue,
    ChunkExecutor,
    LatencyConfig,
    LatencyStats,
    augment_state,
    delay_steps,
    widen_state_input,
)
from embodied.latency.delay_env import DelayedChunkEnv

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1)


@pytest.mark.parametrize("merge", ["replace", "keep", "blend"])
def test_queue_never_repeats_or_runs_stale_actions_and_keeps_order(merge):
    rng = np.random.default_rng(0)
    q = ActionQueue(num_envs=3, action_dim=2, merge=merge)
    scheduled: dict[int, int] = {}  # action id -> the step it was meant for
    executed: list[list[int]] = [[], [], []]
    for _ in range(200):
        if rng.random() < 0.3:
            h = int(rng.integers(1, 6))
            start = q.now + int(rng.integers(-4, 4))
            base = q._next_chunk * 1_000_000
            for i in range(h):
                scheduled[base + i] = start + i
            q.push(torch.randn(3, h, 2), start)
        step = q.now
        _, ok, ids = q.pop()
        for e in range(3):
            if ok[e]:
                assert scheduled[int(ids[e])] == step  # executed exactly at its step, never after it
                executed[e].append(int(ids[e]))
    for e in range(3):
        assert len(executed[e]) == len(set(executed[e]))  # never twice
        steps = [scheduled[i] for i in executed[e]]
        assert steps == sorted(steps)


def test_queue_merge_rules_and_stale_drop():
    q = ActionQueue(1, 1, merge="replace")
    q.push(torch.zeros(1, 4, 1), 0)
    q.pop()
    stale = q.push(torch.ones(1, 4, 1), 0)  # step 0 is past: one stale action dropped
    assert int(stale[0]) == 1 and q.remaining().tolist() == [3]
    assert q.peek(3)[0][0, :, 0].tolist() == [1.0, 1.0, 1.0]
    k = ActionQueue(1, 1, merge="keep")
    k.push(torch.zeros(1, 2, 1), 0)
    k.push(torch.ones(1, 3, 1), 0)
    assert k.peek(3)[0][0, :, 0].tolist() == [0.0, 0.0, 1.0]
    b = ActionQueue(1, 1, merge="blend")
    b.push(torch.zeros(1, 3, 1), 0)
    b.push(torch.ones(1, 4, 1), 0)
    vals = b.peek(4)[0][0, :, 0].tolist()
    assert vals[0] < vals[1] < vals[2] < 1.0 and vals[3] == 1.0
    with pytest.raises(ValueError, match="merge must be one of"):
        ActionQueue(1, 1, merge="average")


def test_latency_stats_and_delay():
    s = LatencyStats()
    for v in (0.01, 0.02, 0.03, 0.2):
        s.record("inference", v)
    summ = s.summary()["inference"]
    assert summ["count"] == 4 and summ["max"] == 0.2 and 0.01 <= summ["p50"] <= 0.03
    assert delay_steps(0.0, 20) == 0 and delay_steps(0.05, 20) == 1 and delay_steps(0.051, 20) == 2
    assert s.delay(20.0, quantile=50) == 1


class _CountingAgent:
    """Chunks whose actions encode (request number, position): a = [req, pos, 0, ..., grip]."""

    chunk_size = 6

    def __init__(self):
        self.requests = 0
        self.seen_states: list[torch.Tensor] = []

    def act(self, obs, env):
        self.requests += 1
        self.seen_states.append(obs["state"].clone())
        n = obs["state"].shape[0]
        c = torch.zeros(n, 6, 7)
        c[..., 0] = self.requests / 10
        c[..., 1] = torch.arange(6) / 10
        c[..., 6] = 1.0
        return c

    def act_rtc(self, obs, env, prev, valid, frozen):
        c = self.act(obs, env)
        keep = valid[:, :frozen]
        c[:, :frozen] = torch.where(keep[..., None], prev[:, :frozen], c[:, :frozen])
        return c


def _run(mode: str, delay: int, steps: int = 20, **kw):
    agent = _CountingAgent()
    ex = ChunkExecutor(LatencyConfig(mode=mode, delay=delay, **kw), 2, 6, 7, 20.0)
    obs = {"state": torch.zeros(2, 15)}
    out = [ex.next_action(obs, None, agent) for _ in range(steps)]
    return agent, ex, torch.stack([a for a, _ in out]), torch.stack([ok for _, ok in out])


def test_execution_modes_follow_their_timelines():
    # sync, d=2: wait 2 steps holding still, run the 6 actions, wait again
    _, ex, acts, ok = _run("sync", 2, steps=16)
    assert ok[:, 0].tolist() == [False, False] + [True] * 6 + [False, False] + [True] * 6
    assert acts[0, 0, :6].abs().sum() == 0 and acts[0, 0, 6] == -1.0  # hold: no motion, gripper open
    # async, d=2, threshold 3: the first 2 actions of every chunk are stale and never run
    _, ex, acts, ok = _run("async", 2, steps=20, threshold=3)
    pos = (acts[ok[:, 0], 0, 1] * 10).round().long().tolist()
    assert 0 not in pos and 1 not in pos and int(ex.queue.dropped[0]) >= 2 * (ex.requests - 1)
    # aware, d=2: each chunk runs in full, starting d steps after its observation
    agent, ex, acts, ok = _run("aware", 2, steps=20)
    assert ok[:, 0].tolist()[:2] == [False, False] and all(ok[2:, 0].tolist())
    assert (acts[2:8, 0, 1] * 10).round().long().tolist() == [0, 1, 2, 3, 4, 5]
    # the augmented state holds exactly the committed actions (the last 2 of the previous chunk)
    second = agent.seen_states[1][0]
    committed = second[15 : 15 + 14].reshape(2, 7)
    assert (committed[:, 1] * 10).round().long().tolist() == [4, 5] and float(second[-1]) == 1.0
    # rtc: the frozen actions are the ones that were queued, so nothing jumps at the switch
    _, ex, acts, ok = _run("rtc", 2, steps=20, threshold=3)
    assert all(ok[2:, 0].tolist())
    # sync with a receding horizon: only the first 2 actions of each chunk run, then a new request
    agent, ex, acts, ok = _run("sync", 0, steps=8, action_steps=2)
    assert all(ok[:, 0].tolist()) and agent.requests == 4
    assert (acts[:, 0, 1] * 10).round().long().tolist() == [0, 1] * 4
    assert (acts[:, 0, 0] * 10).round().long().tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
    # ... and skipping the first action of each chunk (the diagnostic of a late start)
    agent, ex, acts, ok = _run("sync", 0, steps=6, action_steps=2, action_offset=1)
    assert all(ok[:, 0].tolist()) and (acts[:, 0, 1] * 10).round().long().tolist() == [1, 2] * 3


def test_executor_rejects_impossible_settings():
    with pytest.raises(ValueError, match="needs delay < chunk size"):
        ChunkExecutor(LatencyConfig(mode="async", delay=6), 1, 6, 7, 20.0)
    with pytest.raises(ValueError, match="execution mode must be one of"):
        ChunkExecutor(LatencyConfig(mode="later"), 1, 6, 7, 20.0)
    with pytest.raises(ValueError, match="action_steps must be in 1..6"):
        ChunkExecutor(LatencyConfig(action_steps=7), 1, 6, 7, 20.0)
    with pytest.raises(ValueError, match="must fit in the chunk"):
        ChunkExecutor(LatencyConfig(action_offset=2, action_steps=5), 1, 6, 7, 20.0)
    with pytest.raises(ValueError, match="action_offset applies to sync"):
        ChunkExecutor(LatencyConfig(mode="rtc", delay=1, action_offset=1), 1, 6, 7, 20.0)
    with pytest.raises(ValueError, match="action_steps applies to sync"):
        ChunkExecutor(LatencyConfig(mode="async", delay=1, action_steps=2), 1, 6, 7, 20.0)


def test_augment_and_widen_keep_the_policy_output():
    state, committed = torch.randn(2, 15), torch.randn(2, 4, 7)
    aug = augment_state(state, committed, torch.tensor([2, 0]), 4)
    assert aug.shape == (2, 15 + 28 + 1)
    assert torch.equal(aug[0, 15:29], committed[0, :2].flatten()) and (aug[0, 29:43] == 0).all()
    assert (aug[1, 15:43] == 0).all() and aug[:, -1].tolist() == [0.5, 0.0]
    policy = policies.make("flow", chunk_size=6, expert_layers=1, **TINY).eval()
    wide = widen_state_input(policy, 29).eval()
    obs = {
        "rgb": torch.randint(0, 255, (2, 2, 32, 32, 3), dtype=torch.uint8),
        "state": state,
        "instruction": ["a", "b"],
    }
    a = policy.act(obs, generator=torch.Generator().manual_seed(0))
    b = wide.act(dict(obs, state=aug), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(a, b, atol=1e-5) and wide.config.state_dim == 44


def test_delayed_env_executes_committed_actions_first_and_is_deterministic():
    def rollout():
        env = sims.make("mujoco", suite="goal", num_envs=2, seed=0, cameras=(), image_size=32)
        wrapped = DelayedChunkEnv(env, chunk_size=6, delays=[3], seed=0)
        obs = wrapped.reset(task_ids=[8, 8], init_ids=[0, 1])
        assert obs["state"].shape == (2, 15 + 3 * 7 + 1)
        assert (obs["state"][:, 15:36].reshape(2, 3, 7)[..., 6] == -1).all()  # hold, gripper open
        gen = torch.Generator().manual_seed(0)
        states = []
        for _ in range(3):
            chunk = torch.rand(2, 6, 7, generator=gen) * 0.6 - 0.3
            res = wrapped.step_chunk(chunk)
            committed = res.obs["state"][:, 15:36].reshape(2, 3, 7)
            assert torch.allclose(committed, chunk[:, 3:])  # the new chunk's last d actions
            assert res.executed.sum() == 12
            states.append(res.obs["state"].clone())
        wrapped.close()
        return torch.stack(states)

    assert torch.equal(rollout(), rollout())


def test_simulated_delay_evaluation_is_deterministic():
    from embodied.eval.harness import PolicyAgent, run_suite

    policy = policies.make("flow", chunk_size=6, expert_layers=1, **TINY)

    def once(mode):
        records = []
        stats = run_suite(
            PolicyAgent(policy),
            "goal",
            tasks=[8],
            episodes=2,
            num_envs=2,
            image_size=32,
            seed=0,
            latency=LatencyConfig(mode=mode, delay=2),
            on_episode=records.append,
        )
        return [(r.init_id, r.success, r.length) for r in records], stats["latency"]

    for mode in ("sync", "rtc"):
        (a, lat), (b, _) = once(mode), once(mode)
        assert a == b and lat["requests"] > 0 and lat["held_steps"] > 0


def test_latency_aware_training_then_the_latency_bench(tmp_path):
    """embodied-train latency_delays widens the policy; bench=latency runs every mode and delay."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="1")
    init = policies.save(policies.make("flow", chunk_size=6, expert_layers=1, **TINY), tmp_path / "sft")
    proc = subprocess.run(
        [
            str(bin_dir / "embodied-train"),
            f"init={init}",
            f"out={tmp_path / 'rl'}",
            "suite=goal",
            "tasks=[8]",
            "num_envs=2",
            "image_size=32",
            "chunks_per_iter=2",
            "algo.minibatch_size=4",
            "iterations=1",
            "latency_delays=[0,2]",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    aware = tmp_path / "rl" / "checkpoint" / "policy"
    assert policies.load(aware).config.state_dim == 15 + 2 * 7 + 1
    from conftest import compose

    from embodied.runners.train import TrainError, train

    with pytest.raises(TrainError, match="below the policy's chunk size"):
        train(compose("train", f"init={init}", f"out={tmp_path / 'bad'}", "suite=goal", "latency_delays=[6]"))
    # the latency bench in-process (the config embodied-bench builds from these arguments; the command
    # itself is test_bench.py's): one process start-up fewer
    import benchmarks.cli  # noqa: F401  (registers the benchmark schemas)
    from benchmarks.latency import run

    out = tmp_path / "bench"
    out.mkdir()
    run(
        compose(
            "bench",
            "bench=latency",
            f"out={out}",
            f"checkpoint={init}",
            f"aware_checkpoint={aware}",
            "suite=goal",
            "tasks=[8]",
            "episodes=1",
            "num_envs=1",
            "image_size=32",
            "delays=[0,2,6]",
            "latency_probe_chunks=2",
        ),
        out,
    )
    result = json.loads((out / "latency.json").read_text())
    cells = {(c["mode"], c["delay"]): c for c in result["cells"]}
    assert len(cells) == 12 and result["measured_latency"]["count"] == 2
    assert "skipped" in cells[("async", 6)] and "skipped" not in cells[("sync", 6)]
    assert cells[("sync", 2)]["held_steps_per_episode"] > cells[("sync", 0)]["held_steps_per_episode"]
    assert (out / "latency.png").is_file() and "| d |" in (out / "latency.md").read_text()
