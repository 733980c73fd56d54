"""The robot client: a fixed-rate control loop between a robot and the policy server.

Every control period: read the robot, check its state (an implausible one stops the robot) and
the cameras, take the action of this step from the action queue
(:class:`embodied.latency.ActionQueue`, indexed by control step) or hold still, pass it through
the :class:`~real_robot.safety.SafetyFilter`, send it. Chunks are requested in a background
thread so the loop keeps its rate while the server thinks:

- ``sync``: ask when the queue is empty; the robot holds still until the chunk arrives;
- ``async``: ask when ``threshold`` actions are left; the chunk is planned from the observation
  of the request step; on arrival its actions for steps already past are dropped;
- ``rtc``: as async, and the request carries the queued plan so the server inpaints the new
  chunk onto it (its first d actions, d measured from the round-trip times, are the queued ones);
- ``aware``: a policy trained with latency-aware RL (``embodied-train latency_delays=[...]``):
  ask when d actions are left, send the state augmented with those committed actions and d; the
  chunk starts d steps after the request and runs in full.

Faults: a lost server (connection closed, a request failed or timed out) clears the queue and
the robot holds (:meth:`Robot.hold`, then no motion command) while :meth:`PolicyClient.reconnect`
retries in the background with bounded backoff; the watchdog's stop waits meanwhile (the robot
already holds), the episode goes on once the server is back and ends with reason ``server_lost``
(hold, disconnect) when the client gives up; the result counts the reconnects and the seconds
held (``server_hold_s``). Without an action queued for the current step the robot holds at
once; the :class:`Watchdog` counts the periods without any fresh action for over
``hold_timeout_s`` (``starved_steps``) and stops the robot (motors off, disconnected) when that
lasts ``stop_timeout_s``; a camera whose frames stop changing for ``stall_timeout_s`` stops the
episode; the emergency stop (SIGUSR1, the keyboard's ``e`` + Enter, or
:meth:`Deployer.emergency_stop`) holds and disconnects, and only :meth:`Deployer.reset_estop`
leaves it; an implausible robot state (NaN/inf, a joint or the tool far outside its limits: see
:meth:`~real_robot.safety.SafetyFilter.check_state`) is never turned into a command: the episode
ends at once with reason ``unsafe_state`` and the robot takes the emergency-stop path (hold,
disconnect). Episodes are recorded in the demonstration dataset format.

:meth:`Deployer.run_episode` composes the pieces of :mod:`real_robot.loop`, each testable alone:
the safety gate, the watchdog, the camera monitor, a :class:`~real_robot.loop.modes.LatencyMode`
per mode behind the chunk feed, the server-outage hold; episodes end with an :class:`ExitReason`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from embodied.latency import LatencyStats, max_delay_of
from real_robot.loop import (
    CLIENT_MODES,
    CameraMonitor,
    ChunkFeed,
    Ending,
    EpisodeRecorder,
    ExitReason,
    SafetyGate,
    ServerOutage,
    ServerStatus,
    Watchdog,
    WatchdogState,
    make_mode,
)
from real_robot.policy_client import PolicyClient, ServerError
from real_robot.rate import FixedRate
from real_robot.robots.base import Observation, Robot
from real_robot.safety import SafetyFilter, UnsafeState
from real_robot.spec import PolicySpec

__all__ = [
    "CLIENT_MODES",
    "STOP_REASONS",
    "DeployConfig",
    "DeployError",
    "Deployer",
    "EpisodeResult",
    "ExitReason",
    "Watchdog",
    "aware_max_delay",
    "check_compatible",
]

#: episode end reasons after which the robot is held and disconnected (motors stopped)
STOP_REASONS = tuple(r for r in ExitReason if r.stops_robot)

OnStep = Callable[[int, Observation, np.ndarray], None]


class DeployError(RuntimeError):
    """The policy and the robot do not fit together (refused at connect)."""


@dataclass
class DeployConfig:
    mode: str = "async"  # sync | async | rtc | aware
    threshold: Optional[int] = None  # async/rtc: ask at <= this many queued actions (default H/2)
    max_steps: int = 300  # control steps per episode
    hold_timeout_s: float = 0.25  # no fresh action this long: counted as starved (the robot already holds)
    stop_timeout_s: float = 1.0  # ... this long: stop the robot and disconnect
    stall_timeout_s: float = 0.5  # a camera frame unchanged this long: stalled
    request_timeout_s: float = 5.0
    stop_on_success: bool = True  # simulated robots report success


@dataclass
class EpisodeResult:
    steps: int
    success: bool
    exit: ExitReason  # why the episode ended; ``reason`` adds the stalled camera
    held_steps: int  # steps without a queued action (the robot held still)
    starved_steps: int  # of those, steps after hold_timeout_s without any fresh action (the watchdog's hold)
    safety_counts: dict[str, int]
    latency: dict[str, Any]
    server_hold_s: float = 0.0  # seconds the robot held while the policy server was away
    reconnects: int = 0  # times the client got the server back during this episode
    stalled_camera: Optional[str] = None  # exit CAMERA_STALLED: which camera
    states: list[np.ndarray] = field(default_factory=list, repr=False)
    actions: list[np.ndarray] = field(default_factory=list, repr=False)
    images: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)

    @property
    def reason(self) -> str:
        """The :class:`ExitReason` (a ``str``: ``success``, ``max_steps``, ``watchdog``, ``estop``,
        ``unsafe_state``, ``server_lost``), or ``camera_stalled:<camera>``."""
        return Ending(self.exit, self.stalled_camera).reason


def aware_max_delay(policy: PolicySpec, robot: Robot) -> int | None:
    """The latency-aware policy's largest delay (its state = robot state + max_delay * A + 1), or None."""
    return max_delay_of(policy.state_dim, robot.spec.state_dim, robot.spec.action_dim)


