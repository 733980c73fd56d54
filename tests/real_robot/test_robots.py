"""The robots (real_robot/robots): NetworkRobot behind the adapter protocol, SimRobot's injected
latency, noise and dynamics changes."""

from __future__ import annotations

import numpy as np
import pytest

from real_robot.client import DeployConfig, Deployer
from real_robot.policy_client import PolicyClient
from real_robot.robots.network import NetworkRobot, RobotAdapterServer
from real_robot.robots.sim_robot import SimRobot


def test_network_robot_behind_the_adapter_protocol(tiny_server):
    _, port = tiny_server
    sim = SimRobot(suite="goal", task=8, image_size=32, realtime=False)
    adapter = RobotAdapterServer(sim, api_key="r0bot")
    robot_port = adapter.start()
    robot = NetworkRobot(f"ws://127.0.0.1:{robot_port}", api_key="r0bot")
    robot.connect()
    assert robot.spec.cameras == {"agentview": [32, 32], "wrist": [32, 32]}
    obs = robot.observe()
    assert obs.state.shape == (15,) and obs.images["wrist"].shape == (32, 32, 3)
    sent = robot.send_action(np.array([2.0, 0, 0, 0, 0, 0, -1]))
    assert sent[0] == 1.0 and sim.ticks == 1  # clamped by the robot, one control step executed
    with pytest.raises(RuntimeError, match="action must be"):
        robot._call("send_action", action=np.zeros(3))
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
        DeployConfig(mode="async", max_steps=10, hold_timeout_s=5, stop_timeout_s=10),
        "lift the can",
    )
    res = dep.run_episode()
    assert res.steps == 10 and sim.ticks == 11
    dep.close()
    robot.disconnect()
    adapter.stop()
    with pytest.raises(Exception):
        NetworkRobot(f"ws://127.0.0.1:{robot_port}", api_key="wrong").connect()


def test_sim_robot_injects_latency_noise_and_dynamics_changes():
    up = np.array([0, 0, 1.0, 0, 0, 0, -1])
    base = SimRobot(suite="goal", task=8, image_size=32, realtime=False)
    odd = SimRobot(
        suite="goal",
        task=8,
        image_size=32,
        realtime=False,
        mass_scale=3.0,
        friction_scale=0.5,
        obs_latency_steps=2,
        action_delay_steps=1,
        camera_noise_std=5.0,
        color_shift=20.0,
    )
    base.connect()
    odd.connect()
    assert np.allclose(odd.env.sim.expand("body_mass")[0], 3.0 * base.env.sim.expand("body_mass")[0])
    start = odd.observe().state.copy()
    for _ in range(3):
        base.send_action(up)
        odd.send_action(up)
    assert base.observe().state[2] > start[2] + 0.05  # moved up
    # the first command ran one tick late and the reading is two ticks old: nothing visible yet
    assert np.allclose(odd.observe().state[:3], start[:3], atol=2e-3) and odd.ticks == 3
    diff = np.abs(base.observe().images["agentview"].astype(int) - odd.observe().images["agentview"].astype(int))
    assert diff.mean() > 2.0
    base.disconnect()
    odd.disconnect()
