"""Imports run one way (sims < policies < embodied < real_robot < benchmarks), with no circle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from check_imports import circles, import_graph  # noqa: E402


def test_the_repository_imports_run_one_way_without_circles():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_imports.py")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout


def test_the_checker_finds_an_upward_import_and_a_circle(tmp_path):
    files = {
        "sims/__init__.py": "from sims import core\n",
        "sims/core.py": "def f():\n    import sims  # a lazy import is a dependency too\n",
        "policies/__init__.py": "",
        "policies/model.py": "import embodied.runs\n",  # floor 2 reaching floor 3
        "embodied/__init__.py": "",
        "embodied/runs.py": "from . import helpers\n",
        "embodied/helpers.py": "from .runs import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph, upward = import_graph(tmp_path)
    assert [line.split(": ", 1)[1] for line in upward] == ["policies.model (floor 2) imports embodied.runs (floor 3)"]
    assert circles(graph) == [["embodied.helpers", "embodied.runs"], ["sims", "sims.core"]]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_imports.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "2 circles" in proc.stdout
