"""Smoke run of ``embodied-bench bench=experts`` at a tiny size, through the console script."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_experts_bench_writes_json_and_csv(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            str(BIN / "embodied-bench"),
            "bench=experts",
            f"out={tmp_path}",
            "suites=[dynamic]",
            "init_states=2",
            "num_envs=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "experts.json").read_text())
    assert result["init_states"] == 2 and result["tasks_total"] == 5
    tasks = result["suites"]["dynamic"]["tasks"]
    assert [t["task"] for t in tasks] == list(range(5))
    assert all(0.0 <= t["success_rate"] <= 1.0 and t["episodes"] == 2 for t in tasks)
    rows = list(csv.DictReader(open(tmp_path / "experts.csv")))
    assert len(rows) == 5 and rows[0]["suite"] == "dynamic"


def test_experts_bench_rejects_unknown_suite(tmp_path):
    proc = subprocess.run(
        [str(BIN / "embodied-bench"), "bench=experts", f"out={tmp_path}", "suites=[mars]"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "unknown suite" in proc.stderr