def check_compatible(policy: PolicySpec, robot: Robot, mode: str = "async") -> None:
    """Refuse a policy whose action space, control rate or cameras do not fit the robot."""
    r = robot.spec
    problems = []
    if policy.action_dim != r.action_dim:
        problems.append(
            f"the policy outputs {policy.action_dim}-D actions, the robot takes {r.action_dim}-D ({r.action_mode})"
        )
    if abs(policy.control_hz - r.control_hz) > 1e-6:
        problems.append(f"the policy was trained at {policy.control_hz} Hz, the robot runs at {r.control_hz} Hz")
    if policy.state_obs != "proprio":
        problems.append(
            f"the policy reads simulator-only object state (state_obs={policy.state_obs!r}), which a "
            "real robot does not give: deploy a policy trained with state_obs=proprio"
        )
    missing = [c for c in policy.cameras if c not in r.cameras]
    if missing:
        problems.append(f"the policy needs cameras {list(policy.cameras)}, the robot has {sorted(r.cameras)}")
    if mode == "aware":
        if aware_max_delay(policy, robot) is None:
            problems.append(
                f"mode aware needs a policy trained with latency-aware RL (state of {r.state_dim} + "
                f"max_delay * {r.action_dim} + 1 dims); this one reads {policy.state_dim}"
            )
    elif policy.state_dim != r.state_dim:
        problems.append(
            f"the policy reads a {policy.state_dim}-D state, the robot gives {r.state_dim}-D"
            + (" (a latency-aware policy: use mode=aware)" if aware_max_delay(policy, robot) else "")
        )
    if problems:
        raise DeployError("policy and robot do not fit: " + "; ".join(problems))


@dataclass
class _Episode:
    """The pieces one episode runs with, and its counters."""

    gate: SafetyGate
    feed: ChunkFeed
    watchdog: Watchdog
    cameras: CameraMonitor
    recorder: EpisodeRecorder
    on_step: Optional[OnStep]
    held: int = 0
    starved: int = 0


