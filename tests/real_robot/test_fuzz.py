"""The protocol fuzzer (real_robot/fuzz.py) against a live server: errors for malformed messages, and
the server keeps serving everyone else."""

from __future__ import annotations

import json

from conftest import openpi_obs as _obs

from real_robot.policy_client import PolicyClient


def test_fuzz_malformed_messages_get_errors_and_the_server_keeps_serving(tiny_server, tmp_path):
    from real_robot.fuzz import KINDS, fuzz, main, passed

    server, port = tiny_server
    summary = fuzz(port, messages=1500, api_key="s3cret", seed=1, oversize_every=200)
    assert passed(summary), {k: v for k, v in summary.items() if k != "per_kind"}
    assert summary["messages"] == 1500 and set(summary["per_kind"]) == set(KINDS)  # every kind was sent
    assert summary["closed_oversize"] >= 7 and summary["error_replies"] > 1000 and summary["action_replies"] > 50
    ok = PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret")
    ok.connect()
    assert ok.infer(_obs())[0].shape == (6, 7)  # everyone else is still served
    ok.close()
    # the script: its own server, a JSON summary, exit status 0 when it passed
    assert main(["--messages", "100", "--out", str(tmp_path / "fuzz.json")]) == 0
    assert json.loads((tmp_path / "fuzz.json").read_text())["passed"] is True
