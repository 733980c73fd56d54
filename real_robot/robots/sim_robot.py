"""``SimRobot``: a MuJoCo suite scene behind the :class:`Robot` contract (rehearsal and test double).

With ``realtime=True`` the scene advances on its own clock in a thread at the control rate, as
hardware does: each tick executes the command received since the last tick (each command runs
once) or holds still when none came. ``realtime=False`` steps once per :meth:`send_action`
(deterministic, for tests). Injected imperfections:

- ``obs_latency_steps``: observations are that many control steps old;
- ``action_delay_steps``: a command takes effect that many ticks after it was sent;
- ``camera_noise_std`` / ``color_shift``: Gaussian pixel noise and a per-episode colour cast;
- ``mass_scale`` / ``friction_scale`` / ``damping_scale``: dynamics changes of the whole scene;
- ``stall_camera_after``: that camera's frames stop updating after this many ticks (a stalled
  camera, for the client's detector).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from real_robot.rate import FixedRate
from real_robot.robots.base import Observation, Robot, RobotSpec


@dataclass
class SimRobotConfig:
    suite: str = "goal"
    task: int = 8  # task index in the suite
    init_id: int = 0  # the fixed initial state of the first episode
    cameras: tuple[str, ...] = ("agentview", "wrist")
    image_size: int = 64
    realtime: bool = True
    obs_latency_steps: int = 0
    action_delay_steps: int = 0
    camera_noise_std: float = 0.0  # pixel values (0..255)
    color_shift: float = 0.0  # largest per-channel offset (pixel values)
    mass_scale: float = 1.0
    friction_scale: float = 1.0
    damping_scale: float = 1.0
    stall_camera: Optional[str] = None
    stall_camera_after: int = -1  # ticks; -1: never
    seed: int = 0


class SimRobot(Robot):
    def __init__(self, cfg: SimRobotConfig | None = None, **overrides):
        cfg = cfg or SimRobotConfig()
        for k, v in overrides.items():
            setattr(cfg, k, v)
        self.cfg = cfg
        self.env = None
        self.spec = RobotSpec(
            action_mode="ee_delta",
            action_dim=7,
            control_hz=20.0,
            cameras={c: [cfg.image_size, cfg.image_size] for c in cfg.cameras},
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._rng = np.random.default_rng(cfg.seed)
        self._pending: deque[np.ndarray] = deque()
        self._obs: deque[Observation] = deque()
        self.ticks = 0
        self.success = False
        self.connected = False
        self.instruction = ""

    # ------------------------------------------------------------------ lifecycle
    def connect(self) -> None:
        import sims

        if self.connected:
            return
        c = self.cfg
        self.env = sims.make(
            "mujoco", suite=c.suite, num_envs=1, seed=c.seed, cameras=tuple(c.cameras), image_size=c.image_size
        )
        self.spec.control_hz = float(self.env.control_hz)
        self.instruction = self.env.tasks[c.task].instruction
        self._scale_dynamics()
        self.reset(c.init_id)
        self.connected = True
        if c.realtime:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="sim-robot", daemon=True)
            self._thread.start()

    def _scale_dynamics(self) -> None:
        c, sim = self.cfg, self.env.sim
        changed = False
        for name, scale in (
            ("body_mass", c.mass_scale),
            ("geom_friction", c.friction_scale),
            ("dof_damping", c.damping_scale),
        ):
            if scale != 1.0:
                values = sim.expand(name)
                values *= scale
                changed = True
        if changed:
            sim.set_const()

    def reset(self, init_id: int | None = None) -> None:
        """A new episode from a fixed initial state."""
        with self._lock:
            obs = self.env.reset(task_ids=[self.cfg.task], init_ids=[self.cfg.init_id if init_id is None else init_id])
            self._shift = (
                self._rng.uniform(-self.cfg.color_shift, self.cfg.color_shift, 3) if self.cfg.color_shift else 0
            )
            self._pending.clear()
            self._obs.clear()
            self._last_cmd = np.zeros(7)
            self._last_cmd[-1] = -1.0
            self.ticks = 0
            self.success = False
            self._frames = {c: 0 for c in self.cfg.cameras}
            self._stalled: dict[str, np.ndarray] = {}
            self._obs.append(self._observation(obs))

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self.env is not None:
            self.env.close()
            self.env = None
        self.connected = False

    # ------------------------------------------------------------------ the contract
    def observe(self) -> Observation:
        with self._lock:
            return self._obs[0]

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.clip(np.asarray(action, np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (7,) or not np.isfinite(a).all():
            raise ValueError(f"SimRobot takes finite 7-D actions, got {a}")
        with self._lock:
            self._pending.append(a)
        if not self.cfg.realtime:
            self.tick()
        return a

    def hold(self) -> None:
        with self._lock:
            self._pending.clear()

    # ------------------------------------------------------------------ simulation
    def tick(self) -> None:
        """Advance one control step with the command due now (or hold still)."""
        with self._lock:
            due = len(self._pending) > self.cfg.action_delay_steps
            if due:
                cmd = self._pending.popleft()
            else:
                cmd = np.zeros(7)
                cmd[-1] = self._last_cmd[-1]
            self._last_cmd = cmd
            obs, _, _, _, info = self.env.step(torch.as_tensor(cmd[None], dtype=torch.float32))
            self.success = self.success or bool(info["success"][0])
            if bool(info["done"][0]):  # the sim auto-resets; keep showing the final frame
                obs = info["final_obs"]
            self.ticks += 1
            self._obs.append(self._observation(obs))
            while len(self._obs) > self.cfg.obs_latency_steps + 1:
                self._obs.popleft()

    def _run(self) -> None:
        rate = FixedRate(self.spec.control_hz)
        while not self._stop.is_set():
            self.tick()
            rate.wait()

    def _observation(self, obs: dict) -> Observation:
        images = {}
        rgb = obs["rgb"][0].numpy() if "rgb" in obs else None
        for i, cam in enumerate(self.cfg.cameras):
            c = self.cfg
            if c.stall_camera == cam and 0 <= c.stall_camera_after <= self.ticks:
                images[cam] = self._stalled.setdefault(cam, rgb[i].copy())  # frozen from now on
                continue
            img = rgb[i]
            if c.camera_noise_std or c.color_shift:
                noisy = img.astype(np.float32) + self._shift
                if c.camera_noise_std:
                    noisy += self._rng.normal(0, c.camera_noise_std, img.shape)
                img = np.clip(noisy, 0, 255).astype(np.uint8)
            images[cam] = img
            self._frames[cam] += 1
        return Observation(
            state=obs["state"][0].numpy().astype(np.float32),
            images=images,
            frame_ids=dict(self._frames),
            timestamp=time.time(),
            success=self.success,
        )
