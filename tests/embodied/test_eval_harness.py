"""embodied-eval: protocol, intervals, determinism, resume after Ctrl-C, comparisons, clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import policies
from embodied.eval.stats import difference_interval, paired_difference_interval, pass_at_k, wilson_interval

BIN = Path(sys.executable).parent
TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)


def _eval(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "embodied-eval"), *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_wilson_and_difference_intervals():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 50)[0] == pytest.approx(0.0, abs=1e-12)
    assert wilson_interval(50, 50)[1] == pytest.approx(1.0, abs=1e-12)
    d, lo, hi = difference_interval(45, 50, 25, 50)
    assert d == pytest.approx(0.4) and 0 < lo < d < hi < 1
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_paired_difference_interval():
    # the same states, every one 0.25 better: no spread in the differences, a point interval
    d, lo, hi = paired_difference_interval([0.5, 1.0, 0.75], [0.25, 0.75, 0.5])
    assert (d, lo, hi) == pytest.approx((0.25, 0.25, 0.25))
    # states that disagree: mean 0.1, SE = sd / sqrt(n)
    now, before = [1.0, 0.0, 1.0, 1.0, 0.5], [0.5, 0.0, 1.0, 0.5, 1.0]
    diffs = [0.5, 0.0, 0.0, 0.5, -0.5]
    se = (sum((x - 0.1) ** 2 for x in diffs) / 4 / 5) ** 0.5
    d, lo, hi = paired_difference_interval(now, before)
    assert (
        d == pytest.approx(0.1)
        and lo == pytest.approx(0.1 - 1.96 * se, abs=1e-3)
        and hi == pytest.approx(0.1 + 1.96 * se, abs=1e-3)
    )
    # pairing is tighter than pooling when the policies agree on which states are hard
    hard_easy_before, hard_easy_now = [0.0] * 25 + [0.5] * 25, [0.25] * 25 + [0.75] * 25
    _, lo_paired, _ = paired_difference_interval(hard_easy_now, hard_easy_before)
    _, lo_pooled, _ = difference_interval(50, 100, 25, 100)  # the same rates over 2 attempts per state, unpaired
    assert lo_paired > lo_pooled
    assert paired_difference_interval([1.0], [0.0]) == (1.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="same units"):
        paired_difference_interval([1.0, 0.0], [0.0])


def test_compare_pairs_the_states_both_runs_played():
    from embodied.eval.harness import EpisodeRecord
    from embodied.eval.report import aggregate, compare

    def run(outcomes):  # {init id: [success per attempt]}
        recs = [
            EpisodeRecord("goal", 0, "t", i, 0, ok, 10, False, a)
            for i, oks in outcomes.items()
            for a, ok in enumerate(oks)
        ]
        return aggregate(recs, ["goal"], {"goal": [0]}, {"goal": ["t"]})

    before = run({0: [False, False], 1: [True, False], 2: [True, True], 3: [False, True]})
    after = run({0: [True, False], 1: [True, True], 2: [True, True], 4: [True, True]})  # state 3 absent, 4 new
    assert before["goal"]["tasks"][0]["state_successes"] == [[0, 0, 2], [1, 1, 2], [2, 2, 2], [3, 1, 2]]
    cmp = compare(after, {"suites": before})["goal"]
    paired = cmp["tasks"][0]["paired"]
    assert (
        paired["states"] == 3
        and paired["before"] == pytest.approx(0.5)
        and paired["now"] == pytest.approx(5 / 6, abs=1e-4)
    )
    assert paired["difference"] == pytest.approx(1 / 3, abs=1e-4) and cmp["paired"] == paired
    # a previous results.json without per-state successes (older runs) compares as before, unpaired
    old = {
        "suites": {"goal": {"tasks": [{k: v for k, v in before["goal"]["tasks"][0].items() if k != "state_successes"}]}}
    }
    cmp_old = compare(after, old)["goal"]
    assert (
        "paired" not in cmp_old and "paired" not in cmp_old["tasks"][0] and cmp_old["tasks"][0]["difference"] == 0.5
    )  # attempt 0: 2 of 4 -> 4 of 4


def test_pass_at_k_and_its_aggregation_over_attempts():
    from embodied.eval.harness import EpisodeRecord, wave_seed
    from embodied.eval.report import aggregate

    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 4, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    assert wave_seed(0, "goal", 1) == wave_seed(0, "goal", 1, 0) != wave_seed(0, "goal", 1, 1)
    # task 0: state 0 succeeds at attempt 0 only, state 1 at attempt 2 only, state 2 never
    outcomes = {0: [True, False, False], 1: [False, False, True], 2: [False, False, False]}
    records = [
        EpisodeRecord("goal", 0, "t", init_id, 0, ok, 10, False, attempt)
        for init_id, oks in outcomes.items()
        for attempt, ok in enumerate(oks)
    ]
    res = aggregate(records, ["goal"], {"goal": [0]}, {"goal": ["t"]})["goal"]
    row = res["tasks"][0]
    assert row["episodes"] == 3 and row["successes"] == 1 and row["failures"] == [1, 2]  # attempt 0: the protocol
    assert row["pass_at_k"] == pytest.approx([2 / 9, 4 / 9, 2 / 3], abs=1e-4)  # pass@3: 2 of 3 states
    assert res["pass_at_k"] == row["pass_at_k"]
    assert "pass_at_k" not in aggregate(records[::3], ["goal"], {"goal": [0]}, {"goal": ["t"]})["goal"]


def test_experts_through_the_harness_meet_the_protocol(tmp_path):
    out = tmp_path / "experts"
    proc = _eval(
        "policy=expert",
        "suite=goal",
        "tasks=[0,6]",
        "episodes=4",
        "num_envs=4",
        f"out={out}",
        "image_size=32",
        "videos=all",
        "video_max=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    goal = res["suites"]["goal"]
    assert [t["name"] for t in goal["tasks"]] == ["open_the_drawer", "put_the_cube_in_the_drawer"]
    for t in goal["tasks"]:
        assert t["episodes"] == 4 and t["success_rate"] >= 0.95 and len(t["ci95"]) == 2
    assert (out / "plots" / "goal.png").stat().st_size > 0 and (out / "results.csv").is_file()
    report = (out / "report.md").read_text()
    assert len(res["videos"]) == 1 and "| 0 | open_the_drawer |" in report
    # the machine, down to the instruction set torch's kernels use (it changes a trained policy's floats)
    assert f"torch kernels {res['machine']['torch_cpu_capability']}" in report


@pytest.mark.parametrize("execution", [(), ("execution=sync", "delay=2")])
def test_experts_run_when_episodes_are_fewer_than_envs(tmp_path, execution):
    """The evaluation shrinks the env count to the episodes it has; the experts follow it."""
    out = tmp_path / "few"
    proc = _eval(
        "policy=expert",
        "suite=goal",
        "tasks=[2]",
        "episodes=2",
        "num_envs=8",
        "image_size=32",
        "videos=none",
        *execution,
        f"out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    task = json.loads((out / "results.json").read_text())["suites"]["goal"]["tasks"][0]
    assert task["episodes"] == 2 and task["success_rate"] == 1.0


def test_policy_evaluation_is_reproducible_and_compares(tmp_path):
    ckpt = policies.save(policies.make("flow", **TINY), tmp_path / "ckpt")
    # episodes cut at 40 steps (an untrained policy would play the 160-220 steps of the tasks' limits)
    args = [
        f"checkpoint={ckpt}",
        "suite=dynamic",
        "tasks=[0,3]",
        "episodes=2",
        "num_envs=2",
        "image_size=32",
        "videos=none",
        "max_steps=40",
    ]
    a = tmp_path / "a"
    assert _eval(*args, f"out={a}").returncode == 0
    ra = json.loads((a / "results.json").read_text())
    # the same checkpoint and seed again, with more attempts per state and compared with the first run:
    # attempt 0 (the protocol's) gives the same numbers, pass@k is added (one run less than a separate
    # rerun of the first's arguments, which this test also had)
    c = tmp_path / "c"
    proc = _eval(*args, f"out={c}", "attempts=2", f"compare={a}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    full_c = json.loads((c / "results.json").read_text())
    assert full_c["agent"]["sha256"] == ra["agent"]["sha256"]
    assert all(t["difference"] == 0 for t in full_c["comparison"]["dynamic"]["tasks"])
    rc = full_c["suites"]["dynamic"]
    assert rc["success_rate"] == ra["suites"]["dynamic"]["success_rate"] and len(rc["pass_at_k"]) == 2
    per_attempt = ("pass_at_k", "state_successes")  # over every attempt
    assert {k: v for k, v in rc.items() if k not in per_attempt + ("tasks",)} == {
        k: v for k, v in ra["suites"]["dynamic"].items() if k not in per_attempt + ("tasks",)
    }
    assert [{k: v for k, v in t.items() if k not in per_attempt} for t in rc["tasks"]] == [
        {k: v for k, v in t.items() if k not in per_attempt} for t in ra["suites"]["dynamic"]["tasks"]
    ]
    assert all(n == 2 for t in rc["tasks"] for _, _, n in t["state_successes"])
    lines = [json.loads(line) for line in (c / "episodes.jsonl").read_text().splitlines()]
    assert all(r["length"] <= 40 for r in lines) and "cut at 40 steps" in (c / "report.md").read_text()
    assert sorted((r["attempt"], r["task"], r["init_id"]) for r in lines) == [
        (a, t, i) for a in (0, 1) for t in (0, 3) for i in (0, 1)
    ]
    assert "pass@2" in (c / "report.md").read_text()
    d = tmp_path / "d"  # two worker processes share the waves out: the same episodes
    proc = _eval(*args, f"out={d}", "attempts=2", "workers=2", "videos=all", "video_max=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rd = json.loads((d / "results.json").read_text())
    assert rd["suites"]["dynamic"] == rc
    assert sorted((d / "episodes.jsonl").read_text().splitlines()) == sorted(
        (c / "episodes.jsonl").read_text().splitlines()
    )
    assert (
        rd["latency"]["dynamic"]["requests"]
        == json.loads((c / "results.json").read_text())["latency"]["dynamic"]["requests"]
    )
    assert len(rd["videos"]) == 3  # video_max over both workers


@pytest.mark.parametrize("workers", [1, 2])
def test_interrupted_run_keeps_episodes_and_resumes(tmp_path, workers):
    out = tmp_path / "run"
    # 15 waves of 2 episodes: far more work than the 3 episodes waited for before the interrupt
    args = [
        "policy=expert",
        "suite=goal",
        "tasks=[2,3]",
        "episodes=15",
        "num_envs=2",
        "image_size=32",
        "videos=none",
        f"out={out}",
        f"workers={workers}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # a shell running the suite in the background ignores SIGINT, and a child would inherit that
    proc = subprocess.Popen(
        [str(BIN / "embodied-eval"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = out / "episodes.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not log.is_file() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    partial = log.read_text().splitlines()
    assert proc.returncode == 130 and "resume" in err, err[-3000:]
    assert 3 <= len(partial) < 30
    res = json.loads((out / "results.json").read_text())
    assert res["interrupted"] and sum(t["episodes"] for t in res["suites"]["goal"]["tasks"]) == len(partial)
    proc = _eval(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = log.read_text().splitlines()
    assert len(done) == 30 and done[: len(partial)] == partial
    keys = [(json.loads(line)["task"], json.loads(line)["init_id"]) for line in done]
    assert len(set(keys)) == 30


def test_clear_errors(tmp_path):
    from conftest import compose

    from embodied.runners.eval import EvalError, run
    from policies import CheckpointError, SpecMismatchError

    ckpt = policies.save(policies.make("flow", action_dim=8, **TINY), tmp_path / "ckpt8")
    token = policies.save(
        policies.make(
            "autoregressive", d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=2, prefix_layers=1
        ),
        tmp_path / "token",
    )
    proc = _eval(f"checkpoint={ckpt}", "suite=goal", "episodes=1", f"out={tmp_path / 'cli'}", "image_size=32")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("embodied-eval:") and "8-D actions but the env expects 7-D" in last
    cases = [
        (("policy=expert", "suite=nope"), "unknown suite"),
        (("policy=expert", "suite=goal", "tasks=[12]"), "out of range"),
        ((f"checkpoint={tmp_path / 'missing'}", "suite=goal"), "no checkpoint bundle"),
        (("suite=goal",), "checkpoint=PATH"),
        (("policy=expert", "suite=goal", "attempts=2"), "deterministic"),
        (("policy=expert", "suite=goal", "attempts=0"), "attempts must be"),
        (("policy=expert", "suite=goal", "workers=0"), "workers must be"),
        ((f"checkpoint={token}", "suite=goal", "attempts=2"), "mode=explore"),
    ]
    for i, (args, message) in enumerate(cases):  # the same checks in-process
        with pytest.raises((EvalError, CheckpointError, SpecMismatchError), match=message):
            run(compose("eval", *args, f"out={tmp_path / str(i)}", "image_size=32"))


def test_a_stop_request_ends_the_run_between_control_steps():
    """embodied-eval's Ctrl-C handler only sets a flag; the harness stops at its next step."""
    from embodied.eval.harness import ExpertAgent, run_suite

    polls: list[int] = []

    def should_stop() -> bool:
        polls.append(1)
        return len(polls) > 60

    records = []
    with pytest.raises(KeyboardInterrupt):
        run_suite(
            ExpertAgent("goal", 2),
            "goal",
            tasks=[8],
            episodes=50,
            num_envs=2,
            image_size=32,
            seed=0,
            on_episode=records.append,
            should_stop=should_stop,
        )
    assert len(polls) == 61  # polled once per control step, stopped at the first True
    assert 0 < len(records) < 50 and all(r.success for r in records)


