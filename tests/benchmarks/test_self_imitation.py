"""The self-imitation benchmark's steps and report (benchmarks/self_imitation.py) from run results."""

from __future__ import annotations

import importlib
import json

import pytest


def _module():
    return importlib.import_module("benchmarks.self_imitation")


def _eval(rate: float, diff: float | None = None) -> dict:
    states = [[i, int(i < rate * 10), 1] for i in range(10)]
    tasks = [{"task": 0, "state_successes": states}]
    res = {"suites": {"libero_spatial": {"success_rate": rate, "tasks": tasks}}}
    if diff is not None:
        res["comparison"] = {"libero_spatial": {"paired": {"difference": diff, "ci95": [diff - 0.04, diff + 0.04]}}}
    return res


def test_each_arm_continues_the_rounds_policy_on_its_rollouts(tmp_path):
    m = _module()
    args = m.parse_args(["--start", str(tmp_path / "start"), "--out", str(tmp_path / "out"), "--steps", "200"])
    rollouts = [tmp_path / f"task{t}" for t in range(3)]
    for arm, flag in (("success", "true"), ("all", "false")):
        cmd = m.sft_command(tmp_path / arm, tmp_path / "policy", rollouts, m.ARMS[arm], args)
        assert f"only_successes={flag}" in cmd and "stats_from=init" in cmd and "steps=200" in cmd
        assert f"data={rollouts[0]}" in cmd and f"extra_data=[{rollouts[1]},{rollouts[2]}]" in cmd
        assert not any(c.startswith("resume") for c in cmd)
    (tmp_path / "success" / "train_state").mkdir(parents=True)
    assert "resume=true" in m.sft_command(tmp_path / "success", tmp_path / "p", rollouts, m.ARMS["success"], args)
    # round 0 from the start cell's SFT policy, later rounds from the last round's self-imitation
    assert m.round_start(tmp_path / "out", tmp_path / "start", 0) == tmp_path / "start" / "sft" / "ckpt"
    assert (
        m.round_start(tmp_path / "out", tmp_path / "start", 2)
        == tmp_path / "out" / "round1" / "success" / "sft" / "ckpt"
    )
    held = m.score_command(tmp_path / "e", tmp_path / "p", True, tmp_path / "base")
    assert "first_state=50" in held and f"compare={tmp_path / 'base'}" in held and "seed=0" in held
    assert "first_state=50" not in m.score_command(tmp_path / "e", tmp_path / "p", False, tmp_path / "base")
    with pytest.raises(SystemExit):
        m.parse_args(["--start", "a", "--out", "b", "--steps", "0"])


def test_report_pairs_each_arm_with_the_start(tmp_path):
    m = _module()
    start, out = tmp_path / "start", tmp_path / "out"
    (start / "eval_sft").mkdir(parents=True)
    (start / "eval_sft" / "results.json").write_text(json.dumps(_eval(0.5)))
    (start / "eval_sft_heldout").mkdir()
    (start / "eval_sft_heldout" / "results.json").write_text(json.dumps(_eval(0.6)))
    for t in m.TASKS:
        folder = out / "round0" / "rollouts" / f"task{t}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"tasks": []}))
        (folder / "meta" / "embodied").mkdir(parents=True)
        ok = [i < 5 for i in range(50)]
        if t == 0:  # against the start's evaluation (states 0..4 of 0..9 succeeded): state 4 lost, 5 won
            ok = [i in (0, 1, 2, 3, 5, 10) for i in range(50)]
        rows = [{"suite_task_index": t, "init_id": i, "success": s} for i, s in enumerate(ok)]
        (folder / "meta" / "embodied" / "episodes.jsonl").write_text("\n".join(map(json.dumps, rows)))
    for arm, rate in (("success", 0.7), ("all", 0.5)):
        cell = out / "round0" / arm
        (cell / "sft").mkdir(parents=True)
        (cell / "sft" / "sft.json").write_text(
            json.dumps({"episodes": 250, "samples": 5000, "steps": 500, "train_seconds": 600})
        )
        (cell / "eval").mkdir()
        (cell / "eval" / "results.json").write_text(json.dumps(_eval(rate, rate - 0.5)))
    rep = m.report(out, start, 1, list(m.ARMS.values()))
    rollouts = rep["rollouts"][0]
    assert (rollouts["episodes"], rollouts["successes"]) == (500, 51)
    assert rollouts["churn"]["states"] == 10 and (rollouts["churn"]["better"], rollouts["churn"]["worse"]) == (1, 1)
    success, control = rep["rows"]
    assert (success["arm"], success["success"], success["better"], success["worse"]) == ("success", 0.7, 2, 0)
    assert control["paired"]["difference"] == 0.0 and control["heldout"] is None
    page = m.markdown(rep, "python benchmarks/self_imitation.py ...")
    assert "| 0 | success | 250 | 5000 | 500 | 70.0% | +0.200 [+0.160, +0.240] | 2 / 0 | - | - |" in page
    assert rep["filter"][0]["difference"] == 0.2 and (rep["filter"][0]["better"], rep["filter"][0]["worse"]) == (2, 0)
    assert "Round 0, `success` against `all` (the reward's filter), paired over 10 states: +0.200" in page
    assert "| 0 | 10.2% of 500 | 51 | +0.000 [-0.292, +0.292] | 1 / 1 |" in page
