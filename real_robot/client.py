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
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import cv2
import numpy as np
import torch

from embodied.latency import ActionQueue, LatencyStats, augment_state, chunk_start, max_delay_of, wants_chunk
from real_robot.policy_client import PolicyClient, ServerError
from real_robot.rate import FixedRate
from real_robot.robots.base import Observation, Robot
from real_robot.safety import SafetyFilter, UnsafeState
from real_robot.spec import IMAGE_PREFIX, PROMPT_KEY, RTC_FROZEN_KEY, RTC_PREV_KEY, STATE_KEY, PolicySpec

CLIENT_MODES = ("sync", "async", "rtc", "aware")
#: episode end reasons after which the robot is held and disconnected (motors stopped)
STOP_REASONS = ("watchdog", "estop", "unsafe_state", "server_lost")

log = logging.getLogger(__name__)


class DeployError(RuntimeError):
    """The policy and the robot do not fit together (refused at connect)."""


class Watchdog:
    """``ok`` -> ``hold`` after ``hold_timeout`` s without a fresh action -> ``stop`` after ``stop_timeout``."""

    def __init__(self, hold_timeout: float, stop_timeout: float, clock: Callable[[], float] = time.perf_counter):
        if not 0 < hold_timeout <= stop_timeout:
            raise ValueError("need 0 < hold_timeout <= stop_timeout")
        self.hold_timeout, self.stop_timeout, self.clock = hold_timeout, stop_timeout, clock
        self.last_fresh = clock()

    def fresh(self) -> None:
        self.last_fresh = self.clock()

    def state(self) -> str:
        idle = self.clock() - self.last_fresh
        return "stop" if idle > self.stop_timeout else "hold" if idle > self.hold_timeout else "ok"


@dataclass
class DeployConfig:
    mode: str = "async"  # sync | async | rtc
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
    reason: str  # success | max_steps | watchdog | camera_stalled | estop | unsafe_state | server_lost
    held_steps: int  # steps without a queued action (the robot held still)
    starved_steps: int  # of those, steps after hold_timeout_s without any fresh action (the watchdog's hold)
    safety_counts: dict[str, int]
    latency: dict[str, Any]
    server_hold_s: float = 0.0  # seconds the robot held while the policy server was away
    reconnects: int = 0  # times the client got the server back during this episode
    states: list[np.ndarray] = field(default_factory=list, repr=False)
    actions: list[np.ndarray] = field(default_factory=list, repr=False)
    images: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)


def aware_max_delay(policy: PolicySpec, robot: Robot) -> int | None:
    """The latency-aware policy's largest delay (its state = robot state + max_delay * A + 1), or None."""
    return max_delay_of(policy.state_dim, robot.spec.state_dim, robot.spec.action_dim)


def check_compatible(policy: PolicySpec, robot: Robot, mode: str = "async") -> None:
    """Refuse a policy whose action space, control rate or cameras do not fit the robot."""
    r = robot.spec
    problems = []
    if policy.action_dim != r.action_dim:
        problems.append(f"the policy outputs {policy.action_dim}-D actions, the robot takes {r.action_dim}-D "
                        f"({r.action_mode})")
    if abs(policy.control_hz - r.control_hz) > 1e-6:
        problems.append(f"the policy was trained at {policy.control_hz} Hz, the robot runs at {r.control_hz} Hz")
    if policy.state_obs != "proprio":
        problems.append(f"the policy reads simulator-only object state (state_obs={policy.state_obs!r}), which a "
                        "real robot does not give: deploy a policy trained with state_obs=proprio")
    missing = [c for c in policy.cameras if c not in r.cameras]
    if missing:
        problems.append(f"the policy needs cameras {list(policy.cameras)}, the robot has {sorted(r.cameras)}")
    if mode == "aware":
        if aware_max_delay(policy, robot) is None:
            problems.append(f"mode aware needs a policy trained with latency-aware RL (state of {r.state_dim} + "
                            f"max_delay * {r.action_dim} + 1 dims); this one reads {policy.state_dim}")
    elif policy.state_dim != r.state_dim:
        problems.append(f"the policy reads a {policy.state_dim}-D state, the robot gives {r.state_dim}-D"
                        + (" (a latency-aware policy: use mode=aware)" if aware_max_delay(policy, robot) else ""))
    if problems:
        raise DeployError("policy and robot do not fit: " + "; ".join(problems))


@dataclass
class _Outage:
    """The policy server is away since ``since`` (perf_counter); ``reconnect`` runs in the request thread."""

    since: float
    reconnect: Future


@dataclass
class _HoldLog:
    """What an episode's outages cost: seconds held and reconnects."""

    started: float
    seconds: float = 0.0
    reconnects: int = 0

    def add(self, outage: _Outage, now: float, reconnected: bool) -> None:
        self.seconds += now - max(outage.since, self.started)
        self.reconnects += reconnected