class _RecordingAgent:
    """Random chunks from a seeded stream; keeps the views of every observation it is asked with."""

    cameras = ("agentview", "wrist")
    state_obs = "proprio"
    chunk_size = 4

    def __init__(self):
        self.seen: list = []

    def begin_wave(self, seed: int) -> None:
        import torch

        self.gen = torch.Generator().manual_seed(seed)

    def act(self, obs, env):
        import torch

        self.seen.append(obs["rgb"].clone())
        return torch.rand(obs["state"].shape[0], self.chunk_size, 7, generator=self.gen) * 2 - 1

    def act_rtc(self, obs, env, prev, prev_valid, frozen):
        return self.act(obs, env)

    def episode_done(self, mask) -> None: ...


@pytest.mark.parametrize(
    "latency", [dict(mode="sync", action_steps=3), dict(mode="async", delay=1), dict(mode="rtc", delay=2, threshold=2)]
)
def test_latency_modes_read_mid_chunk_frames_as_rendered_every_step(latency):
    """The harness renders only the steps whose observation a chunk request reads (or a video): the
    requests see the pixels of rendering every step, and a video gets every frame."""
    import torch

    from embodied.eval.harness import run_suite
    from embodied.latency import LatencyConfig

    def run(film: bool):
        agent, videos, records = _RecordingAgent(), [], []
        run_suite(
            agent,
            "goal",
            tasks=[8],
            episodes=2,
            num_envs=2,
            image_size=32,
            seed=3,
            max_steps=9,
            latency=LatencyConfig(**latency),
            record_frames=film,
            on_episode=records.append,
            on_frames=lambda *a: videos.append(a),
        )
        return agent.seen, videos, records

    lazy, _, _ = run(False)
    every, videos, records = run(True)  # a video renders every step
    assert len(lazy) == len(every) >= 3
    assert all(torch.equal(a, b) for a, b in zip(lazy, every))
    assert len(videos) == 2
    for (_, _, _, frames, _, length), rec in zip(videos, records):
        assert length == rec.length and len(frames) == length + 1  # the reset's frame and one per step
        assert sum(not (a == b).all() for a, b in zip(frames, frames[1:])) >= length - 1  # drawn, not repeated


def test_filming_stops_when_the_sink_wants_no_more_videos():
    """A frame sink that returns False is full: the harness hands it no further episode (and stops
    rendering every step for it); the episodes themselves are the same as without videos."""
    from embodied.eval.harness import run_suite
    from embodied.latency import LatencyConfig

    def run(film: bool, wants_more: bool):
        agent, videos, records = _RecordingAgent(), [], []

        def sink(*args):
            videos.append(args)
            return wants_more

        run_suite(
            agent,
            "goal",
            tasks=[8],
            episodes=3,
            num_envs=3,
            image_size=32,
            seed=3,
            max_steps=7,
            latency=LatencyConfig(mode="sync"),
            record_frames=film,
            on_episode=records.append,
            on_frames=sink,
        )
        return videos, records

    every, records = run(True, True)
    one, records_one = run(True, False)
    _, records_none = run(False, True)
    assert len(every) == 3 and len(one) == 1
    assert one[0][3] is not None and len(one[0][3]) == one[0][5] + 1
    assert [r.__dict__ for r in records] == [r.__dict__ for r in records_one] == [r.__dict__ for r in records_none]
