"""The deployment client (real_robot/client.py) on localhost: the Deployer's modes, spec checks, the
watchdog, camera stalls and the emergency stop, with SimRobot and a real websocket server."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SERVED_TINY as TINY

import policies
from real_robot.client import DeployConfig, Deployer, DeployError, Watchdog
from real_robot.policy_client import PolicyClient
from real_robot.robots.sim_robot import SimRobot
from real_robot.server import PolicyServer, ServerThread


def test_watchdog_states():
    now = [0.0]
    w = Watchdog(0.1, 0.5, clock=lambda: now[0])
    assert w.state() == "ok"
    now[0] = 0.2
    assert w.state() == "hold"
    now[0] = 0.6
    assert w.state() == "stop"
    w.fresh()
    assert w.state() == "ok"


def test_deploy_spec_mismatch_is_refused(tiny_server):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, cameras=("agentview",), realtime=False)
    with pytest.raises(DeployError, match="needs cameras"):
        Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"), DeployConfig(), "x")


@pytest.mark.parametrize("mode", ["sync", "async", "rtc"])
def test_sim_robot_episode_through_the_server(tiny_server, mode):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
        DeployConfig(mode=mode, max_steps=25),
        robot.instruction,
    )
    res = dep.run_episode()
    dep.close()
    robot.disconnect()
    assert res.reason == "max_steps" and res.steps == 25 and len(res.actions) == 25
    assert res.latency["round_trip"]["count"] >= 3
    assert all(np.isfinite(a).all() and (np.abs(a) <= 1).all() for a in res.actions)


def test_camera_stall_and_emergency_stop(tiny_server):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True, stall_camera="wrist", stall_camera_after=5)
    robot.connect()
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
        DeployConfig(mode="async", max_steps=200, stall_timeout_s=0.3),
        robot.instruction,
    )
    res = dep.run_episode()
    assert res.reason == "camera_stalled:wrist" and res.steps < 200 and not robot.connected
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep.robot = robot
    res = dep.run_episode(on_step=lambda step, obs, sent: dep.emergency_stop() if step == 5 else None)
    assert res.reason == "estop" and res.steps == 6 and not robot.connected
    with pytest.raises(DeployError, match="emergency stop is engaged"):
        dep.run_episode()
    dep.reset_estop()
    robot.connect()
    dep.cfg.max_steps = 30  # an untrained policy: a long episode may drift the arm into an implausible state
    assert dep.run_episode(record=False).reason in ("max_steps", "success")
    dep.close()
    robot.disconnect()


def test_latency_aware_policy_deploys_in_aware_mode_only():
    from embodied.latency import widen_state_input

    aware = widen_state_input(policies.make("flow", chunk_size=6, **TINY), 2 * 7 + 1)
    with ServerThread(PolicyServer(aware)) as port:
        robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
        robot.connect()
        with pytest.raises(DeployError, match="use mode=aware"):
            Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}"), DeployConfig(mode="async"), "x")
        dep = Deployer(
            robot, PolicyClient(f"ws://127.0.0.1:{port}"), DeployConfig(mode="aware", max_steps=20), robot.instruction
        )
        assert dep.max_delay == 2
        res = dep.run_episode()
        dep.close()
        robot.disconnect()
    assert res.steps == 20 and res.latency["round_trip"]["count"] >= 2


def test_state_only_simulation_policy_is_refused_on_a_robot():
    from real_robot.client import check_compatible
    from real_robot.spec import PolicySpec

    robot = SimRobot(suite="goal", task=8, image_size=32)
    spec = PolicySpec(
        family="flow",
        action_dim=7,
        chunk_size=3,
        state_dim=15 + 50,
        cameras=(),
        image_size=32,
        control_hz=20.0,
        state_obs="privileged",
    )
    assert PolicySpec.from_metadata(spec.metadata()).state_obs == "privileged"  # travels to the client
    with pytest.raises(DeployError, match="simulator-only object state"):
        check_compatible(spec, robot)
