"""CLI smoke runs of ``embodied-bench`` at tiny sizes, through the real console script.

Behaviour only: files, fields, error messages. Never timing values (DESIGN: tests never time).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(BIN / "embodied-bench"), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
    )


def test_bench_sim_writes_json_csv_and_table(tmp_path):
    out = tmp_path / "run"
    proc = _run(
        "bench=sim",
        f"out={out}",
        "num_envs=[1,2]",
        "num_threads=[1,2]",
        "steps=3",
        "repeats=1",
        "warmup_steps=1",
        "image_size=32",
        "workload_suites=[goal]",
        "workload_num_envs=[2]",
        "workload_chunk_sizes=[2,3]",
        "workload_control_steps=3",
        "workload_repeats=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Hydra's own files go to the run folder, not ./outputs
    assert (out / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "outputs").exists()
    assert "env/batch" in proc.stdout and "target" in proc.stdout

    res = json.loads((out / "sim.json").read_text())
    assert res["bench"] == "sim"
    assert res["config"]["num_envs"] == [1, 2] and res["config"]["steps"] == 3
    assert {"python", "cpu_count", "cpu", "torch_cpu_capability", "mujoco", "numpy", "torch"} <= set(res["machine"])
    sizes = res["sizes"]
    assert sizes["task"] == "pick_cube" and sizes["substeps"] >= 1 and sizes["nv"] > 0
    assert sizes["views"] == 2 and sizes["image_size"] == 32
    # N=1 runs one thread (the env clamps threads to N): cases (1,1), (2,1), (2,2)
    assert [(c["num_envs"], c["threads"]) for c in res["cases"]] == [(1, 1), (2, 1), (2, 2)]
    assert res["skipped"] == [{"num_envs": 1, "threads_requested": 2, "threads": 1}]
    for case in res["cases"]:
        for variant in ("env_state", "raw_batch", "raw_rollout", "env_rgb"):
            rate = case[variant]["env_steps_per_s"]
            assert rate["median"] > 0 and len(rate["samples"]) == 1
            assert case[variant]["control_steps"] == 3
            assert case[variant]["physics_steps_per_s"] > 0
        assert case["env_rgb"]["frames_per_s"] > 0
        for variant in ("env_state", "env_rgb"):  # our env's time split: physics/render/rest
            split = case[variant]["time_split"]
            assert 0 < split["physics_frac"] < 1 and split["overhead_ms_per_step"] > 0
        assert case["env_state"]["time_split"]["render_frac"] == 0
        assert case["env_rgb"]["time_split"]["render_frac"] > 0
        assert "time_split" not in case["raw_batch"]
        assert case["ratio_env_vs_raw_batch"] > 0 and case["ratio_env_vs_raw_rollout"] > 0
        assert "other_cores_avg" in case  # machine load by other processes (None off Linux)
    scaling = res["thread_scaling"]
    assert [(r["num_envs"], r["threads"]) for r in scaling] == [(2, 2)]
    assert scaling[0]["env_state"] > 0 and scaling[0]["cpu_util"]["raw_batch"] > 0
    assert {"loadavg_end", "omp_num_threads"} <= set(res["runtime"])
    targets = res["targets"]
    assert set(targets["env_vs_raw_batch"]["by_num_envs"]) == {"1", "2"}
    assert isinstance(targets["env_vs_raw_batch"]["pass"], bool)
    # the thread-scaling target applies to N >= 8 only: nothing measured here
    assert targets["thread_scaling"]["by_num_envs"] == {} and targets["thread_scaling"]["pass"] is None

    with (out / "sim.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 4
    assert {
        "num_envs",
        "threads",
        "variant",
        "env_steps_per_s_median",
        "physics_steps_per_s_median",
        "ratio_vs_raw_batch",
        "speedup_vs_1_thread",
        "overhead_ms_per_step",
    } <= set(rows[0])
    assert {r["variant"] for r in rows} == {"env_state", "raw_batch", "raw_rollout", "env_rgb"}
    assert all(float(r["env_steps_per_s_median"]) > 0 for r in rows)
    # the RL workload: step_chunk rendering on demand against every step, per (N, H)
    assert [(r["suite"], r["num_envs"], r["chunk_size"]) for r in res["rl_workload"]] == [
        ("goal", 2, 2),
        ("goal", 2, 3),
    ]
    for r in res["rl_workload"]:
        assert r["control_steps"] >= 3 and len(r["on_demand_runs"]) == len(r["every_step_runs"]) == 2
        assert r["on_demand_env_steps_per_s"] > 0 and r["every_step_env_steps_per_s"] > 0 and r["speedup"] > 0
    assert "RL workload" in proc.stdout


def test_bench_state_only_without_rollout(tmp_path):
    proc = _run(
        "bench=sim",
        f"out={tmp_path}",
        "num_envs=[2]",
        "num_threads=[1]",
        "cameras=[]",
        "rollout=false",
        "steps=2",
        "repeats=2",
        "warmup_steps=0",
        "workload_suites=[]",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "sim.json").read_text())
    (case,) = res["cases"]
    assert "env_rgb" not in case and "raw_rollout" not in case
    assert len(case["env_state"]["env_steps_per_s"]["samples"]) == 2
    assert res["thread_scaling"] == []


def test_bench_errors_are_clear(tmp_path):
    proc = _run("bench=nope", f"out={tmp_path}")
    assert proc.returncode != 0
    assert "bench/nope" in proc.stderr and "sim" in proc.stderr  # names the available ones
    proc = _run("bench=sim")  # no out=
    assert proc.returncode != 0 and "out=DIR is required" in proc.stderr
    proc = _run("bench=sim", f"out={tmp_path}", "num_envs=[0]")
    assert proc.returncode != 0 and "num_envs must be" in proc.stderr
    proc = _run("bench=sim", f"out={tmp_path}", "workload_suites=[libero_spatial]")
    assert proc.returncode != 0 and "workload_suites must name" in proc.stderr
    proc = _run("bench=sim", f"out={tmp_path}", "bogus_key=1")
    assert proc.returncode != 0 and "bogus_key" in proc.stderr


def test_every_bench_option_has_a_module_and_importing_the_app_loads_no_simulator():
    """Each option of configs/bench/ names a benchmark module with a typed SCHEMA; storing all the
    schemas (what importing the app does) imports no mujoco, so it fixes no OpenGL platform."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import benchmarks.cli, configs\n"
        "from benchmarks.config import BenchConfig\n"
        "from benchmarks.registry import bench_module\n"
        "names = sorted(p.stem for p in (Path(configs.__file__).parent / 'bench').glob('*.yaml'))\n"
        "assert names and all(issubclass(bench_module(n).SCHEMA, BenchConfig) for n in names), names\n"
        "assert 'mujoco' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_bench_train_times_sequential_overlap_and_cluster(tmp_path):
    import policies

    init = policies.save(
        policies.make(
            "flow", d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1
        ),
        tmp_path / "sft",
    )
    out = tmp_path / "b"
    # one remote env runner in the cluster cases (2 envs on it): the cases' process start-ups were most of
    # the time; the same 2 envs per iteration as the local cases
    proc = _run(
        "bench=train",
        f"out={out}",
        f"init={init}",
        "num_envs=2",
        "image_size=32",
        "chunks_per_iter=2",
        "iterations=2",
        "rounds=1",
        "warmup=0",
        "max_episode_steps=5",
        "cluster_env_runners=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train.json").read_text())
    assert set(result["cases"]) == {"local-sequential", "local-overlap", "cluster-sequential", "cluster-overlap"}
    for name, case in result["cases"].items():
        # 2 envs x (3 + 2) steps: the 5-step limit ends each episode inside its second chunk
        assert case["iterations"] == 2 and case["env_steps_per_iteration"] == 2 * 5
        assert set(case["time_split_s"]) == {"sim_s", "inference_s", "learn_s", "wait_s", "iteration_s"}
        assert case["env_steps_per_s"] > 0 and "vs_local_sequential" in case
        # an overlapped batch is trained one update after it was sampled (the first one is not)
        assert case["policy_lag"] == (1.0 if name.endswith("overlap") else 0.0), (name, case["policy_lag"])
    assert set(result["overlap_speedup_by_runtime"]) == {"local", "cluster"}
    assert result["overlap_speedup"] == result["overlap_speedup_by_runtime"]["local"] > 0
    assert isinstance(result["target"]["met"], bool)
    rows = list(csv.DictReader(open(out / "train.csv")))
    assert [r["case"] for r in rows] == ["local-sequential", "local-overlap", "cluster-sequential", "cluster-overlap"]
    # an unknown case is refused before anything starts (in-process: the config the command builds; the
    # command's own error path is test_bench_errors_are_clear's)
    from conftest import compose

    import benchmarks.cli  # noqa: F401  (registers the benchmark schemas)
    from benchmarks.config import BenchError
    from benchmarks.train import run

    with pytest.raises(BenchError, match="runtimes"):
        run(compose("bench", "bench=train", f"out={tmp_path / 'c'}", "runtimes=[warp]"), tmp_path / "c")
