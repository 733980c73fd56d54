"""A lost policy server (real_robot/loop/outage.py): the robot holds while the client reconnects to a
real PolicyServer on localhost; the outage ends when it is back, or the client gives up."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from conftest import SERVED_TINY as TINY

import policies
from real_robot.loop import ServerOutage, ServerStatus
from real_robot.policy_client import PolicyClient, ReconnectPolicy
from real_robot.server import PolicyServer, ServerThread

QUICK = ReconnectPolicy(max_attempts=4, max_total_s=1.0, first_delay_s=0.05, max_delay_s=0.2)


class HoldingRobot:
    """Records the hold commands the outage gives (all it asks of a robot)."""

    def __init__(self) -> None:
        self.holds = 0

    def hold(self) -> None:
        self.holds += 1


def _server(port: int = 0) -> ServerThread:
    torch.manual_seed(0)
    return ServerThread(PolicyServer(policies.make("flow", chunk_size=6, **TINY)), port=port)


def _settle(outage: ServerOutage, timeout: float = 30.0) -> ServerStatus:
    deadline = time.monotonic() + timeout
    while (status := outage.poll()) is ServerStatus.AWAY and time.monotonic() < deadline:
        time.sleep(0.02)
    return status


@pytest.fixture
def pool():
    pool = ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown()


def test_no_outage_costs_nothing(pool):
    outage = ServerOutage(PolicyClient("ws://127.0.0.1:1"), pool.submit)
    outage.start_episode()
    assert outage.poll() is ServerStatus.UP and not outage.away
    holds = outage.end_episode()
    assert holds.seconds == 0 and holds.reconnects == 0


def test_the_robot_holds_until_the_server_is_back(pool):
    first = _server()
    port = first.start()
    client = PolicyClient(f"ws://127.0.0.1:{port}", reconnect=QUICK)
    client.connect()
    first.stop()
    robot = HoldingRobot()
    outage = ServerOutage(client, pool.submit)
    outage.start_episode()
    with _server(port):  # the same policy, restarted
        message = outage.begin(robot)
        assert robot.holds == 1 and outage.away and f"ws://127.0.0.1:{port}" in message
        assert _settle(outage) is ServerStatus.BACK
        assert not outage.away and client.alive()
        holds = outage.end_episode()
    client.close()
    assert holds.reconnects == 1 and holds.seconds > 0


def test_the_client_gives_up_on_a_server_that_never_returns(pool):
    server = _server()
    port = server.start()
    client = PolicyClient(f"ws://127.0.0.1:{port}", reconnect=QUICK)
    client.connect()
    server.stop()
    outage = ServerOutage(client, pool.submit)
    outage.start_episode()
    outage.begin(HoldingRobot())
    assert _settle(outage) is ServerStatus.GONE and not outage.away
    assert "gave up reconnecting" in outage.error and "limits: 4 attempts, 1 s" in outage.error
    holds = outage.end_episode()
    client.close()
    assert holds.reconnects == 0 and 0 < holds.seconds < 30


def test_an_episode_counts_only_its_share_of_an_outage():
    now = [8.0]
    pending: Future = Future()  # a reconnect still under way
    outage = ServerOutage(PolicyClient("ws://127.0.0.1:1"), lambda fn: pending, clock=lambda: now[0])
    outage.begin(HoldingRobot())  # during the previous episode
    now[0] = 10.0
    outage.start_episode()
    now[0] = 12.5
    assert outage.poll() is ServerStatus.AWAY
    assert outage.end_episode().seconds == pytest.approx(2.5)  # from the episode's start, not the outage's
    assert outage.away  # the outage outlives the episode
