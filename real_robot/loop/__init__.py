"""The pieces of the robot client's control loop (:class:`real_robot.client.Deployer` composes them).

- :mod:`~real_robot.loop.exits`: why an episode ended (:class:`ExitReason`, :class:`Ending`);
- :mod:`~real_robot.loop.safety_gate`: every state checked, every command filtered before it is sent;
- :mod:`~real_robot.loop.watchdog`: ``ok`` -> ``hold`` -> ``stop`` without fresh actions;
- :mod:`~real_robot.loop.cameras`: a camera whose frames stop changing;
- :mod:`~real_robot.loop.modes`: when to ask for a chunk and where it starts, one class per latency mode;
- :mod:`~real_robot.loop.feed`: the action queue, fed by requests in a background thread;
- :mod:`~real_robot.loop.outage`: the robot holds while the client reconnects to a lost server;
- :mod:`~real_robot.loop.recorder`: what each period saw and sent, for the dataset.
"""

from real_robot.loop.cameras import CameraMonitor
from real_robot.loop.exits import Ending, ExitReason
from real_robot.loop.feed import ChunkFeed
from real_robot.loop.modes import (
    CLIENT_MODES,
    AsyncMode,
    AwareMode,
    ChunkPlan,
    LatencyMode,
    RtcMode,
    SyncMode,
    make_mode,
)
from real_robot.loop.outage import HoldLog, ServerOutage, ServerStatus
from real_robot.loop.recorder import EpisodeRecorder
from real_robot.loop.safety_gate import SafetyGate
from real_robot.loop.watchdog import Watchdog, WatchdogState

__all__ = [
    "CLIENT_MODES",
    "AsyncMode",
    "AwareMode",
    "CameraMonitor",
    "ChunkFeed",
    "ChunkPlan",
    "Ending",
    "EpisodeRecorder",
    "ExitReason",
    "HoldLog",
    "LatencyMode",
    "RtcMode",
    "SafetyGate",
    "ServerOutage",
    "ServerStatus",
    "SyncMode",
    "Watchdog",
    "WatchdogState",
    "make_mode",
]
