"""A lost policy server: the robot holds while :meth:`PolicyClient.reconnect` retries in the request
thread; the episode goes on once the server is back, or ends when the client gives up."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Optional

from real_robot.loop.exits import StrEnum
from real_robot.policy_client import PolicyClient
from real_robot.robots.base import Robot

log = logging.getLogger(__name__)


class ServerStatus(StrEnum):
    """What :meth:`ServerOutage.poll` found."""

    UP = "up"  # no outage
    AWAY = "away"  # reconnecting; the robot holds
    BACK = "back"  # reconnected just now
    GONE = "gone"  # the client gave up (:attr:`ServerOutage.error` says why)


@dataclass
class HoldLog:
    """What an episode's outages cost: seconds held and reconnects (the episode began at ``started``)."""

    started: float
    seconds: float = 0.0
    reconnects: int = 0

    def add(self, since: float, now: float, reconnected: bool) -> None:
        """An outage from ``since`` to ``now``; only its part inside this episode counts."""
        self.seconds += now - max(since, self.started)
        self.reconnects += reconnected


class ServerOutage:
    """At most one outage at a time; it outlives an episode that ends while reconnecting.

    ``submit`` runs the reconnect in the request thread, after any request still there.
    """

    def __init__(
        self, client: PolicyClient, submit: Callable[..., Future], clock: Callable[[], float] = time.perf_counter
    ):
        self.client, self.submit, self.clock = client, submit, clock
        self.since: Optional[float] = None
        self.error: Optional[str] = None  # why the last reconnect gave up
        self.holds = HoldLog(clock())
        self._reconnect: Optional[Future] = None

    @property
    def away(self) -> bool:
        return self._reconnect is not None

    def start_episode(self) -> None:
        self.holds = HoldLog(self.clock())

    def end_episode(self) -> HoldLog:
        """This episode's hold log, with its share of an outage still going on."""
        if self.since is not None and self.away:
            self.holds.add(self.since, self.clock(), reconnected=False)
        return self.holds

    def begin(self, robot: Robot) -> str:
        """Hold ``robot`` and start reconnecting; returns the message that says so."""
        robot.hold()
        message = f"lost the policy server at {self.client.uri}; holding the robot while reconnecting"
        log.warning("%s", message)
        self.since, self._reconnect = self.clock(), self.submit(self.client.reconnect)
        return message

    def poll(self) -> ServerStatus:
        """Whether the server is up, still away, back (the outage ends and is counted) or gone."""
        if self._reconnect is None:
            return ServerStatus.UP
        if not self._reconnect.done():
            return ServerStatus.AWAY
        reconnect, since = self._reconnect, self.since
        self._reconnect = None
        try:
            reconnect.result()
        except Exception as err:  # noqa: BLE001 - whatever stopped the reconnect, the robot stops
            self.holds.add(since, self.clock(), reconnected=False)
            self.error = f"{type(err).__name__}: {err}"
            log.error("stopping the robot: %s", self.error)
            return ServerStatus.GONE
        self.holds.add(since, self.clock(), reconnected=True)
        log.info("the policy server at %s is back after %.2f s; resuming", self.client.uri, self.clock() - since)
        return ServerStatus.BACK
