"""The scripted expert that pushes a flat object across the table into a table region (libero_goal's
"push the plate to the front of the stove"), on privileged state, through LIBERO's action space
(OSC_POSE deltas), batched over the envs of a :class:`sims.libero.worlds.LiberoWorlds`.

A plate is 2 cm tall and 14 cm wide: no top-down grasp holds it, and behind it there is rarely room
for the hand (21 cm along its fingers, 6 cm across) at table height (libero_goal's plate lies 3.4 cm
from the cabinet's side). So the hand, fingers closed, goes down inside the plate, onto its floor on
the line from the object's centre to the region's, and moves along that line: the fingers push the
plate's rim from within. Each step aims a little ahead of where the hand should be on the line as the
object lies now, so the push steers the object back onto the line as it turns or slides sideways;
the hand lifts away once the object's centre is within ``push_tol`` of the region's, and starts over
from above if it has come off the line.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from sims.libero.fixture_experts import _Scripted, collision_geoms, world_box
from sims.libero.worlds import LiberoWorlds


@dataclass(frozen=True)
class PushExpertConfig:
    """Distances (metres) and step counts of :class:`PushExpert`."""

    hover: float = 0.08  # above the start of the push before going down
    push_height: float = 0.012  # the grip site this far above the object's bottom while pushing
    hold: float = 0.01  # ... and this far ahead of its centre along the line (behind a plate's front rim)
    push_step: float = 0.03  # each step aims this far ahead of the hand
    push_tol: float = 0.015  # the object's centre this close to the region's: done
    line_tol: float = 0.03  # the hand this far off the line, or ahead of the hold point: lift and start over
    reach_tol: float = 0.008
    stall_steps: int = 40  # a phase that has not reached its goal after this many steps moves on
    push_steps: int = 150  # pushing: start over from above after this many steps
    gain: float = 1.0  # action per 5 cm of position error


#: object classes no top-down grasp holds, moved by pushing (LIBERO's class names, lower case)
PUSHED_CLASSES = ("plate",)


class PushExpert(_Scripted):
    """Pushes ``obj`` until its centre is within ``cfg.push_tol`` of region ``region``'s centre."""

    phases = ("above", "down", "push", "up")
    ABOVE, DOWN, PUSH, UP = range(4)

    def __init__(self, worlds: LiberoWorlds, obj: str, region: str, cfg: PushExpertConfig = PushExpertConfig()) -> None:
        super().__init__(worlds, cfg)  # type: ignore[arg-type]  # _Scripted reads reach_tol, gain, turn_tol only
        m = worlds.model
        if region not in worlds.goal.sites:
            raise ValueError(
                f"{region!r} is not a region of {worlds.suite} task {worlds.task_index}: the push "
                f"expert pushes onto a table region; regions: {sorted(worlds.goal.sites)}"
            )
        self.obj, self.target = obj, region  # names, as PickPlaceExpert's
        self._site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, worlds.goal.sites[region]["site"])
        body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, worlds.meta["objects"][obj]["root_body"])
        self._geoms = collision_geoms(m, body)

    def centre(self, d: mujoco.MjData) -> np.ndarray:
        """The centre ``[3]`` of the box around the object's collision geoms (its bottom as z)."""
        lo, hi = world_box(self.worlds.model, d, self._geoms)
        return np.array([0.5 * (lo[0] + hi[0]), 0.5 * (lo[1] + hi[1]), lo[2]])

    def region_centre(self, d: mujoco.MjData) -> np.ndarray:
        """The region's centre ``[2]`` (horizontal)."""
        return np.asarray(d.site_xpos[self._site][:2])

    def _line(self, d: mujoco.MjData) -> tuple[np.ndarray, np.ndarray, float]:
        """The object's centre ``[3]``, the unit vector ``[2]`` from it to the region's centre and the
        horizontal distance between the two, from one pass over the object's geoms."""
        c = self.centre(d)
        gap = self.region_centre(d) - c[:2]
        dist = float(np.linalg.norm(gap))
        return c, gap / max(dist, 1e-9), dist

    def direction(self, d: mujoco.MjData) -> np.ndarray:
        """The horizontal unit vector ``[2]`` from the object's centre to the region's."""
        return self._line(d)[1]

    def hold_point(self, d: mujoco.MjData) -> np.ndarray:
        """Where the grip site pushes from ``[3]``: ``cfg.hold`` past the object's centre on the line to
        the region's, at the pushing height."""
        c, u, _ = self._line(d)
        return self._hold(c, u)

    def _hold(self, c: np.ndarray, u: np.ndarray) -> np.ndarray:
        xy = c[:2] + u * self.cfg.hold
        return np.array([xy[0], xy[1], c[2] + self.cfg.push_height])

    def remaining(self, d: mujoco.MjData) -> float:
        """How far the object's centre is from the region's, horizontally."""
        return self._line(d)[2]

    def _act(self, i: int, d: mujoco.MjData) -> np.ndarray:
        cfg = self.cfg
        eef = np.asarray(d.site_xpos[self.worlds.arm.site])
        phase = self.phase[i]
        self.count[i] += 1
        c, u, remaining = self._line(d)
        hold = self._hold(c, u)
        if phase == self.ABOVE:
            goal = hold + [0.0, 0.0, cfg.hover]
            if remaining < cfg.push_tol:
                phase, self.count[i] = self.UP, 0
            elif self._arrived(i, d, goal, 2 * cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.DOWN, 0
        if phase == self.DOWN:
            goal = hold
            if self._arrived(i, d, goal, cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.PUSH, 0
        if phase == self.PUSH:
            off = eef[:2] - hold[:2]
            across = off - (off @ u) * u
            # a step ahead of the hand (the rim holds it back), back onto the line, at the pushing height
            goal = np.array([*(eef[:2] + u * min(cfg.push_step, remaining) - across), hold[2]])
            lost = float(np.linalg.norm(across)) > cfg.line_tol or off @ u > cfg.line_tol  # off the line, past the rim
            if remaining < cfg.push_tol or lost or self.count[i] > cfg.push_steps:
                phase, self.count[i] = self.UP, 0
        if phase == self.UP:
            goal = np.array([eef[0], eef[1], c[2] + cfg.push_height + cfg.hover])
            # off the line or out of steps short of the region: from above again
            if remaining >= cfg.push_tol and self._arrived(i, d, goal, 2 * cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.ABOVE, 0
        self.phase[i] = phase
        return self._action(d, goal, None, 1.0)
