"""The policy benchmark's rows for LeRobot's families (tiny sizes) beside ours, in one run."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip(
    "lerobot",
    reason="LeRobot is not installed here: these tests run in .venv-lerobot "
    "(bash scripts/setup.sh makes it; bash scripts/test.sh runs them there)",
)


def test_policy_bench_times_lerobot_families_beside_ours(tmp_path):
    from benchmarks.policy import PolicyBenchConfig, run

    payload = run(
        PolicyBenchConfig(families=["flow", "pi0", "smolvla"], batch_sizes=[1], repeats=1, warmup=0, memory=False),
        tmp_path,
        progress=False,
    )
    rows = list(csv.DictReader(open(tmp_path / "policy.csv")))
    timed = {(r["family"], r["sampler"]) for r in rows if r["latency_ms_median"]}
    assert {("flow", "sde"), ("pi0", "ode"), ("pi0", "sde"), ("smolvla", "sde_full")} <= timed
    assert payload["families"]["pi0"]["size"].startswith("tiny")
