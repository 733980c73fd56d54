"""Run with .venv-lerobot's Python by tests/real_robot/test_adapters_lerobot.py: LeRobot's own SO-101
follower class with its Feetech motor bus replaced by a recording stand-in (no serial hardware on
this machine: the stand-in's servos reach every goal at once), served by the bridge's real entry
point. Each bus event is appended to the JSON-lines file ``$STANDIN_LOG``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from lerobot.robots.so_follower import so_follower

LOG = Path(os.environ["STANDIN_LOG"])


class StandInBus:
    """What SOFollower uses of ``FeetechMotorsBus``; positions in the bus's normalised units (degrees,
    0..100 for the gripper), as the real bus returns them after calibration."""

    model_resolution_table = {"sts3215": 4096}

    def __init__(self, port: str, motors: dict, calibration: dict | None = None):
        self.port, self.motors, self.calibration = port, motors, dict(calibration or {})
        self.is_connected = False
        self.present = {m: 50.0 if m == "gripper" else 0.0 for m in motors}

    @property
    def is_calibrated(self) -> bool:
        return bool(self.calibration)

    def connect(self, handshake: bool = True) -> None:
        self.is_connected = True
        self._log("connect")

    def disconnect(self, disable_torque: bool = True) -> None:
        self.is_connected = False
        self._log("disconnect", torque_off=disable_torque)

    @contextlib.contextmanager
    def torque_disabled(self, motors=None):
        yield

    def configure_motors(self, *args, **kwargs) -> None:
        pass

    def write(self, *args, **kwargs) -> None:
        pass

    def sync_read(self, data_name: str, motors=None, num_retry: int = 0) -> dict:
        assert data_name == "Present_Position", data_name
        return dict(self.present)

    def sync_write(self, data_name: str, values: dict, num_retry: int = 0) -> None:
        assert data_name == "Goal_Position", data_name
        self._log("goal", values={k: float(v) for k, v in values.items()}, before=dict(self.present))
        self.present.update(values)

    def _log(self, event: str, **data) -> None:
        with LOG.open("a") as f:
            f.write(json.dumps({"event": event, **data}) + "\n")


so_follower.FeetechMotorsBus = StandInBus

from real_robot.robots.lerobot_bridge import main  # noqa: E402

main(sys.argv[1:])
