"""CLI smoke runs of the main job at tiny sizes, through the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "embodied-pipeline"), *args], capture_output=True, text=True, env=env, timeout=300)


def test_pipeline_scripted_pick_and_place_writes_report_and_video(tmp_path):
    out = tmp_path / "run"
    proc = _run(f"out={out}", "episodes=3", "sim.num_envs=2", "sim.image_size=32", "video_episodes=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 3 and results["num_envs"] == 2
    assert results["success_rate"] == 1.0
    assert results["video_frames"] > 10
    assert (out / "report.md").read_text().startswith("# Scripted pick-and-place")
    assert (out / ".hydra" / "config.yaml").is_file()
    rows = (out / "episodes.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 3


def test_pipeline_rejects_unknown_key_and_bad_task(tmp_path):
    proc = _run(f"out={tmp_path}", "bogus_key=1")
    assert proc.returncode != 0 and "bogus_key" in proc.stderr
    proc = _run(f"out={tmp_path}", "sim.task=reach", "video_episodes=0")
    assert proc.returncode != 0 and "scripted stage runs" in proc.stderr
