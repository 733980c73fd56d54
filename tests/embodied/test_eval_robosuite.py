"""``embodied-eval ... simulator=robosuite``: real LIBERO's reference env (``.venv-libero``) against
our policy server, with the outputs of every other evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import policies
import sims.libero as libero

BIN = Path(sys.executable).parent
TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1, chunk_size=2)
#: the keys of every evaluation's results.json (embodied/runners/eval.py) and of each task's row
RESULT_KEYS = {
    "suites",
    "agent",
    "config",
    "device",
    "wall_s",
    "env_steps",
    "latency",
    "env_steps_per_s",
    "interrupted",
    "videos",
    "machine",
}
TASK_KEYS = {
    "task",
    "name",
    "episodes",
    "successes",
    "success_rate",
    "ci95",
    "mean_length",
    "failures",
    "diverged",
    "state_successes",
}
needs_venv = pytest.mark.skipif(
    not libero.VENV.joinpath("bin", "python").is_file(),
    reason="the reference LIBERO venv is missing: run bash scripts/setup.sh",
)


def _eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "embodied-eval"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=500,
    )


@pytest.fixture(scope="module")
def libero_policy(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "policy"
    policies.save(policies.make("flow", state_dim=8, action_dim=7, cameras=["agentview", "wrist"], **TINY), path)
    return path


@needs_venv
def test_the_reference_env_plays_the_protocol_through_our_server(libero_policy, tmp_path):
    out = tmp_path / "eval"
    args = [
        f"checkpoint={libero_policy}",
        "suite=libero_spatial",
        "simulator=robosuite",
        "tasks=[0]",
        "episodes=2",
        "max_steps=3",
        "image_size=32",
        "videos=failures",
        "video_max=1",
        f"out={out}",
    ]
    proc = _eval(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert RESULT_KEYS <= set(res) and res["simulator"] == "robosuite"
    suite = res["suites"]["libero_spatial"]
    (row,) = suite["tasks"]
    assert set(row) == TASK_KEYS and row["episodes"] == 2 and suite["episodes"] == 2
    assert row["name"].startswith("pick_up_the_black_bowl") and row["mean_length"] == 3  # untrained: no success
    assert [s[0] for s in row["state_successes"]] == [0, 1]
    assert res["videos"] == ["videos/libero_spatial/00_00_fail.mp4"] and (out / res["videos"][0]).stat().st_size > 0
    assert (out / "report.md").read_text().count("real LIBERO in its reference simulator") == 1
    assert res["agent"]["family"] == "flow" and res["env_steps"] == 6
    # the same command resumes: nothing left to play, the same results
    lines = (out / "episodes.jsonl").read_text()
    proc = _eval(*args, f"compare={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "episodes.jsonl").read_text() == lines
    again = json.loads((out / "results.json").read_text())
    assert again["suites"] == res["suites"] and again["comparison"]["libero_spatial"]["mean_difference"] == 0.0


@needs_venv
def test_the_reference_env_plays_the_sampled_held_out_states(libero_policy, libero_exported, tmp_path, monkeypatch):
    """first_state=50: the server and the reference client play init ids 50 and 51, the states LIBERO's
    placement initializer sampled, read from the scene cache (``$EMBODIED_LIBERO_CACHE``). The serving path
    itself (``run_reference``): ``embodied-eval``'s own config check still bounds first_state + episodes
    by the 50 official states."""
    from embodied.eval.reference import run_reference
    from embodied.runners.eval import EvalConfig
    from sims.libero import scenes

    monkeypatch.setenv(scenes.CACHE_ENV, str(libero_exported[0]))
    monkeypatch.setenv(scenes.AUTO_EXPORT_ENV, "0")  # task 0 is in the cache: nothing is exported
    out = tmp_path / "eval"
    out.mkdir()
    cfg = EvalConfig(
        out=str(out),
        checkpoint=str(libero_policy),
        suite="libero_spatial",
        simulator="robosuite",
        tasks=[0],
        episodes=2,
        first_state=50,
        max_steps=3,
        image_size=32,
        videos="none",
    )
    res = run_reference(cfg, out, {"label": "tiny"}, lambda: None, None)
    (row,) = res["suites"]["libero_spatial"]["tasks"]
    assert row["episodes"] == 2 and [s[0] for s in row["state_successes"]] == [50, 51]
    assert res["env_steps"] == 6 and "from state 50" in res["protocol"]
    log = (out / "client.log").read_text()
    assert "task 0 init 50: failure in 3 steps" in log and "task 0 init 51" in log, log[-2000:]


@pytest.mark.parametrize(
    "keys, message",
    [
        (dict(suite="libero_spatial_swap"), "libero_spatial_swap is a LIBERO-PRO variant: add simulator=robosuite"),
        (
            dict(suite="libero_spatial", simulator="robosuite", workers=2),
            "workers=2 is not available with simulator=robosuite",
        ),
        (dict(suite="libero_spacial", simulator="robosuite"), "unknown LIBERO suite 'libero_spacial'"),
        (dict(suite="libero_goal", simulator="robosuite", server="localhost:8000"), "exactly one of checkpoint=PATH"),
        (dict(suite="spatial", simulator="bullet"), "simulator must be one of"),
        (dict(suite="spatial", hard_reset=True), "belong to simulator=robosuite"),
        (dict(suite="spatial", max_steps=0), "max_steps must be >= 1"),
    ],
)
def test_bad_reference_configs_are_refused(libero_policy, tmp_path, keys, message):
    from embodied.runners.eval import EvalConfig, EvalError, run

    with pytest.raises(EvalError, match=message.replace("(", r"\(")):
        run(EvalConfig(out=str(tmp_path / "x"), checkpoint=str(libero_policy), **keys))
    assert not (tmp_path / "x").exists()


def test_a_policy_not_made_for_libero_is_refused_before_anything_starts(tmp_path):
    path = tmp_path / "policy"
    policies.save(policies.make("flow", **TINY), path)  # our suites' state and cameras
    proc = _eval(
        f"checkpoint={path}", "suite=libero_goal", "simulator=robosuite", f"out={tmp_path / 'x'}", cwd=tmp_path
    )
    assert proc.returncode != 0 and "LIBERO's protocol gives the 8-D state" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "x" / "serve.log").exists() and not (tmp_path / "x" / "results.json").exists()