class Deployer:
    """Runs episodes of ``robot`` driven by the policy behind ``client``."""

    def __init__(
        self,
        robot: Robot,
        client: PolicyClient,
        cfg: DeployConfig,
        instruction: str,
        safety: Optional[SafetyFilter] = None,
    ):
        if cfg.mode not in CLIENT_MODES:
            raise ValueError(f"mode must be one of {CLIENT_MODES}, got {cfg.mode!r}")
        self.robot, self.client, self.cfg, self.instruction = robot, client, cfg, instruction
        self.spec = client.connect() if not client.metadata else PolicySpec.from_metadata(client.metadata)
        check_compatible(self.spec, robot, cfg.mode)
        self.max_delay = aware_max_delay(self.spec, robot) if cfg.mode == "aware" else None
        if cfg.mode == "rtc" and self.spec.family != "flow":
            raise DeployError(f"mode rtc needs a flow policy; the server runs {self.spec.family} (use async)")
        self.safety = safety or SafetyFilter(robot.spec)
        self.hz = robot.spec.control_hz
        self.threshold = cfg.threshold if cfg.threshold is not None else self.spec.chunk_size // 2
        self.mode = make_mode(cfg.mode, self.threshold, self.spec.chunk_size, self.max_delay)
        self.stats = LatencyStats()
        self.last_error: Optional[str] = None
        self._estop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-request")
        self.outage = ServerOutage(client, self._pool.submit)

    @property
    def _outage(self) -> Optional[ServerOutage]:
        """The outage under way, or None (tests watch it from the robot's side)."""
        return self.outage if self.outage.away else None

    # ------------------------------------------------------------------ emergency stop
    def emergency_stop(self) -> None:
        self._estop.set()

    def reset_estop(self) -> None:
        self._estop.clear()

    @property
    def estopped(self) -> bool:
        return self._estop.is_set()

    def install_signal_handler(self) -> None:
        import signal

        signal.signal(signal.SIGUSR1, lambda *_: self.emergency_stop())

    def watch_keyboard(self) -> None:
        """``e`` + Enter on stdin triggers the emergency stop (a daemon thread)."""
        import sys

        def run() -> None:
            for line in sys.stdin:
                if line.strip().lower() in ("e", "estop", "stop"):
                    self.emergency_stop()

        threading.Thread(target=run, name="estop-keyboard", daemon=True).start()

    # ------------------------------------------------------------------ one episode
    def run_episode(self, on_step: Optional[OnStep] = None, record: bool = True) -> EpisodeResult:
        """One episode; ``on_step(step, obs, action)`` sees each period's action (the hold while the
        server is away, which is recorded but not sent)."""
        if self.estopped:
            raise DeployError("the emergency stop is engaged: call reset_estop() after checking the robot")
        ep = self._start_episode(on_step, record)
        rate = FixedRate(self.hz)
        ending: Optional[Ending] = None
        step = 0
        for step in range(self.cfg.max_steps):
            try:
                ending = self._control_period(step, ep)
            except UnsafeState as err:  # the gate refused the state: nothing made of it was sent
                ending = Ending(ExitReason.UNSAFE_STATE, error=f"unsafe robot state: {err.reason}")
            if ending is not None:
                break
            rate.wait()
        return self._finish(ep, ending or Ending(ExitReason.MAX_STEPS), step)

    def _start_episode(self, on_step: Optional[OnStep], record: bool) -> _Episode:
        cfg = self.cfg
        self.outage.start_episode()
        feed = ChunkFeed(
            self.mode,
            self.client,
            self.spec,
            self.instruction,
            self._pool.submit,
            self.stats,
            self.hz,
            cfg.request_timeout_s,
        )
        return _Episode(
            gate=SafetyGate(self.safety, self.robot),
            feed=feed,
            watchdog=Watchdog(cfg.hold_timeout_s, cfg.stop_timeout_s),
            cameras=CameraMonitor(cfg.stall_timeout_s),
            recorder=EpisodeRecorder(self.robot.spec.cameras, enabled=record),
            on_step=on_step,
        )

    def _control_period(self, step: int, ep: _Episode) -> Optional[Ending]:
        """Read, check, act for one control period; the :class:`Ending` if the episode ends in it.
        Raises :class:`UnsafeState` (before anything is sent) on an implausible robot state."""
        if self.estopped:
            return Ending(ExitReason.ESTOP)
        obs = self.robot.observe()
        hold = ep.gate.hold_action(obs.state)  # the state first: a bad reading is never turned into a command
        stalled = ep.cameras.stalled(obs.frame_ids)
        if stalled is not None:
            return Ending(ExitReason.CAMERA_STALLED, camera=stalled)
        if self.cfg.stop_on_success and obs.success:
            return Ending(ExitReason.SUCCESS)
        lost = self._tend_server(step, ep)
        if lost is not None:
            return lost
        away = self.outage.away
        if not away and self.client.alive():
            ep.feed.request_if_due(step, obs, hold)
        planned = ep.feed.pop()
        watch = ep.watchdog.check(fresh=planned is not None)
        if watch is WatchdogState.STOP and not away:  # while away the robot already holds; the reconnect is bounded
            return Ending(ExitReason.WATCHDOG)
        ep.starved += watch is not WatchdogState.OK
        ep.held += planned is None
        if away:
            sent = hold.astype(np.float64)  # recorded, not sent: the robot holds since the loss
        else:
            sent = ep.gate.send(hold if planned is None else planned, obs.state)
        ep.recorder.add(obs, sent)
        if ep.on_step is not None:
            ep.on_step(step, obs, sent)
        return None

    def _tend_server(self, step: int, ep: _Episode) -> Optional[Ending]:
        """Queue a chunk that arrived, notice a lost server (the robot holds, the client reconnects) and
        follow the reconnect; ``server_lost`` once the client gives up."""
        failure = ep.feed.collect(step, accept=not self.outage.away)  # never a chunk that raced a lost connection
        if failure is not None:
            self.last_error = f"{type(failure).__name__}: {failure}"
        lost = failure is not None and not isinstance(failure, ServerError)  # an error reply leaves it usable
        if not self.outage.away and (lost or not self.client.alive()):
            ep.feed.clear()  # never act on a plan nobody refreshes
            self.last_error = self.outage.begin(self.robot)
        status = self.outage.poll()
        if status is ServerStatus.BACK:
            ep.watchdog.fresh()  # the new connection gets the full hold/stop window for its first chunk
        elif status is ServerStatus.GONE:
            return Ending(ExitReason.SERVER_LOST, error=self.outage.error)
        return None

    def _finish(self, ep: _Episode, ending: Ending, step: int) -> EpisodeResult:
        """Stop the robot as ``ending`` requires and report the episode."""
        holds = self.outage.end_episode()
        if ending.error is not None:
            self.last_error = ending.error
        if ending.exit.stops_robot:
            self.robot.hold()
            self.robot.disconnect()  # motors stopped cleanly; a new episode needs connect()
        elif ending.exit is ExitReason.MAX_STEPS:
            self.robot.hold()
        rec = ep.recorder
        return EpisodeResult(
            steps=step + 1 if ending.exit is ExitReason.MAX_STEPS else step,
            success=ending.exit is ExitReason.SUCCESS,
            exit=ending.exit,
            held_steps=ep.held,
            starved_steps=ep.starved,
            safety_counts=ep.gate.counts(),
            latency=self.stats.summary(),
            server_hold_s=holds.seconds,
            reconnects=holds.reconnects,
            stalled_camera=ending.camera,
            states=rec.states,
            actions=rec.actions,
            images=rec.images,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
