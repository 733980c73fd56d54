"""Scripted experts for LIBERO's articulated goals, on privileged state, through LIBERO's action space
(OSC_POSE deltas), batched over the envs of a :class:`sims.libero.worlds.LiberoWorlds`:

- :class:`DrawerExpert` (``open`` a cabinet's drawer region): the hand turned to point its fingers
  at the cabinet, closing vertically, grasps the drawer's handle bar from the front (a top-down
  grasp would put the hand on the drawer above) and pulls it out along the drawer's slide;
- :class:`KnobExpert` (``turnon`` a stove): a top-down grasp across the knob's ridge, then the
  hand turns about the vertical until the knob's joint passes LIBERO's threshold;

:func:`sims.libero.experts.make_expert` picks the expert of a task's goal.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from sims.libero.osc import GRIPPER_JOINTS, axisangle_to_matrix
from sims.libero.predicates import ARTICULATION
from sims.libero.worlds import LiberoWorlds

DOWN = np.array([0.0, 0.0, -1.0])


@dataclass(frozen=True)
class FixtureExpertConfig:
    """Distances (metres), angles (rad) and step counts of the fixture experts."""

    standoff: float = 0.12  # the drawer expert turns its hand this far in front of the handle
    turn_height: float = 0.10  # ... and this far above it
    handle_depth: float = 0.002  # the grip site this far behind the handle bar's front face
    open_margin: float = 0.012  # pull the drawer this far past LIBERO's open threshold
    knob_height: float = 0.012  # the grip site this far below the knob ridge's top
    hover: float = 0.08  # above the knob before descending onto it
    turn_margin: float = 0.25  # turn the knob this far past LIBERO's turn-on threshold
    reach_tol: float = 0.008
    turn_tol: float = 0.08  # orientation error (rad) at which the hand moves on
    close_steps: int = 10
    open_steps: int = 6
    stall_steps: int = 40  # a phase that has not reached its goal after this many steps moves on
    gain: float = 1.0  # action per 5 cm of position error / per 0.5 rad of orientation error


def rotation_vector(mat: np.ndarray) -> np.ndarray:
    """The axis-angle vector ``[3]`` of a rotation matrix ``[3, 3]`` (angle in [0, pi])."""
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.ascontiguousarray(mat, dtype=np.float64).reshape(9))
    if quat[0] < 0:
        quat = -quat
    sin = np.linalg.norm(quat[1:])
    if sin < 1e-12:
        return np.zeros(3)
    return quat[1:] / sin * 2.0 * np.arctan2(sin, quat[0])


def frame_rotation(a0: np.ndarray, f0: np.ndarray, a1: np.ndarray, f1: np.ndarray) -> np.ndarray:
    """The rotation ``[3, 3]`` that takes the orthonormal pair (a0, f0) onto (a1, f1)."""

    def frame(a: np.ndarray, f: np.ndarray) -> np.ndarray:
        a = a / np.linalg.norm(a)
        f = f - (f @ a) * a
        f = f / np.linalg.norm(f)
        return np.stack([a, f, np.cross(a, f)], axis=1)

    return frame(a1, f1) @ frame(a0, f0).T


def collision_geoms(model: mujoco.MjModel, body: int) -> list[int]:
    """The collision geoms of one body."""
    return [
        g
        for g in range(model.ngeom)
        if int(model.geom_bodyid[g]) == body and (model.geom_contype[g] or model.geom_conaffinity[g])
    ]


def world_box(model: mujoco.MjModel, data: mujoco.MjData, geoms: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The world-aligned box ``(lo [3], hi [3])`` around ``geoms`` as they lie in ``data``."""
    lo, hi = np.full(3, np.inf), np.full(3, -np.inf)
    for g in geoms:
        rot = data.geom_xmat[g].reshape(3, 3)
        centre = data.geom_xpos[g] + rot @ model.geom_aabb[g, :3]
        half = np.abs(rot) @ model.geom_aabb[g, 3:]
        lo, hi = np.minimum(lo, centre - half), np.maximum(hi, centre + half)
    return lo, hi


