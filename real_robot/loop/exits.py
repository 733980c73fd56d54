"""Why an episode ended: :class:`ExitReason` (a ``str`` enum: it compares, prints and serialises as
its value) and :class:`Ending`, which adds the stalled camera or the error behind it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

if hasattr(enum, "StrEnum"):
    StrEnum = enum.StrEnum
else:  # Python 3.10: the same behaviour (compares, prints and formats as its value)

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class ExitReason(StrEnum):
    SUCCESS = "success"  # a simulated robot reports the task solved
    MAX_STEPS = "max_steps"
    WATCHDOG = "watchdog"  # no fresh action for stop_timeout_s
    CAMERA_STALLED = "camera_stalled"  # a camera's frames stopped changing
    ESTOP = "estop"
    UNSAFE_STATE = "unsafe_state"  # an implausible robot state (the safety filter refused it)
    SERVER_LOST = "server_lost"  # the policy server did not come back

    @property
    def stops_robot(self) -> bool:
        """Whether the robot is held and disconnected (motors stopped) after an episode that ended so;
        a new episode then needs ``robot.connect()``."""
        return self in _STOPS_ROBOT


_STOPS_ROBOT = frozenset(
    {ExitReason.WATCHDOG, ExitReason.CAMERA_STALLED, ExitReason.ESTOP, ExitReason.UNSAFE_STATE, ExitReason.SERVER_LOST}
)


@dataclass(frozen=True)
class Ending:
    """An episode's end: its ``exit`` reason, the stalled ``camera`` (``CAMERA_STALLED`` only) and the
    ``error`` that explains it (``UNSAFE_STATE``, ``SERVER_LOST``)."""

    exit: ExitReason
    camera: Optional[str] = None
    error: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.camera is not None) != (self.exit is ExitReason.CAMERA_STALLED):
            raise ValueError(
                f"an Ending names a camera exactly when it is {ExitReason.CAMERA_STALLED}; "
                f"got exit={self.exit!r}, camera={self.camera!r}"
            )

    @property
    def reason(self) -> str:
        """The reason as episodes report it: the :class:`ExitReason` itself, or ``camera_stalled:<camera>``."""
        return f"{self.exit}:{self.camera}" if self.camera is not None else self.exit
