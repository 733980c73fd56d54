"""The latency modes (real_robot/loop/modes.py): when each asks for a chunk, what the request
carries, and where the chunk starts; on a real ActionQueue, no server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.latency import ActionQueue
from real_robot.loop import AsyncMode, AwareMode, ChunkPlan, RtcMode, SyncMode, make_mode
from real_robot.spec import RTC_FROZEN_KEY, RTC_PREV_KEY, STATE_KEY

H, A = 6, 7


def _queue(queued: int) -> ActionQueue:
    """A queue holding ``queued`` actions (action i is all i + 1) for the steps from now on."""
    q = ActionQueue(1, A)
    if queued:
        q.push(torch.arange(1, queued + 1, dtype=torch.float32)[None, :, None].expand(1, queued, A), start=0)
    return q


def test_make_mode_names_and_refusals():
    assert [type(make_mode(m, 3, H, 2)) for m in ("sync", "async", "rtc", "aware")] == [
        SyncMode,
        AsyncMode,
        RtcMode,
        AwareMode,
    ]
    with pytest.raises(ValueError, match="mode must be one of"):
        make_mode("fast", 3, H)
    with pytest.raises(ValueError, match="mode aware needs max_delay"):
        make_mode("aware", 3, H)
    with pytest.raises(ValueError, match=r"threshold must be in 0..5"):
        make_mode("async", H, H)


@pytest.mark.parametrize(
    "mode, queued, measured, wants",
    [
        ("sync", 0, 3, True),
        ("sync", 1, 3, False),
        ("async", 3, 1, True),
        ("async", 4, 1, False),  # threshold 3
        ("rtc", 3, 5, True),
        ("rtc", 4, 5, False),
        ("aware", 2, 5, True),
        ("aware", 3, 5, False),  # d = min(measured, max_delay 2)
        ("aware", 1, 1, True),
        ("aware", 2, 1, False),
    ],
)
def test_when_each_mode_asks(mode, queued, measured, wants):
    assert make_mode(mode, 3, H, max_delay=2).wants_chunk(queued, measured) is wants


def test_where_each_mode_starts_its_chunk():
    plan = ChunkPlan(delay=2)
    assert SyncMode(3, H).chunk_start(10, ChunkPlan(), arrival_step=14) == 14  # the robot waited
    assert AsyncMode(3, H).chunk_start(10, ChunkPlan(), arrival_step=14) == 10  # stale actions dropped
    assert RtcMode(3, H).chunk_start(10, plan, arrival_step=14) == 10
    assert AwareMode(3, H, max_delay=2).chunk_start(10, plan, arrival_step=14) == 12  # planned d ahead


def test_sync_and_async_send_only_the_state():
    state = np.zeros(15, np.float32)
    for mode in (SyncMode(3, H), AsyncMode(3, H)):
        plan = mode.plan(_queue(2), 2, np.zeros(A))
        assert plan == ChunkPlan() and mode.request_fields(state, plan).keys() == {STATE_KEY}


@pytest.mark.parametrize("queued, measured, frozen", [(4, 2, 2), (4, 9, 4), (0, 3, 0), (6, 9, H - 1)])
def test_rtc_sends_the_queued_plan_with_d_frozen(queued, measured, frozen):
    mode = RtcMode(3, H)
    plan = mode.plan(_queue(queued), measured, np.zeros(A))
    assert plan.prev.shape == (queued, A) and plan.delay == frozen
    np.testing.assert_array_equal(plan.prev[:, 0], np.arange(1, queued + 1))
    fields = mode.request_fields(np.zeros(15, np.float32), plan)
    assert fields[RTC_PREV_KEY].dtype == np.float32 and fields[RTC_FROZEN_KEY] == frozen
    assert type(fields[RTC_FROZEN_KEY]) is int


def test_aware_commits_the_queued_actions_and_holds_after_them():
    mode = AwareMode(3, H, max_delay=2)
    hold = np.full(A, -0.5)
    plan = mode.plan(_queue(1), measured=4, hold=hold)
    assert plan.delay == 2 and plan.committed.shape == (2, A) and plan.committed.dtype == np.float32
    np.testing.assert_array_equal(plan.committed[0], np.ones(A))  # the queued action
    np.testing.assert_array_equal(plan.committed[1], hold)  # nothing queued: the robot would hold
    wide = mode.request_fields(np.zeros(15, np.float32), plan)[STATE_KEY]
    assert wide.shape == (15 + 2 * A + 1,) and wide[-1] == 1.0  # d / max_delay
    np.testing.assert_array_equal(wide[15 : 15 + A], np.ones(A))
