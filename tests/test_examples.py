"""The examples (examples/*.py) run as a user runs them, each in its own process at its ``--tiny`` size:
real LIBERO scenes and LIBERO's own env, real servers on localhost, a LeRobot-format checkpoint."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_libero_venv

import policies
from sims.libero import scenes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LEROBOT_PYTHON = ROOT / ".venv-lerobot" / "bin" / "python"


def _run(script: str, *args: str, python: Path = Path(sys.executable), **env: str) -> str:
    proc = subprocess.run(
        [str(python), str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _scripts() -> list[Path]:
    return sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_every_example_says_what_it_shows_and_how_to_run_it(script):
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert "What it shows" in doc and f"examples/{script.name} --tiny" in doc, script
    assert f"[{script.name}]({script.name})" in (EXAMPLES / "README.md").read_text()


@needs_libero_venv
def test_libero_rl(libero_exported, tmp_path):
    out = tmp_path / "rl"
    cache = {scenes.CACHE_ENV: str(libero_exported[0]), scenes.AUTO_EXPORT_ENV: "0"}
    stdout = _run("libero_rl.py", "--tiny", "--out", str(out), **cache)
    assert "pick up the black bowl between the plate and the ramekin" in stdout
    assert "iteration 1: 16 env steps" in stdout  # 2 envs x 2 chunks x 4 actions
    assert policies.load(out / "checkpoint" / "policy").config.state_dim == 8


@needs_libero_venv
def test_libero_eval_server(tmp_path):
    out = tmp_path / "eval"
    stdout = _run("libero_eval_server.py", "--tiny", "--out", str(out))
    res = json.loads((out / "results.json").read_text())
    assert res["simulator"] == "robosuite" and res["env_steps"] == 5
    (row,) = res["suites"]["libero_spatial"]["tasks"]
    assert row["episodes"] == 1 and f"task 0 {row['name']}: 0/1 successes" in stdout
    assert "connection open" in (tmp_path / "eval_server" / "serve.log").read_text()  # the server it evaluated


def test_deploy_sim_robot(tmp_path):
    out = tmp_path / "deploy"
    stdout = _run("deploy_sim_robot.py", "--tiny", "--out", str(out))
    (episode,) = json.loads((out / "deploy.json").read_text())["episodes"]
    assert episode["reason"] == "max_steps" and episode["steps"] == 10 and episode["reconnects"] == 0
    assert "episode 0: max_steps after 10 steps" in stdout
    assert (out / "dataset" / "meta" / "info.json").is_file()  # the recorded episode, SFT's format


@pytest.mark.skipif(not LEROBOT_PYTHON.is_file(), reason=".venv-lerobot is missing: run bash scripts/setup.sh")
def test_lerobot_policy(tmp_path):
    out = tmp_path / "lerobot"
    stdout = _run("lerobot_policy.py", "--tiny", "pi0", "--out", str(out), python=LEROBOT_PYTHON, HF_HUB_OFFLINE="1")
    assert "pi0: cameras ['agentview', 'wrist'], state [15], chunk [4, 7]" in stdout
    assert "after 2 chunks: no success" in stdout
    assert json.loads((out / "pi0_lerobot" / "config.json").read_text())["type"] == "pi0"  # LeRobot's format
    assert json.loads((out / "bundle" / "config.json").read_text())["family"] == "pi0"  # ours
