"""The installed wheel ships the packages and the Hydra configs (not only an editable checkout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_packages_and_configs(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("sims/core.py", "sims/mujoco/env.py", "embodied/runners/pipeline.py",
                     "configs/pipeline.yaml", "configs/sim/mujoco.yaml", "policies/__init__.py",
                     "real_robot/__init__.py"):
        assert required in names, required
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "embodied-pipeline" in text and "embodied-bench" in text
