"""Exit reasons (real_robot/loop/exits.py): a str enum that compares, prints and serialises as the
plain strings deploy.json and real_robot/cli.py have always used."""

from __future__ import annotations

import json

import pytest

from real_robot.client import STOP_REASONS, DeployConfig, Deployer, EpisodeResult
from real_robot.loop import Ending, ExitReason
from real_robot.policy_client import PolicyClient
from real_robot.robots.sim_robot import SimRobot


def _result(ending: Ending) -> EpisodeResult:
    return EpisodeResult(
        steps=3,
        success=ending.exit is ExitReason.SUCCESS,
        exit=ending.exit,
        held_steps=0,
        starved_steps=0,
        safety_counts={},
        latency={},
        stalled_camera=ending.camera,
    )


def test_exit_reasons_are_their_strings():
    assert ExitReason.SERVER_LOST == "server_lost" and f"({ExitReason.ESTOP})" == "(estop)"
    assert ExitReason("unsafe_state") is ExitReason.UNSAFE_STATE
    assert json.dumps({"reason": ExitReason.WATCHDOG}) == '{"reason": "watchdog"}'
    assert {r.value for r in ExitReason} == {
        "success",
        "max_steps",
        "watchdog",
        "camera_stalled",
        "estop",
        "unsafe_state",
        "server_lost",
    }


def test_the_robot_is_stopped_after_every_fault_and_only_then():
    stops = {r for r in ExitReason if r.stops_robot}
    assert stops == {
        ExitReason.WATCHDOG,
        ExitReason.CAMERA_STALLED,
        ExitReason.ESTOP,
        ExitReason.UNSAFE_STATE,
        ExitReason.SERVER_LOST,
    }
    assert set(STOP_REASONS) == stops


def test_a_camera_stall_names_its_camera():
    end = Ending(ExitReason.CAMERA_STALLED, camera="wrist")
    assert end.reason == "camera_stalled:wrist" and end.reason.startswith("camera_stalled")
    assert Ending(ExitReason.ESTOP).reason is ExitReason.ESTOP
    with pytest.raises(ValueError, match="names a camera exactly when"):
        Ending(ExitReason.ESTOP, camera="wrist")
    with pytest.raises(ValueError, match="names a camera exactly when"):
        Ending(ExitReason.CAMERA_STALLED)


@pytest.mark.parametrize(
    "ending",
    [Ending(r) for r in ExitReason if r is not ExitReason.CAMERA_STALLED]
    + [Ending(ExitReason.CAMERA_STALLED, camera="wrist")],
)
def test_cli_stops_the_deployment_exactly_when_the_robot_was_stopped(ending):
    """real_robot/cli.py compares ``res.reason`` with plain strings; that must agree with ``stops_robot``."""
    res = _result(ending)
    cli_stops = res.reason in ("estop", "watchdog", "unsafe_state", "server_lost") or res.reason.startswith(
        "camera_stalled"
    )
    assert cli_stops == res.exit.stops_robot
    row = json.loads(json.dumps({"reason": res.reason}))
    assert row["reason"] == ending.reason


def test_an_episode_reports_its_exit_as_the_enum(tiny_server):
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{tiny_server[1]}", api_key="s3cret"),
        DeployConfig(mode="sync", max_steps=5),
        robot.instruction,
    )
    res = dep.run_episode(record=False)
    dep.close()
    robot.disconnect()
    assert res.exit is ExitReason.MAX_STEPS and res.reason is ExitReason.MAX_STEPS and res.steps == 5
    assert res.stalled_camera is None and not res.exit.stops_robot
