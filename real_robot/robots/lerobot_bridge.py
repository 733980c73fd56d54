"""LeRobot's robots (SO-100/101, Koch, OMX, the bimanual SO, ...) served over the network robot
protocol: run with ``.venv-lerobot``'s Python on the machine wired to the arm, then deploy with
``robot=network robot_address=ws://THAT_PC:8765`` (or check it: ``check=true``).

    .venv-lerobot/bin/python -m real_robot.robots.lerobot_bridge --port 8765 \\
        --robot.type=so101_follower --robot.port=/dev/ttyACM0 --robot.id=my_arm \\
        --robot.cameras="{front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}"

The ``--robot.*`` options are LeRobot's own (as ``lerobot-record`` takes them); the others are
:class:`LeRobotBridgeConfig`'s. :class:`LeRobotArm` maps a LeRobot ``Robot`` onto our contract:

- spec: ``joint_pos`` mode; the motors whose name holds ``gripper`` are grippers, the others joints;
  joint limits from the motors' calibrated ranges (LeRobot's degrees mode: the range's middle is
  0 deg); no tool pose (``tcp_index`` None, so no ``ee_delta`` and no workspace box);
- state ``[J + G]``: the joints in rad, then each gripper's opening from 0 (closed) to 1 (open);
- action ``[J + G]`` in ``[-1, 1]``: joint targets ``low + (a + 1) / 2 * (high - low)`` rad, sent to
  LeRobot in degrees; grippers -1 open .. +1 closed onto ``gripper_open`` .. ``gripper_closed`` (its
  0..100 scale); what LeRobot reports as sent (after its own ``max_relative_target`` clip) is mapped
  back and returned;
- ``hold``: every joint's goal set to where it is now, the grippers' goals unchanged.

The arm's joints must read degrees (``use_degrees=true``, the SO arms' default); the module imports
nothing of LeRobot until :func:`main` runs, so the mapping is tested in ``.venv`` too.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, fields, make_dataclass
from typing import Any, Optional

import numpy as np

from real_robot.robots.base import Observation, Robot, RobotSpec

#: LeRobot modules whose import registers robot configs (``--robot.type`` choices)
LEROBOT_ROBOT_MODULES = (
    "so_follower",
    "koch_follower",
    "omx_follower",
    "bi_so_follower",
    "openarm_follower",
    "bi_openarm_follower",
    "rebot_b601_follower",
    "bi_rebot_b601_follower",
)


@dataclass
class LeRobotBridgeConfig:
    """The bridge's own options (``--name value``)."""

    host: str = "0.0.0.0"  # 127.0.0.1 to accept this machine only
    port: int = 8765  # 0: any free port (printed)
    api_key: Optional[str] = None  # required from clients when set (or EMBODIED_API_KEY)
    control_hz: float = 30.0  # the deployment loop's rate; the policy must have been trained at it
    joint_vel_max: float = 1.5  # rad/s, every joint: the safety filter's speed limit
    gripper_open: float = 100.0  # the gripper motor's value (LeRobot's 0..100) when open
    gripper_closed: float = 0.0  # ... and when closed


def _is_degrees(motor: Any) -> bool:
    mode = getattr(motor, "norm_mode", None)
    return str(getattr(mode, "value", mode)) == "degrees"


def _buses(robot: Any) -> list[tuple[str, Any]]:
    """``(motor name prefix, motors bus)`` of a LeRobot robot: its ``bus``, or each arm's of a bimanual one."""
    if hasattr(robot, "bus"):
        return [("", robot.bus)]
    return [
        (f"{side}_", getattr(robot, f"{side}_arm").bus) for side in ("left", "right") if hasattr(robot, f"{side}_arm")
    ]


def calibrated_limits(robot: Any) -> dict[str, tuple[float, float]]:
    """Each degrees-mode motor's position range (deg) from its calibration: LeRobot reads
    ``(raw - mid) * 360 / resolution``, so the calibrated ``range_min..range_max`` is +-half of it."""
    out = {}
    for prefix, bus in _buses(robot):
        for name, motor in bus.motors.items():
            cal = (bus.calibration or {}).get(name)
            if cal is None or not _is_degrees(motor):
                continue
            steps = bus.model_resolution_table[motor.model] - 1
            half = (cal.range_max - cal.range_min) / 2 * 360.0 / steps
            out[prefix + name] = (-half, half)
    return out


