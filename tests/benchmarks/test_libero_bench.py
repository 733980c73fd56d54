"""``embodied-bench bench=libero`` at tiny sizes: the reference env's speed cases and the cost table."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sims.libero as libero
from benchmarks.libero import evaluation_cost

BIN = Path(sys.executable).parent


def test_evaluation_cost_counts_every_episode_at_its_limit():
    hours = evaluation_cost(steps_per_s=10.0, reset_s=1.0)
    # libero_spatial: 10 tasks x 50 states x ((220 + 10) / 10 s + 1 s) = 12000 s
    assert hours["libero_spatial"] == round(12000 / 3600, 2)
    assert hours["libero_90"] == round(90 * 50 * (41 + 1) / 3600, 2)


@pytest.mark.skipif(
    not libero.VENV.joinpath("bin", "python").is_file(),
    reason="the reference LIBERO venv is missing: run bash scripts/setup.sh",
)
def test_bench_libero_writes_its_cases(tmp_path, libero_exported):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            str(BIN / "embodied-bench"),
            "bench=libero",
            f"out={out}",
            "image_sizes=[128]",
            "steps=2",
            "repeats=1",
            "resets=1",
            "batched_num_envs=[2]",
            f"cache={libero_exported[0]}",
            "workload_num_envs=[2]",
            "workload_chunk_sizes=[2]",
            "workload_control_steps=2",
            "workload_repeats=1",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "libero.json").read_text())
    assert [c["case"] for c in res["cases"]] == ["two cameras 128 px", "no rendering"]
    assert all(c["steps_per_s"] > 0 and len(c["steps_per_s_runs"]) == 1 for c in res["cases"])
    assert res["hard_reset_s"] > 0 and set(res["official_evaluation_hours"]["soft_reset"]) == set(libero.MAX_STEPS)
    # our batched physics on the exported scene, both box-contact settings, against the reference; then
    # with the two cameras, the meshes as they are and decimated (with and without multisampling),
    # against the reference's 128 px rate
    assert [
        (b["box_contacts"], b["num_envs"], b["image_size"], b["render_faces"], b.get("antialias"))
        for b in res["batched"]
    ] == [
        ("native", 2, 0, None, None),
        ("reference", 2, 0, None, None),
        ("native", 2, 128, None, True),
        ("native", 2, 128, 2000, True),
        ("native", 2, 128, 2000, False),
    ]
    assert all(b["steps_per_s"] > 0 and b["ratio_vs_reference"] > 0 for b in res["batched"])
    # without rendering, also MuJoCo's own physics replaying the same substeps (the same trajectories)
    # on our batch's threads, and our time over its time
    for b in res["batched"]:
        if b["image_size"]:
            assert "physics_limit_steps_per_s" not in b
            continue
        assert b["physics_limit_steps_per_s"] > 0 and b["physics_nthread"] == 1, b
        assert abs(b["ratio_to_limit"] - b["physics_limit_steps_per_s"] / b["steps_per_s"]) < 0.01, b
        assert b["limit_state_err"] < 1e-9, b
    # the RL workload: step_chunk on demand against every step, and against the reference rendering every
    # step and only at the chunk boundaries
    (w,) = res["rl_workload"]
    assert (w["num_envs"], w["chunk_size"], w["control_steps"]) == (2, 2, 2)
    assert w["on_demand_env_steps_per_s"] > 0 and w["every_step_env_steps_per_s"] > 0 and w["speedup"] > 0
    assert w["vs_reference_every_step"] > 0 and w["vs_reference_chunk_boundary"] > 0
    assert res["cases"][0]["chunk_boundary_steps_per_s"]["2"] > 0
    rows = list(csv.reader((out / "libero.csv").open()))
    assert (
        rows[0]
        == [
            "case",
            "image_size",
            "steps_per_s",
            "soft_reset_s",
            "build_s",
            "physics_limit_steps_per_s",
            "ratio_to_limit",
        ]
        and len(rows) == 9
    )
    assert [r[0] for r in rows[1:] if r[5]] == ["ours native contacts, 2 envs", "ours reference contacts, 2 envs"]


def test_bench_libero_refuses_an_unknown_suite(tmp_path):
    proc = subprocess.run(
        [str(BIN / "embodied-bench"), "bench=libero", f"out={tmp_path / 'run'}", "suite=libero_spacial"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode != 0 and "unknown LIBERO suite 'libero_spacial'" in proc.stderr, proc.stderr[-2000:]