class _Scripted:
    """Phases per env, and the action that moves the grip site toward a position and the hand toward
    an orientation."""

    phases: tuple[str, ...] = ()

    def __init__(self, worlds: LiberoWorlds, cfg: FixtureExpertConfig) -> None:
        self.worlds, self.cfg = worlds, cfg
        m = worlds.model
        self._finger = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, GRIPPER_JOINTS[0])
        n = worlds.num_envs
        self.phase = np.zeros(n, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)

    def _joint(self, name: str) -> tuple[int, int]:
        """(id, qpos address) of a joint."""
        m = self.worlds.model
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            raise ValueError(f"the scene has no joint {name!r}")
        return jid, int(m.jnt_qposadr[jid])

    def _articulated(self, name: str, predicate: str, joint_type: mujoco.mjtJoint, margin: float) -> None:
        """Sets ``joint``, ``qadr`` (its qpos address), ``sign`` (the way ``predicate`` moves the joint) and
        ``target`` (``margin`` past LIBERO's threshold) for the first joint of fixture or region ``name``;
        ``ValueError`` unless it is of ``joint_type``."""
        joints, op, threshold = articulation(self.worlds, name, predicate)
        self.joint, self.qadr = self._joint(joints[0])
        if self.worlds.model.jnt_type[self.joint] != joint_type:
            raise ValueError(
                f"{name}: joint {joints[0]!r} is not a {joint_type.name[6:].lower()} joint; the "
                f"{type(self).__name__} works {predicate!r} with one"
            )
        # LIBERO's cabinets open below -0.14; its stoves turn on above 0.5
        self.sign = -1.0 if op == "<" else 1.0
        self.target = threshold + self.sign * margin

    def past_target(self, d: mujoco.MjData) -> bool:
        """Whether the joint has moved past ``target`` (the goal holds, with the margin)."""
        q = float(d.qpos[self.qadr])
        return q < self.target if self.sign < 0 else q > self.target

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        """Start over (every env, or the envs ``env_ids`` of its worlds) from the first phase."""
        rows = slice(None) if env_ids is None else np.asarray(env_ids, np.int64)
        self.phase[rows] = 0
        self.count[rows] = 0

    def _action(self, d: mujoco.MjData, goal: np.ndarray, goal_mat: np.ndarray | None, grip: float) -> np.ndarray:
        site = self.worlds.arm.site
        action = np.zeros(7)
        action[:3] = np.clip((goal - d.site_xpos[site]) / 0.05 * self.cfg.gain, -1.0, 1.0)
        if goal_mat is not None:
            err = rotation_vector(goal_mat @ d.site_xmat[site].reshape(3, 3).T)
            action[3:6] = np.clip(err / 0.5 * self.cfg.gain, -1.0, 1.0)
        action[6] = grip
        return action

    def _arrived(
        self, i: int, d: mujoco.MjData, goal: np.ndarray, tol: float, steps: int, goal_mat: np.ndarray | None = None
    ) -> bool:
        """Whether env ``i``'s phase is over: the grip site within ``tol`` of ``goal`` (and the hand turned to
        ``goal_mat``, where given), or ``steps`` steps spent in it."""
        there = np.linalg.norm(goal - d.site_xpos[self.worlds.arm.site]) < tol
        return bool(there and (goal_mat is None or self._turned(d, goal_mat))) or self.count[i] > steps

    def _turned(self, d: mujoco.MjData, goal_mat: np.ndarray) -> bool:
        site = self.worlds.arm.site
        return float(np.linalg.norm(rotation_vector(goal_mat @ d.site_xmat[site].reshape(3, 3).T))) < self.cfg.turn_tol

    def _act(self, i: int, d: mujoco.MjData) -> np.ndarray:
        raise NotImplementedError

    def act(self) -> np.ndarray:
        """Actions ``[N, 7]`` for the envs' current state (and the phase each is in)."""
        return np.stack([self._act(i, d) for i, d in enumerate(self.worlds.datas)])


def articulation(worlds: LiberoWorlds, name: str, predicate: str) -> tuple[list[str], str, float]:
    """The joints of fixture or region ``name``, the comparison and the threshold of ``predicate`` for
    its class (LIBERO's, :data:`sims.libero.predicates.ARTICULATION`)."""
    goal = worlds.goal
    if name in goal.sites:
        site = goal.sites[name]
        joints, cls = site["joints"] or [], goal.things[site["parent"]]["class"] if site["parent"] else ""
    else:
        joints, cls = goal.things[name]["joints"], goal.things[name]["class"]
    if not joints or predicate not in ARTICULATION.get(cls, {}):
        raise ValueError(f"{name} ({cls or 'no class'}) has no joint with a {predicate!r} threshold")
    op, threshold = ARTICULATION[cls][predicate]
    return list(joints), op, threshold


