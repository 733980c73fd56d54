"""A policy server that goes away mid-deployment (real_robot/policy_client.py, real_robot/client.py):
the client reconnects with bounded backoff while the robot holds, or gives up with a clear error."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import SERVED_TINY as TINY
from conftest import openpi_obs as _obs

import policies
from real_robot.client import DeployConfig, Deployer
from real_robot.policy_client import PolicyClient, ReconnectPolicy, ServerError
from real_robot.robots.sim_robot import SimRobot
from real_robot.server import PolicyServer, ServerThread

#: short episodes: an untrained policy may drift the arm into an implausible state in a long one
STEPS = 50
QUICK = ReconnectPolicy(max_attempts=4, max_total_s=1.0, first_delay_s=0.05, max_delay_s=0.2)


def _server(chunk_size: int = 6, **kwargs) -> PolicyServer:
    torch.manual_seed(0)
    return PolicyServer(policies.make("flow", chunk_size=chunk_size, **TINY), **kwargs)


class WatchedSimRobot(SimRobot):
    """A SimRobot that notes, per command sent, whether ``away()`` said the server was away."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.away = lambda: False
        self.sent_while_away: list[bool] = []

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self.sent_while_away.append(self.away())
        return super().send_action(action)


def _robot() -> WatchedSimRobot:
    robot = WatchedSimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    return robot


def test_reconnect_policy_backs_off_exponentially_up_to_its_cap():
    delays = list(ReconnectPolicy(max_attempts=6, first_delay_s=0.1, max_delay_s=0.5, factor=2.0).delays())
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="max_attempts >= 1"):
        ReconnectPolicy(max_attempts=0)


def test_the_episode_holds_through_a_server_restart_and_goes_on():
    """The server is stopped mid-episode and started again on the same port: the robot holds (no
    command sent), the client reconnects once, and the new server drives the rest of the episode."""
    first = ServerThread(_server())
    port = first.start()
    restarted: list[ServerThread] = []

    def restart() -> None:
        first.stop()
        thread = ServerThread(_server(), port=port)
        thread.start()
        restarted.append(thread)

    def on_step(step, obs, sent):
        if step == 8:
            threading.Thread(target=restart, daemon=True).start()

    robot = _robot()
    dep = Deployer(
        robot, PolicyClient(f"ws://127.0.0.1:{port}"), DeployConfig(mode="async", max_steps=STEPS), robot.instruction
    )
    robot.away = lambda: dep._outage is not None
    try:
        res = dep.run_episode(on_step=on_step)
    finally:
        dep.close()
        robot.disconnect()
        for thread in restarted:
            thread.stop()
    assert res.reason == "max_steps" and res.steps == STEPS, dep.last_error
    assert res.reconnects == 1 and res.server_hold_s > 0
    assert restarted and restarted[0].server.requests >= 2  # the restarted server drove the episode on
    assert robot.sent_while_away and not any(robot.sent_while_away)  # no command while the server was away
    assert len(res.actions) == STEPS and all(np.isfinite(a).all() for a in res.actions)


def test_the_client_gives_up_with_a_clear_error_when_the_server_never_returns():
    server = ServerThread(_server())
    port = server.start()
    robot = _robot()
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{port}", reconnect=QUICK),
        DeployConfig(mode="async", max_steps=STEPS),
        robot.instruction,
    )
    res = dep.run_episode(on_step=lambda step, obs, sent: server.stop() if step == 8 else None)
    dep.close()
    assert res.reason == "server_lost" and res.steps < STEPS and not robot.connected  # held, then stopped
    assert res.reconnects == 0 and res.server_hold_s > 0
    assert f"ws://127.0.0.1:{port}" in dep.last_error and "gave up reconnecting" in dep.last_error
    assert "attempt(s) in" in dep.last_error and "limits: 4 attempts, 1 s" in dep.last_error


def test_reconnect_refuses_a_wrong_key_at_once(tiny_server):
    _, port = tiny_server
    client = PolicyClient(f"ws://127.0.0.1:{port}", api_key="wrong", reconnect=ReconnectPolicy(max_total_s=30))
    with pytest.raises(ConnectionError, match=r"after 1 attempt\(s\).*HTTP 401.*API key"):
        client.reconnect()


def test_reconnect_refuses_a_server_that_came_back_with_another_policy():
    first = ServerThread(_server(chunk_size=6))
    port = first.start()
    client = PolicyClient(f"ws://127.0.0.1:{port}", reconnect=QUICK)
    client.connect()
    first.stop()
    with ServerThread(_server(chunk_size=4), port=port):
        with pytest.raises(ServerError, match="different policy"):
            client.reconnect()
    client.close()


def test_a_reply_after_its_timeout_never_answers_the_next_request():
    """A request that timed out drops its connection: its late reply cannot be taken for the next one's."""
    with ServerThread(_server(batch_window_ms=400)) as port:  # every request waits 0.4 s for a batch
        client = PolicyClient(f"ws://127.0.0.1:{port}", reconnect=QUICK)
        client.connect()
        with pytest.raises(TimeoutError, match="connection was dropped"):
            client.infer(_obs(), timeout=0.05)
        assert not client.alive()
        client.reconnect()
        assert client.alive() and client.reconnects == 1
        assert client.infer(_obs(), timeout=10)[0].shape == (6, 7)
        client.close()