class LeRobotArm(Robot):
    """A LeRobot ``Robot`` behind our contract (see the module doc)."""

    def __init__(self, robot: Any, cfg: Optional[LeRobotBridgeConfig] = None, name: Optional[str] = None):
        """``name``: the robot type reported in the spec (default: the config's type, else the class's name)."""
        self.robot, self.cfg = robot, cfg or LeRobotBridgeConfig()
        if self.cfg.gripper_open == self.cfg.gripper_closed:
            raise ValueError("gripper_open and gripper_closed must differ")
        motors = [k.removesuffix(".pos") for k in robot.action_features if k.endswith(".pos")]
        self.joints = [m for m in motors if "gripper" not in m]
        self.grippers = [m for m in motors if "gripper" in m]
        not_degrees = [
            p + n
            for p, bus in _buses(robot)
            for n, m in bus.motors.items()
            if "gripper" not in n and not _is_degrees(m)
        ]
        if not_degrees:
            raise ValueError(
                f"joints {not_degrees} do not read degrees: configure the robot with --robot.use_degrees=true"
            )
        limits = calibrated_limits(robot)
        missing = [m for m in self.joints if m not in limits]
        if missing:
            raise ValueError(f"no calibrated range for joints {missing}: calibrate the arm first (lerobot-calibrate)")
        self.low = np.deg2rad([limits[m][0] for m in self.joints])
        self.high = np.deg2rad([limits[m][1] for m in self.joints])
        cams = {
            k: [int(v[0]), int(v[1])]
            for k, v in robot.observation_features.items()
            if isinstance(v, tuple) and len(v) == 3 and v[2] == 3
        }
        names = [f"{m}.pos" for m in self.joints + self.grippers]
        self.spec = RobotSpec(
            action_mode="joint_pos",
            action_dim=len(motors),
            control_hz=float(self.cfg.control_hz),
            cameras=cams,
            state_dim=len(motors),
            name=name or str(getattr(getattr(robot, "config", None), "type", getattr(robot, "name", "lerobot"))),
            joint_index=0,
            tcp_index=None,
            joint_low=self.low.tolist(),
            joint_high=self.high.tolist(),
            joint_vel_max=[float(self.cfg.joint_vel_max)] * len(self.joints),
            state_names=names,
            action_names=names,
        )
        problems = self.spec.problems()
        if problems:
            raise ValueError(f"LeRobot robot {self.spec.name}: " + "; ".join(problems))
        self._grip_goal: dict[str, float] = {}
        self._frames: dict[str, tuple[int, np.ndarray]] = {}

    # ------------------------------------------------------------------ unit mapping
    def _opening(self, value: float) -> float:
        c = self.cfg
        return (value - c.gripper_closed) / (c.gripper_open - c.gripper_closed)

    def to_lerobot(self, a: np.ndarray) -> dict[str, float]:
        """Our action ``[J + G]`` in ``[-1, 1]`` -> LeRobot's ``{"<motor>.pos": deg or 0..100}``."""
        n, c = len(self.joints), self.cfg
        q = np.rad2deg(self.low + (a[:n] + 1.0) * 0.5 * (self.high - self.low))
        grip = c.gripper_closed + (1.0 - a[n:]) * 0.5 * (c.gripper_open - c.gripper_closed)
        return {f"{m}.pos": float(v) for m, v in zip(self.joints + self.grippers, [*q, *grip])}

    def from_lerobot(self, sent: dict[str, float], asked: dict[str, float]) -> np.ndarray:
        """LeRobot's action dict -> our ``[J + G]`` (a motor it left out counts as ``asked``)."""
        v = np.array([float(sent.get(k, asked[k])) for k in asked])
        n = len(self.joints)
        joints = 2.0 * (np.deg2rad(v[:n]) - self.low) / (self.high - self.low) - 1.0
        grips = 1.0 - 2.0 * np.array([self._opening(x) for x in v[n:]])
        return np.concatenate([joints, grips])

    # ------------------------------------------------------------------ the contract
    def connect(self) -> None:
        if not self.robot.is_connected:
            self.robot.connect(calibrate=False)  # never the interactive calibration here
        if not self.robot.is_calibrated:
            self.robot.disconnect()
            raise RuntimeError(f"{self.spec.name} is not calibrated: run lerobot-calibrate first")

    def observe(self) -> Observation:
        obs = self.robot.get_observation()
        state = [math.radians(float(obs[f"{m}.pos"])) for m in self.joints]
        state += [self._opening(float(obs[f"{m}.pos"])) for m in self.grippers]
        images, ids = {}, {}
        for cam in self.spec.cameras:
            img = np.asarray(obs[cam])
            count, last = self._frames.get(cam, (0, None))
            if last is None or not np.array_equal(img, last):  # the counter moves with new content only
                count += 1
            self._frames[cam] = (count, img)
            images[cam], ids[cam] = img, count
        return Observation(np.asarray(state, np.float32), images, ids, time.time())

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.clip(np.asarray(action, np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (self.spec.action_dim,) or not np.isfinite(a).all():
            raise ValueError(f"{self.spec.name} takes finite {self.spec.action_dim}-D joint actions, got {a}")
        asked = self.to_lerobot(a)
        sent = self.robot.send_action(asked) or asked
        self._grip_goal = {f"{m}.pos": float(sent.get(f"{m}.pos", asked[f"{m}.pos"])) for m in self.grippers}
        return self.from_lerobot(sent, asked)

    def hold(self) -> None:
        if not self.robot.is_connected:
            return
        now = self.robot.get_observation()
        goal = {f"{m}.pos": float(now[f"{m}.pos"]) for m in self.joints}
        goal.update({f"{m}.pos": self._grip_goal.get(f"{m}.pos", float(now[f"{m}.pos"])) for m in self.grippers})
        self.robot.send_action(goal)

    def disconnect(self) -> None:
        if self.robot.is_connected:
            self.robot.disconnect()


def _parse(argv: Optional[list[str]]) -> tuple[LeRobotBridgeConfig, Any, str]:
    import importlib

    import draccus
    from lerobot.robots import RobotConfig

    for module in LEROBOT_ROBOT_MODULES:  # registers their --robot.type choices
        try:
            importlib.import_module(f"lerobot.robots.{module}")
        except ImportError:
            pass
    parser = argparse.ArgumentParser(
        prog="python -m real_robot.robots.lerobot_bridge",
        description="Serve a LeRobot robot over the network robot protocol (real_robot/robots/network.py).",
        epilog="LeRobot's robot options follow as --robot.type=so101_follower --robot.port=... (as lerobot-record).",
    )
    for f in fields(LeRobotBridgeConfig):
        kind = float if f.type in ("float", float) else int if f.type in ("int", int) else str
        parser.add_argument(f"--{f.name}", type=kind, default=f.default)
    ours, rest = parser.parse_known_args(argv)
    kinds = [a.split("=", 1)[1] for a in rest if a.startswith("--robot.type=")]
    if not kinds:
        parser.error(
            f"give --robot.type=TYPE (one of {sorted(RobotConfig.get_known_choices())}) and its --robot.* options"
        )
    holder = make_dataclass("LeRobotRobotOptions", [("robot", RobotConfig)])
    return LeRobotBridgeConfig(**vars(ours)), draccus.parse(holder, args=rest).robot, kinds[-1]


def main(argv: Optional[list[str]] = None) -> None:
    """Build the LeRobot robot the command line describes and serve it until SIGINT / SIGTERM."""
    from lerobot.robots import make_robot_from_config

    from real_robot.robots.network import RobotAdapterServer

    cfg, robot_cfg, kind = _parse(argv)
    arm = LeRobotArm(make_robot_from_config(robot_cfg), cfg, name=kind)
    server = RobotAdapterServer(arm, api_key=cfg.api_key or os.environ.get("EMBODIED_API_KEY"))
    port = server.start(cfg.host, cfg.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    s = arm.spec
    print(
        f"lerobot bridge: {s.name} ({len(arm.joints)} joints, grippers {arm.grippers}, cameras {sorted(s.cameras)}) "
        f"on ws://{cfg.host}:{port}; listening on port {port}",
        flush=True,
    )
    stop.wait()
    server.stop()
    arm.disconnect()


if __name__ == "__main__":
    main()
