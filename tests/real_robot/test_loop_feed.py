"""The chunk feed (real_robot/loop/feed.py) against a real PolicyServer on localhost: requests in a
background thread, chunks queued where their mode says, failures clear the queue."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from embodied.latency import LatencyStats
from real_robot.loop import AsyncMode, ChunkFeed, RtcMode, SyncMode
from real_robot.policy_client import PolicyClient, ServerError
from real_robot.robots.base import Observation
from real_robot.spec import IMAGE_PREFIX, RTC_FROZEN_KEY, RTC_PREV_KEY

H, A = 6, 7  # the tiny server's chunk


def _obs(state_dim: int = 15, size: int = 64) -> Observation:
    images = {c: np.full((size, size, 3), 100, np.uint8) for c in ("agentview", "wrist")}
    return Observation(np.zeros(state_dim, np.float32), images, {c: 0 for c in images}, time.time())


class Feeds:
    """Builds feeds on one connection; remembers each request's future so a test can wait for it."""

    def __init__(self, port: int):
        self.client = PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret")
        self.spec = self.client.connect()
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.futures: list[Future] = []
        self.stats = LatencyStats()

    def submit(self, fn, *args) -> Future:
        self.futures.append(self.pool.submit(fn, *args))
        return self.futures[-1]

    def make(self, mode) -> ChunkFeed:
        return ChunkFeed(mode, self.client, self.spec, "lift the can", self.submit, self.stats, 20.0, 10.0)

    def wait(self) -> None:
        self.futures[-1].exception(timeout=30)

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


@pytest.fixture
def feeds(tiny_server):
    f = Feeds(tiny_server[1])
    yield f
    f.close()


def test_async_asks_at_its_threshold_and_drops_the_steps_already_past(feeds):
    feed = feeds.make(AsyncMode(3, H))
    assert feed.request_if_due(0, _obs(), np.zeros(A))
    assert not feed.request_if_due(0, _obs(), np.zeros(A))  # one request at a time
    feeds.wait()
    assert feed.pop() is None and feed.pop() is None  # two periods held while the server thought
    assert feed.collect(step=2) is None and not feed.requesting
    assert feed.queued() == H - 2  # the chunk was for step 0
    assert feeds.stats.summary()["round_trip"]["count"] == 1 and feed.measured >= 1
    assert not feed.request_if_due(2, _obs(), np.zeros(A))  # 4 queued: over the threshold
    action = feed.pop()
    assert action.shape == (A,) and action.dtype == np.float64 and np.abs(action).max() <= 1
    assert feed.request_if_due(3, _obs(), np.zeros(A))  # 3 queued: at the threshold


def test_sync_starts_the_chunk_when_it_arrives(feeds):
    feed = feeds.make(SyncMode(3, H))
    assert feed.request_if_due(0, _obs(), np.zeros(A))
    feeds.wait()
    feed.pop(), feed.pop()
    feed.collect(step=2)
    assert feed.queued() == H


def test_a_chunk_that_raced_a_lost_connection_is_not_queued(feeds):
    feed = feeds.make(AsyncMode(3, H))
    feed.request_if_due(0, _obs(), np.zeros(A))
    feeds.wait()
    assert feed.collect(step=0, accept=False) is None
    assert feed.queued() == 0 and feeds.stats.summary()["round_trip"]["count"] == 1


def test_rtc_requests_carry_the_queued_plan_and_are_served(feeds):
    feed = feeds.make(RtcMode(3, H))
    feed.request_if_due(0, _obs(), np.zeros(A))
    feeds.wait()
    feed.collect(step=0)
    for _ in range(3):
        feed.pop()
    assert feed.request_if_due(3, _obs(), np.zeros(A))
    feeds.wait()
    assert feeds.futures[-1].exception() is None  # the server took the plan
    msg = feed.message(_obs(), RtcMode(3, H).plan(feed.queue, 2, np.zeros(A)))
    assert msg[RTC_PREV_KEY].shape == (3, A) and msg[RTC_FROZEN_KEY] == 2
    assert msg[IMAGE_PREFIX + "wrist"].shape == (32, 32, 3)  # resized to the policy's view
    assert feed.collect(step=3) is None and feed.queued() == H  # the new chunk, from step 3, replaced the plan


def test_an_error_reply_is_returned_and_clears_the_queue(feeds):
    feed = feeds.make(AsyncMode(3, H))
    feed.request_if_due(0, _obs(), np.zeros(A))
    feeds.wait()
    feed.collect(step=0)
    feed.pop(), feed.pop(), feed.pop()
    feed.request_if_due(3, _obs(state_dim=14), np.zeros(A))  # a state the server refuses
    feeds.wait()
    err = feed.collect(step=3)
    assert isinstance(err, ServerError) and "state" in str(err)
    assert feed.queued() == 0 and feeds.stats.summary()["failures"]["count"] == 1
    assert feeds.client.alive()  # an error reply leaves the connection usable


def test_a_lost_connection_is_returned(feeds):
    feed = feeds.make(AsyncMode(3, H))
    feeds.client.close()
    feed.request_if_due(0, _obs(), np.zeros(A))
    feeds.wait()
    err = feed.collect(step=0)
    assert isinstance(err, ConnectionError) and "127.0.0.1" in str(err)