class Deployer:
    """Runs episodes of ``robot`` driven by the policy behind ``client``."""

    def __init__(self, robot: Robot, client: PolicyClient, cfg: DeployConfig, instruction: str,
                 safety: Optional[SafetyFilter] = None):
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
        h = self.spec.chunk_size
        self.threshold = cfg.threshold if cfg.threshold is not None else h // 2
        if not 0 <= self.threshold < h:
            raise ValueError(f"threshold must be in 0..{h - 1}")
        self.stats = LatencyStats()
        self.last_error: Optional[str] = None
        self._outage: Optional[_Outage] = None  # outlives an episode that ends while reconnecting
        self._estop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-request")

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
    def _request(self, obs: Observation, prev: Optional[np.ndarray], frozen: int,
                 committed: Optional[np.ndarray] = None) -> tuple[np.ndarray, float]:
        size = self.spec.image_size
        state = obs.state.astype(np.float32)
        if committed is not None:  # latency-aware: the actions that run meanwhile, and d
            state = augment_state(torch.from_numpy(state)[None], torch.from_numpy(committed)[None],
                                  torch.tensor([frozen]), self.max_delay)[0].numpy()
        msg: dict[str, Any] = {STATE_KEY: state, PROMPT_KEY: self.instruction}
        for cam in self.spec.cameras:
            img = obs.images[cam]
            if img.shape[:2] != (size, size):
                img = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
            msg[IMAGE_PREFIX + cam] = np.ascontiguousarray(img)
        if prev is not None and committed is None:
            msg[RTC_PREV_KEY] = prev.astype(np.float32)
            msg[RTC_FROZEN_KEY] = int(frozen)
        start = time.perf_counter()
        chunk, _ = self.client.infer(msg, timeout=self.cfg.request_timeout_s)
        return chunk, time.perf_counter() - start

    def run_episode(self, on_step: Optional[Callable[[int, Observation, np.ndarray], None]] = None,
                    record: bool = True) -> EpisodeResult:
        """One episode; ``on_step(step, obs, action)`` sees each period's action (the hold while the
        server is away, which is recorded but not sent)."""
        cfg, robot = self.cfg, self.robot
        if self.estopped:
            raise DeployError("the emergency stop is engaged: call reset_estop() after checking the robot")
        a_dim = self.spec.action_dim
        queue = ActionQueue(1, a_dim, merge="replace")
        watchdog = Watchdog(cfg.hold_timeout_s, cfg.stop_timeout_s)
        rate = FixedRate(self.hz)
        inflight: Optional[tuple[Future, int]] = None
        req_delay = 0
        measured = 1  # d in control steps: the p95 round trip, updated when one completes
        starved = 0
        counts_before = dict(self.safety.counts)
        held = 0
        holds = _HoldLog(time.perf_counter())
        reason, success = "max_steps", False
        last_frames: dict[str, tuple[int, float]] = {}
        states, actions, images = [], [], []
        step = 0
        for step in range(cfg.max_steps):
            if self.estopped:
                reason = "estop"
                break
            obs = robot.observe()
            try:  # the state is checked first: a bad reading is never turned into a command
                hold_action = self.safety.hold(obs.state)
            except UnsafeState as err:
                reason, self.last_error = "unsafe_state", f"unsafe robot state: {err.reason}"
                break
            now = time.perf_counter()
            stalled = self._stalled_camera(obs, last_frames, now)
            if stalled:
                reason = f"camera_stalled:{stalled}"
                break
            if cfg.stop_on_success and obs.success:
                reason, success = "success", True
                break
            lost = False
            # a finished request: queue its chunk (not one that raced a lost connection)
            if inflight is not None and inflight[0].done():
                fut, req_step = inflight
                inflight = None
                try:
                    chunk, seconds = fut.result()
                    self.stats.record("round_trip", seconds)
                    measured = self.stats.delay(self.hz, "round_trip")
                    # sync: the robot waited for this chunk, it starts now
                    start = chunk_start(cfg.mode, req_step, step - req_step if cfg.mode == "sync" else req_delay)
                    if self._outage is None:
                        queue.push(torch.from_numpy(np.array(chunk, np.float32))[None], start)
                except (ConnectionError, ServerError, TimeoutError) as err:
                    self.stats.record("failures", 1.0)
                    queue.clear()  # hold from this period on: never act on a plan nobody refreshes
                    self.last_error = f"{type(err).__name__}: {err}"
                    lost = not isinstance(err, ServerError)  # an error reply leaves the connection usable
            if self._outage is None and (lost or not self.client.alive()):
                self._begin_outage(queue)
            if self._outage is not None and self._reconnect_failed(holds, watchdog):
                reason = "server_lost"
                break
            away = self._outage is not None
            d_plan = min(measured, self.max_delay) if cfg.mode == "aware" else measured
            want = wants_chunk(cfg.mode, int(queue.remaining()[0]), d_plan, self.threshold)
            if want and inflight is None and not away and self.client.alive():
                prev, frozen, committed = None, 0, None
                if cfg.mode == "rtc":
                    acts, ok = queue.peek(self.spec.chunk_size)
                    prev = acts[0, :int(ok[0].sum())].numpy()
                    frozen = min(measured, max(len(prev), 0), self.spec.chunk_size - 1)
                elif cfg.mode == "aware":
                    frozen = d_plan
                    acts, ok = queue.peek(max(self.max_delay, 1))
                    committed = np.where(ok[0, :, None].numpy(), acts[0].numpy(),
                                         hold_action[None]).astype(np.float32)
                req_delay = frozen
                inflight = (self._pool.submit(self._request, obs, prev, frozen, committed), step)
            action, ok, _ = queue.pop()
            if bool(ok[0]):
                watchdog.fresh()  # an action planned for this very step: fresh
            else:
                state = watchdog.state()
                if state == "stop" and not away:  # while away the robot already holds; the reconnect is bounded
                    reason = "watchdog"
                    break
                starved += state != "ok"
            if bool(ok[0]):
                wanted = action[0].numpy().astype(np.float64)
            else:
                wanted = hold_action
                held += 1
            if away:
                sent = hold_action.astype(np.float64)  # recorded, not sent: the robot holds since the loss
            else:
                try:
                    sent = self.safety.filter(wanted, obs.state)
                except UnsafeState as err:
                    reason, self.last_error = "unsafe_state", f"unsafe robot state: {err.reason}"
                    break
                robot.send_action(sent)
            if record:
                states.append(obs.state.copy())
                actions.append(sent.astype(np.float32))
                images.append({c: obs.images[c] for c in robot.spec.cameras})
            if on_step is not None:
                on_step(step, obs, sent)
            rate.wait()
        if self._outage is not None:  # still away: this episode's share of the hold
            holds.add(self._outage, time.perf_counter(), reconnected=False)
        if reason in STOP_REASONS or reason.startswith("camera_stalled"):
            robot.hold()
            robot.disconnect()  # motors stopped cleanly; a new episode needs connect()
        elif reason == "max_steps":
            robot.hold()
        return EpisodeResult(steps=step + 1 if reason == "max_steps" else step, success=success, reason=reason,
                             held_steps=held, starved_steps=starved,
                             safety_counts={k: v - counts_before.get(k, 0) for k, v in self.safety.counts.items()
                                            if v - counts_before.get(k, 0)},
                             latency=self.stats.summary(), server_hold_s=holds.seconds, reconnects=holds.reconnects,
                             states=states, actions=actions, images=images)

    # ------------------------------------------------------------------ a lost server
    def _begin_outage(self, queue: ActionQueue) -> None:
        """Hold the robot and start reconnecting in the request thread (after any request still there)."""
        queue.clear()  # never act on a plan nobody refreshes
        self.robot.hold()
        self.last_error = f"lost the policy server at {self.client.uri}; holding the robot while reconnecting"
        log.warning("%s", self.last_error)
        self._outage = _Outage(time.perf_counter(), self._pool.submit(self.client.reconnect))

    def _reconnect_failed(self, holds: _HoldLog, watchdog: Watchdog) -> bool:
        """Whether the client gave up; once the server is back the outage ends and is counted."""
        outage = self._outage
        if outage is None or not outage.reconnect.done():
            return False
        self._outage = None
        try:
            outage.reconnect.result()
        except Exception as err:  # noqa: BLE001 - whatever stopped the reconnect, the robot stops
            holds.add(outage, time.perf_counter(), reconnected=False)
            self.last_error = f"{type(err).__name__}: {err}"
            log.error("stopping the robot: %s", self.last_error)
            return True
        holds.add(outage, time.perf_counter(), reconnected=True)
        watchdog.fresh()  # the new connection gets the full hold/stop window for its first chunk
        log.info("the policy server at %s is back after %.2f s; resuming", self.client.uri,
                 time.perf_counter() - outage.since)
        return False

    def _stalled_camera(self, obs: Observation, last: dict[str, tuple[int, float]], now: float) -> Optional[str]:
        for cam, fid in obs.frame_ids.items():
            prev = last.get(cam)
            if prev is None or prev[0] != fid:
                last[cam] = (fid, now)
            elif now - prev[1] > self.cfg.stall_timeout_s:
                return cam
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
