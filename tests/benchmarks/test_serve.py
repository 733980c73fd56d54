"""bench=serve (benchmarks/serve.py) through embodied-bench at tiny sizes: files and fields only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_serve_benchmark_runs(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            str(BIN / "embodied-bench"),
            "bench=serve",
            f"out={out}",
            "requests=3",
            "rounds=1",
            "warmup=1",
            "clients=2",
            "concurrency_seconds=1",
            "image_size=32",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "serve.json").read_text())
    assert result["round_trip_ms"]["p50"] > 0 and result["in_process_ms"]["p50"] > 0
    assert result["concurrency"]["many"]["clients"] == 2 and result["concurrency"]["many"]["requests"] > 0
    assert "meets_target" in result