class DrawerExpert(_Scripted):
    """Opens the drawer of a cabinet region (``open wooden_cabinet_1_middle_region``): the hand turned
    to point at the cabinet with the fingers closing vertically, high in front of the handle; down to
    its height; forward until the handle bar is between the fingers; close; pull along the slide until
    the joint is ``cfg.open_margin`` past LIBERO's open threshold; open the hand; back away (and reach
    again where the handle slipped out before the drawer opened)."""

    phases = ("turn", "lower", "reach", "close", "pull", "release", "back")
    TURN, LOWER, REACH, CLOSE, PULL, RELEASE, BACK = range(7)

    def __init__(self, worlds: LiberoWorlds, region: str, cfg: FixtureExpertConfig = FixtureExpertConfig()) -> None:
        super().__init__(worlds, cfg)
        self._articulated(region, "open", mujoco.mjtJoint.mjJNT_SLIDE, cfg.open_margin)
        m = worlds.model
        self._drawer = int(m.jnt_bodyid[self.joint])
        self._geoms = collision_geoms(m, self._drawer)
        n = worlds.num_envs
        self.goal_mat = np.tile(np.eye(3), (n, 1, 1))
        self.home_mat = np.tile(np.eye(3), (n, 1, 1))  # the hand's orientation when the expert started
        self.home_pos = np.zeros((n, 3))  # ... and its grip site
        self.handle = np.zeros((n, 3))  # the grasp point at the handle, when the hand started

    def open_direction(self, d: mujoco.MjData) -> np.ndarray:
        """The world direction ``[3]`` the drawer moves as it opens."""
        return self.sign * np.asarray(d.xaxis[self.joint])

    def handle_point(self, d: mujoco.MjData) -> np.ndarray:
        """Where the grip site grasps the handle bar ``[3]``: the middle of the drawer's geoms that reach
        farthest along the opening direction (the bar), ``cfg.handle_depth`` behind its front face."""
        out = self.open_direction(d)
        reach = []
        for g in self._geoms:
            g_lo, g_hi = world_box(self.worlds.model, d, [g])
            reach.append((float(g_hi @ np.maximum(out, 0) - g_lo @ np.maximum(-out, 0)), g))
        front = max(r for r, _ in reach)
        lo, hi = world_box(self.worlds.model, d, [g for r, g in reach if r > front - 0.003])
        centre = 0.5 * (lo + hi)
        return centre + out * (0.5 * float(np.abs(hi - lo) @ np.abs(out)) - self.cfg.handle_depth)

    def _act(self, i: int, d: mujoco.MjData) -> np.ndarray:
        cfg, site = self.cfg, self.worlds.arm.site
        eef = np.asarray(d.site_xpos[site])
        phase = self.phase[i]
        out = self.open_direction(d)
        self.count[i] += 1
        if phase == self.TURN:
            if self.count[i] == 1:  # the hand's goal orientation: fingers toward the cabinet, closing vertically
                finger = np.asarray(d.xaxis[self._finger])
                rot = frame_rotation(DOWN, finger, -out, np.array([0.0, 0.0, 1.0]))
                self.home_mat[i] = d.site_xmat[site].reshape(3, 3)
                self.home_pos[i] = eef
                self.goal_mat[i] = rot @ self.home_mat[i]
                self.handle[i] = self.handle_point(d)
            # turned high above the table (the hand, fingers closing vertically, spans 20 cm of height)
            goal = self.handle[i] + out * cfg.standoff + [0.0, 0.0, cfg.turn_height]
            if self._arrived(i, d, goal, 2 * cfg.reach_tol, 3 * cfg.stall_steps, self.goal_mat[i]):
                phase, self.count[i] = self.LOWER, 0
        if phase == self.LOWER:
            goal = self.handle[i] + out * cfg.standoff
            if self._arrived(i, d, goal, 2 * cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.REACH, 0
        if phase == self.REACH:
            goal = self.handle_point(d)
            if self._arrived(i, d, goal, cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.CLOSE, 0
        if phase == self.CLOSE:
            goal = self.handle_point(d)
            if self.count[i] > cfg.close_steps:
                phase, self.count[i] = self.PULL, 0
        if phase == self.PULL:
            # ahead of the handle by a step: the drawer's damping holds the hand back
            goal = self.handle_point(d) + out * 0.03
            if self.past_target(d) or self.count[i] > 2 * cfg.stall_steps:
                phase, self.count[i] = self.RELEASE, 0
        if phase == self.RELEASE:
            goal = eef.copy()
            if self.count[i] > cfg.open_steps:
                phase, self.count[i] = self.BACK, 0
        if phase == self.BACK:
            goal = self.handle_point(d) + out * cfg.standoff
            # the handle slipped out of the hand short of open: reach for it again
            if not self.past_target(d) and self._arrived(i, d, goal, 2 * cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.REACH, 0
                goal = self.handle_point(d)
        self.phase[i] = phase
        grip = 1.0 if phase in (self.CLOSE, self.PULL) else -1.0
        return self._action(d, goal, self.goal_mat[i], grip)


class KnobExpert(_Scripted):
    """Turns a stove on (``turnon flat_stove_1``): above the knob's ridge with the fingers across it,
    down, close, then the hand turns about the knob's axis until the joint is ``cfg.turn_margin`` past
    LIBERO's threshold; open the hand; up."""

    phases = ("approach", "descend", "close", "turn", "release", "retreat")
    APPROACH, DESCEND, CLOSE, TURN, RELEASE, RETREAT = range(6)

    def __init__(self, worlds: LiberoWorlds, stove: str, cfg: FixtureExpertConfig = FixtureExpertConfig()) -> None:
        super().__init__(worlds, cfg)
        self._articulated(stove, "turnon", mujoco.mjtJoint.mjJNT_HINGE, cfg.turn_margin)
        self._geoms = collision_geoms(worlds.model, int(worlds.model.jnt_bodyid[self.joint]))
        self.goal_mat = np.tile(np.eye(3), (worlds.num_envs, 1, 1))

    def ridge(self, d: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
        """The box ``(lo, hi)`` around the knob's geoms that rise to within 2 cm of its top (the ridge
        the fingers grip; the knob's disc lies below)."""
        m = self.worlds.model
        tops = {g: world_box(m, d, [g])[1][2] for g in self._geoms}
        top = max(tops.values())
        return world_box(m, d, [g for g, z in tops.items() if z > top - 0.02])

    def grasp_point(self, d: mujoco.MjData) -> np.ndarray:
        lo, hi = self.ridge(d)
        axis = np.asarray(d.xanchor[self.joint])
        return np.array([axis[0], axis[1], hi[2] - self.cfg.knob_height])

    def _act(self, i: int, d: mujoco.MjData) -> np.ndarray:
        cfg, site = self.cfg, self.worlds.arm.site
        eef = np.asarray(d.site_xpos[site])
        mat = d.site_xmat[site].reshape(3, 3)
        phase = self.phase[i]
        self.count[i] += 1
        if phase == self.APPROACH:
            if self.count[i] == 1:  # fingers closing across the ridge (along its short side)
                lo, hi = self.ridge(d)
                across = np.array([1.0, 0.0, 0.0]) if hi[0] - lo[0] < hi[1] - lo[1] else np.array([0.0, 1.0, 0.0])
                finger = np.asarray(d.xaxis[self._finger])
                if finger @ across < 0:
                    across = -across
                self.goal_mat[i] = frame_rotation(DOWN, finger, DOWN, across) @ mat
            goal = self.grasp_point(d) + [0.0, 0.0, cfg.hover]
            if self._arrived(i, d, goal, 2 * cfg.reach_tol, 3 * cfg.stall_steps, self.goal_mat[i]):
                phase, self.count[i] = self.DESCEND, 0
        if phase == self.DESCEND:
            goal = self.grasp_point(d)
            if self._arrived(i, d, goal, cfg.reach_tol, cfg.stall_steps):
                phase, self.count[i] = self.CLOSE, 0
        if phase == self.CLOSE:
            goal = self.grasp_point(d)
            if self.count[i] > cfg.close_steps:
                phase, self.count[i] = self.TURN, 0
        goal_mat = self.goal_mat[i]
        if phase == self.TURN:
            goal = self.grasp_point(d)
            # 0.25 rad ahead of the hand, about the knob's axis (world z for LIBERO's stoves)
            axis = self.sign * np.asarray(d.xaxis[self.joint])
            goal_mat = axisangle_to_matrix(0.25 * axis[None])[0] @ mat
            if self.past_target(d) or self.count[i] > 2 * cfg.stall_steps:
                phase, self.count[i] = self.RELEASE, 0
        if phase == self.RELEASE:
            goal, goal_mat = eef.copy(), None
            if self.count[i] > cfg.open_steps:
                phase, self.count[i] = self.RETREAT, 0
        if phase == self.RETREAT:
            goal, goal_mat = eef + [0.0, 0.0, 0.05], None
        self.phase[i] = phase
        grip = 1.0 if phase in (self.CLOSE, self.TURN) else -1.0
        return self._action(d, goal, goal_mat, grip)
