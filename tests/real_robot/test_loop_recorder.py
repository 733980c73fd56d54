"""The episode recorder (real_robot/loop/recorder.py): what each period saw and sent."""

from __future__ import annotations

import numpy as np

from real_robot.loop import EpisodeRecorder
from real_robot.robots.base import Observation


def _obs(i: int) -> Observation:
    images = {c: np.full((4, 4, 3), i, np.uint8) for c in ("agentview", "wrist", "extra")}
    return Observation(np.full(15, i, np.float32), images, {c: i for c in images}, float(i))


def test_it_keeps_states_sent_actions_and_the_robots_cameras():
    rec = EpisodeRecorder(("agentview", "wrist"))
    obs = _obs(1)
    rec.add(obs, np.ones(7))
    obs.state[:] = 9  # the robot may reuse its buffers: the recording keeps a copy
    rec.add(_obs(2), np.zeros(7, np.float64))
    assert [s[0] for s in rec.states] == [1, 2]
    assert all(a.dtype == np.float32 and a.shape == (7,) for a in rec.actions)
    assert [sorted(im) for im in rec.images] == [["agentview", "wrist"]] * 2


def test_a_disabled_recorder_keeps_nothing():
    rec = EpisodeRecorder(("agentview",), enabled=False)
    rec.add(_obs(1), np.ones(7))
    assert rec.states == rec.actions == rec.images == []
