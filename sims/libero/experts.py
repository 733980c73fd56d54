"""Scripted experts for LIBERO tasks on privileged state: pick the goal's object, put it on / in its
target, through LIBERO's own action space (OSC_POSE deltas), batched over the envs of a
:class:`sims.libero.worlds.LiberoWorlds`; :func:`make_expert` also hands out the drawer and stove-knob
experts of :mod:`sims.libero.fixture_experts`, the plate-pushing one of :mod:`sims.libero.push_expert`
and the open-the-drawer-then-put-it-in one of :mod:`sims.libero.drawer_place_expert`.

    expert = make_expert(worlds)
    worlds.reset(init_ids); expert.reset()
    while ...: success = worlds.step(expert.act())

The goal must be one ``on`` or ``in`` predicate with a movable object (libero_spatial: a bowl onto the
plate; libero_object: a grocery item into the basket). The grasp is top-down: a bowl by its rim, at
one of the two points the fingers can straddle with the gripper's initial orientation (a level bowl's
nearer the robot's base, a tilted one's higher); anything else at the
centre of its collision box, below its top and above its bottom (a bottle by its neck, just below
its top), the hand first turned about the vertical so that the fingers close across the short side of
an elongated object (a butter pack, a cream-cheese box). The carry keeps the object's lowest point above the target's walls. Phases per
env: above the grasp, down, close, lift, carry above the target, lower (until the object stops
coming lower), open, up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
import torch

from sims.libero.osc import GRIPPER_JOINTS
from sims.libero.worlds import LiberoWorlds

APPROACH, DESCEND, CLOSE, LIFT, CARRY, LOWER, OPEN, RETREAT = range(8)
PHASES = ("approach", "descend", "close", "lift", "carry", "lower", "open", "retreat")


@dataclass(frozen=True)
class ExpertConfig:
    """Heights and tolerances of :class:`PickPlaceExpert` (metres, control steps)."""

    hover: float = 0.10  # above the grasp point before descending, and above the target when carrying
    lift_clearance: float = 0.08  # the carry at least this much above where the grasp closed
    approach_steps: int = 40  # then descend from above the grasp point even short of the hover height
    grasp_depth: float = 0.03  # the grip site above the object's origin at the grasp
    below_top: float = 0.02  # ... and at least this far below the object's top (a flat box, a low can)
    above_bottom: float = 0.012  # ... and at least this far above its bottom (the fingers clear the floor)
    align_ratio: float = 1.25  # an object this much longer than wide is grasped across its short side
    align_tol: float = 0.08  # yaw error (rad) at which the hand descends
    place_height: float = 0.04  # the object's origin above the target's when released
    reach_tol: float = 0.008
    reach: float = 0.8  # horizontal distance from the robot's base beyond which a grasp point is not taken
    # a bowl whose two candidate rim points differ more in height than this is tilted (on a ramekin): taken
    # by the higher one; a level bowl by the one nearer the robot's base at the grasp and at the place
    rim_tilt: float = 0.004
    hold_tol: float = 0.025  # the held object's centre this much farther from the grip than grasped: dropped
    descend_steps: int = 15  # close after this many steps down even if short of the grasp point
    carry_tol: float = 0.012  # the held object's centre above the target's, horizontally, before lowering
    # ... or this far, once the carry has stopped closing in for carry_stall_steps (the arm fully stretched:
    # OSC_POSE cannot move the hand back along the straight arm)
    carry_loose_tol: float = 0.04
    carry_stall_steps: int = 10
    lower_steps: int = 60  # release after this many steps down even if short of the placing height
    lower_stall_steps: int = 5  # ... or once the held object has not come 1 mm lower for this many steps
    close_steps: int = 8
    open_steps: int = 6
    gain: float = 1.0  # action per 5 cm of position error (OSC_POSE moves its goal 5 cm at 1.0)


class PickPlaceExpert:
    """The scripted expert of a one-predicate ``on`` / ``in`` task, for every env of ``worlds``."""

    phases = PHASES

    def __init__(self, worlds: LiberoWorlds, cfg: ExpertConfig = ExpertConfig()) -> None:
        goal = worlds.goal.goal
        if len(goal) != 1 or goal[0][0] not in ("on", "in") or goal[0][1] not in worlds.meta["objects"]:
            raise ValueError(
                f"PickPlaceExpert needs one 'on' or 'in' predicate with a movable object; "
                f"{worlds.suite} task {worlds.task_index} has {goal}"
            )
        self.worlds, self.cfg = worlds, cfg
        self.obj, self.target = goal[0][1], goal[0][2]
        m = worlds.model
        # read at the model's qpos0, as a fresh env's data holds it (not at the controller's home
        # posture, where the fingers close along another horizontal direction)
        d = mujoco.MjData(m)
        mujoco.mj_kinematics(m, d)
        finger = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, GRIPPER_JOINTS[0])
        self.finger_axis = np.array(d.xaxis[finger])  # world direction the fingers close along
        info = worlds.meta["objects"][self.obj]
        self._body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, info["root_body"])
        self._base = np.array(d.xpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "robot0_base")])
        self.rim = self._rim_radius(d) if "bowl" in info["class"].lower() else 0.0
        # a bottle is taken by its neck: its body is about as wide as the open hand, whose fingers
        # would land on the shoulders
        self.neck = "bottle" in info["class"].lower()
        self._finger = finger
        self._half = self._body_extent(d)  # [3] half extents of the object's collision geoms, body frame
        self._center = self._box_center  # [3] their box's centre, body frame
        # the grip site's height above the object's origin once grasped (a neck: near the top of the box)
        self._grip_height = self._center[2] + self._half[2] - cfg.below_top if self.neck else cfg.grasp_depth
        hx, hy = self._half[:2]
        # the body axis to close the fingers across (the shorter horizontal side), or None for a round object
        self._across = (
            None
            if self.rim or max(hx, hy) < cfg.align_ratio * min(hx, hy)
            else (np.array([1.0, 0.0, 0.0]) if hx < hy else np.array([0.0, 1.0, 0.0]))
        )
        n = worlds.num_envs
        self.phase = np.zeros(n, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)
        self.travel = np.zeros(n)  # the carry's height
        self.closest = np.full(n, np.inf)  # the carry's closest horizontal distance to the target so far
        self.lowest = np.full(n, np.inf)  # the held object's lowest height while lowering
        self.still = np.zeros(n, dtype=np.int64)  # steps since it last came 1 mm lower
        self.side = np.zeros(
            n, dtype=np.int64
        )  # the bowl's rim point each env grasps (rim_side), chosen at the approach

    def _rim_radius(self, d: mujoco.MjData) -> float:
        """A bowl's rim radius: its collision geoms' largest distance from its axis (``d`` after
        ``mj_kinematics``)."""
        m, body = self.worlds.model, self._body
        geoms = [g for g in range(m.ngeom) if m.geom_bodyid[g] == body and (m.geom_contype[g] or m.geom_conaffinity[g])]
        rel = np.array([d.xmat[body].reshape(3, 3).T @ (d.geom_xpos[g] - d.xpos[body]) for g in geoms])
        return float(np.linalg.norm(rel[:, :2], axis=1).max())

    def _body_extent(self, d: mujoco.MjData) -> np.ndarray:
        """Half extents ``[3]`` of the box around the object's collision geoms in its body frame (``d``
        after ``mj_kinematics``); sets ``_box_center``."""
        m, body = self.worlds.model, self._body
        rot = d.xmat[body].reshape(3, 3)
        lo, hi = np.full(3, np.inf), np.full(3, -np.inf)
        for g in range(m.ngeom):
            if m.geom_bodyid[g] != body or not (m.geom_contype[g] or m.geom_conaffinity[g]):
                continue
            rel = rot.T @ d.geom_xmat[g].reshape(3, 3)
            centre = rot.T @ (d.geom_xpos[g] - d.xpos[body]) + rel @ m.geom_aabb[g, :3]
            half = np.abs(rel) @ m.geom_aabb[g, 3:]
            lo, hi = np.minimum(lo, centre - half), np.maximum(hi, centre + half)
        self._box_center = 0.5 * (lo + hi)
        return 0.5 * (hi - lo)

    def vertical_span(self, d: mujoco.MjData) -> tuple[float, float]:
        """The lowest and highest point (world z) of the box around the object's collision geoms now."""
        rot = d.xmat[self._body].reshape(3, 3)
        centre = d.xpos[self._body][2] + (rot @ self._center)[2]
        reach = (np.abs(rot) @ self._half)[2]
        return float(centre - reach), float(centre + reach)

    def yaw_error(self, d: mujoco.MjData) -> float:
        """Rotation about the vertical (rad, in [-pi/2, pi/2]) that brings the fingers' closing direction
        onto the object's short side; 0 for a round object or a bowl."""
        if self._across is None:
            return 0.0
        want = (d.xmat[self._body].reshape(3, 3) @ self._across)[:2]
        have = np.asarray(d.xaxis[self._finger])[:2]
        err = np.arctan2(have[0] * want[1] - have[1] * want[0], have @ want)
        return float((err + np.pi / 2) % np.pi - np.pi / 2)

    def grasp_point(self, d: mujoco.MjData, side: int = 0) -> np.ndarray:
        """Where the grip site goes to grasp, in the world ``[3]``. A bowl: the rim point ``side`` (0:
        :meth:`rim_side`'s choice now) of :meth:`rim_points`."""
        if not self.rim:
            pos = d.xpos[self._body]
            rot = d.xmat[self._body].reshape(3, 3)
            # the box's centre horizontally; vertically grasp_depth above the origin, kept below the top
            # and above the bottom of the object as it lies now
            centre = pos + rot @ self._center
            bottom, top = self.vertical_span(d)
            z = top - self.cfg.below_top if self.neck else pos[2] + self.cfg.grasp_depth
            z = max(min(z, top - self.cfg.below_top), bottom + self.cfg.above_bottom)
            return np.array([centre[0], centre[1], z])
        return self.rim_points(d)[side if side else self.rim_side(d)]

    def rim_points(self, d: mujoco.MjData) -> dict[int, np.ndarray]:
        """A bowl's two grasp points ``{+1, -1: [3]}``: the rim points whose radial direction lies along
        (+1) and against (-1) the finger axis, so that the fingers straddle the wall there."""
        pos = d.xpos[self._body]
        rot = d.xmat[self._body].reshape(3, 3)
        axis = self.finger_axis[:2] / np.linalg.norm(self.finger_axis[:2])
        theta = np.linspace(0.0, 2 * np.pi, 72, endpoint=False)
        radial = rot @ np.stack([np.cos(theta), np.sin(theta), np.zeros_like(theta)])  # [3, 72]
        horizontal = radial[:2] / np.maximum(np.linalg.norm(radial[:2], axis=0), 1e-9)
        along = horizontal.T @ axis
        return {
            sign: pos + self.rim * radial[:, int(np.argmax(sign * along))] + rot[:, 2] * self.cfg.grasp_depth
            for sign in (1, -1)
        }

    def rim_side(self, d: mujoco.MjData) -> int:
        """Which of :meth:`rim_points` to grasp (+1 / -1). A tilted bowl (the two differ in height by more
        than ``cfg.rim_tilt``: on a ramekin): the higher, unless it lies farther than ``cfg.reach`` from
        the robot's base and the other nearer. A level bowl: the one that keeps the hand nearer the base,
        summed over the grasp and the place (the hand holds the bowl there by the same rim point): near
        the arm's full extension OSC_POSE cannot bring the hand back toward the base."""
        points = self.rim_points(d)
        if abs(points[1][2] - points[-1][2]) > self.cfg.rim_tilt:
            high, low = (1, -1) if points[1][2] > points[-1][2] else (-1, 1)
            if self._reach(points[high]) > self.cfg.reach and self._reach(points[low]) < self._reach(points[high]):
                return low
            return high
        centre = d.xpos[self._body]
        target = self.worlds.goal.position(d, self.target)
        cost = {s: self._reach(p) + self._reach(target + p - centre) for s, p in points.items()}
        return min(cost, key=cost.get)

    def _reach(self, point: np.ndarray) -> float:
        return float(np.linalg.norm((point - self._base)[:2]))

    def dropped(self, eef: np.ndarray, obj: np.ndarray) -> bool:
        """Whether the object has left the hand: its centre farther from the grip site, horizontally,
        than a grasp holds it (a bowl's rim radius, plus ``hold_tol``), or farther below it."""
        cfg = self.cfg
        return bool(
            np.linalg.norm((eef - obj)[:2]) > self.rim + cfg.hold_tol
            or eef[2] - obj[2] > self._grip_height + cfg.hold_tol + 0.02
        )

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        """Start over (every env, or the envs ``env_ids`` of its worlds) from the approach."""
        rows = slice(None) if env_ids is None else np.asarray(env_ids, np.int64)
        self.phase[rows] = APPROACH
        self.count[rows] = 0

    def act(self) -> np.ndarray:
        """Actions ``[N, 7]`` for the envs' current state (and the phase each is in)."""
        w, cfg = self.worlds, self.cfg
        actions = np.zeros((w.num_envs, 7))
        for i, d in enumerate(w.datas):
            eef = d.site_xpos[w.arm.site]
            obj = w.goal.position(d, self.obj)
            tgt = w.goal.position(d, self.target)
            phase = self.phase[i]
            if phase == APPROACH and self.count[i] == 0 and self.rim:
                self.side[i] = self.rim_side(d)  # kept to the close: the bowl moves as the fingers reach it
            grasp = self.grasp_point(d, self.side[i]) if phase in (APPROACH, DESCEND, CLOSE) else obj
            place = tgt + np.array([0.0, 0.0, cfg.place_height])
            yaw = self.yaw_error(d) if phase in (APPROACH, DESCEND) else 0.0
            if phase == APPROACH:
                goal, grip = grasp + [0, 0, cfg.hover], -1.0
                self.count[i] += 1
                # there (and turned across the object); or above it and stalled, short of a hover height
                # the arm cannot reach
                if abs(yaw) < cfg.align_tol and (
                    np.linalg.norm(goal - eef) < cfg.reach_tol * 2
                    or (self.count[i] > cfg.approach_steps and np.linalg.norm((goal - eef)[:2]) < cfg.reach_tol * 2)
                ):
                    phase, self.count[i] = DESCEND, 0
            if phase == DESCEND:
                goal, grip = grasp, -1.0
                self.count[i] += 1
                # close when there, or when a finger rests on the object short of it
                if np.linalg.norm(goal - eef) < cfg.reach_tol or self.count[i] > cfg.descend_steps:
                    phase, self.count[i] = CLOSE, 0
            if phase == CLOSE:
                goal, grip = grasp, 1.0
                self.count[i] += 1
                if self.count[i] > cfg.close_steps:
                    phase = LIFT
                    # carry at the hover height above the target, high enough to clear where the object
                    # was (a drawer, a cabinet top), and with the object's lowest point the hover height
                    # above the target (a tall bottle hangs far below the hand; a basket has walls)
                    hang = eef[2] - self.vertical_span(d)[0]
                    self.travel[i] = max(
                        tgt[2] + cfg.hover + cfg.place_height, eef[2] + cfg.lift_clearance, tgt[2] + cfg.hover + hang
                    )
            if phase == LIFT:
                goal, grip = np.array([eef[0], eef[1], self.travel[i]]), 1.0
                if eef[2] > goal[2] - 0.02:
                    phase, self.count[i], self.closest[i] = CARRY, 0, np.inf
            # carrying, the object moves the eef: steer by where the held object is, not the plan
            held = eef + (np.r_[tgt[:2], tgt[2] + cfg.place_height] - obj)
            if phase in (CARRY, LOWER) and self.dropped(eef, obj):
                phase, self.count[i] = APPROACH, 0  # dropped on the way: grasp again
                goal, grip = self.grasp_point(d) + [0, 0, cfg.hover], -1.0
            if phase == CARRY:
                goal, grip = np.r_[held[:2], self.travel[i]], 1.0
                gap = np.linalg.norm((obj - tgt)[:2])
                if gap < self.closest[i] - 1e-3:
                    self.closest[i], self.count[i] = gap, 0
                else:
                    self.count[i] += 1
                if gap < cfg.carry_tol or (gap < cfg.carry_loose_tol and self.count[i] > cfg.carry_stall_steps):
                    phase, self.count[i], self.lowest[i], self.still[i] = LOWER, 0, np.inf, 0
            if phase == LOWER:
                goal, grip = held, 1.0
                self.count[i] += 1
                if obj[2] < self.lowest[i] - 1e-3:
                    self.lowest[i], self.still[i] = obj[2], 0
                else:
                    self.still[i] += 1
                if (
                    np.linalg.norm(obj - np.r_[tgt[:2], tgt[2] + cfg.place_height]) < cfg.reach_tol
                    or self.still[i] > cfg.lower_stall_steps
                    or self.count[i] > cfg.lower_steps
                ):
                    phase, self.count[i] = OPEN, 0
            if phase == OPEN:
                goal, grip = eef.copy(), -1.0
                self.count[i] += 1
                if self.count[i] > cfg.open_steps:
                    phase = RETREAT
            if phase == RETREAT:
                goal, grip = np.array([eef[0], eef[1], place[2] + cfg.hover]), -1.0
            self.phase[i] = phase
            actions[i, :3] = np.clip((goal - eef) / 0.05 * cfg.gain, -1.0, 1.0)
            actions[i, 5] = np.clip(yaw / 0.5 * cfg.gain, -1.0, 1.0)  # OSC_POSE turns 0.5 rad at 1.0
            actions[i, 6] = grip
        return actions


#: what each kind of expert does, by the goal it handles (:func:`expert_kind`)
EXPERT_KINDS = {
    "pick_place": "one 'on' / 'in' predicate moving an object",
    "push": "one 'on' predicate moving a flat object (a plate) onto a table region",
    "drawer": "one 'open' predicate on a cabinet's drawer region",
    "drawer_place": "one 'in' predicate moving an object into a cabinet's drawer, closed at the start",
    "knob": "one 'turnon' predicate on a stove",
}


def expert_kind(meta: dict) -> str | None:
    """Which scripted expert handles a task's goal (a key of :data:`EXPERT_KINDS`), from its scene
    metadata (``goal_state``, ``objects`` and, once exported, ``sites``), or None. A drawer region's
    ``in`` goal (libero_goal's "open the top drawer and put the bowl inside": the drawer starts
    closed) is told apart from a basket's by the exported ``sites`` (a drawer region has joints)."""
    goal, sites = meta["goal_state"], meta.get("sites")  # no sites: judged by the goal alone (not exported yet)
    if len(goal) != 1:
        return None
    pred = goal[0]
    if pred[0] == "in" and sites is not None and (sites.get(pred[2]) or {}).get("joints"):
        return "drawer_place" if pick_place_goal(meta) is not None else None
    if pick_place_goal(meta) is not None:
        if pred[0] == "on" and _pushed(meta, pred[1]):
            # onto a table region (no parent fixture), or not exported yet
            on_region = sites is None or (pred[2] in sites and sites[pred[2]].get("parent") is None)
            return "push" if on_region else None
        return "pick_place"
    if pred[0] == "open" and (sites is None or (sites.get(pred[1]) or {}).get("joints")):
        return "drawer"
    if pred[0] == "turnon":
        return "knob"
    return None


def _pushed(meta: dict, obj: str) -> bool:
    """Whether ``obj`` is of a class that is pushed rather than grasped (its class in the exported
    metadata, or its name where only names are known)."""
    from sims.libero.push_expert import PUSHED_CLASSES

    info = meta["objects"][obj] if isinstance(meta["objects"], dict) else None
    name = (info.get("class") if isinstance(info, dict) else None) or obj
    return any(c in name.lower() for c in PUSHED_CLASSES)


def make_expert(worlds: LiberoWorlds, gain: float = 1.0) -> Any:
    """The scripted expert of ``worlds``' task (:func:`expert_kind`); ``ValueError`` naming the goal when
    none handles it. Every expert has ``act() -> [N, 7]``, ``reset(env_ids)``, ``phase [N]`` and
    ``phases`` (the names of its phases)."""
    from sims.libero.drawer_place_expert import DrawerPlaceExpert
    from sims.libero.fixture_experts import DrawerExpert, FixtureExpertConfig, KnobExpert
    from sims.libero.push_expert import PushExpert, PushExpertConfig

    kind = expert_kind(worlds.meta)
    pred = worlds.goal.goal[0] if worlds.goal.goal else None
    if kind == "pick_place":
        return PickPlaceExpert(worlds, ExpertConfig(gain=gain))
    if kind == "push":
        return PushExpert(worlds, pred[1], pred[2], PushExpertConfig(gain=gain))
    if kind == "drawer":
        return DrawerExpert(worlds, pred[1], FixtureExpertConfig(gain=gain))
    if kind == "drawer_place":
        return DrawerPlaceExpert(
            worlds, pred[2], PickPlaceExpert(worlds, ExpertConfig(gain=gain)), FixtureExpertConfig(gain=gain)
        )
    if kind == "knob":
        return KnobExpert(worlds, pred[1], FixtureExpertConfig(gain=gain))
    raise ValueError(
        f"no scripted expert for {worlds.suite} task {worlds.task_index} (goal {worlds.goal.goal}); "
        "the experts handle " + "; ".join(EXPERT_KINDS.values())
    )


def pick_place_goal(meta: dict) -> tuple[str, str] | None:
    """``(object, target)`` of a task whose goal :class:`PickPlaceExpert` handles (one ``on`` / ``in``
    predicate moving an object), from its scene metadata (``goal_state`` and ``objects``, the movable
    ones, by name); None for any other goal."""
    goal = meta["goal_state"]
    if len(goal) == 1 and goal[0][0] in ("on", "in") and goal[0][1] in meta["objects"]:
        return goal[0][1], goal[0][2]
    return None


class LiberoSuiteExpert:
    """The scripted experts of a :class:`sims.libero.env.LiberoVecEnv`'s envs, whatever task each runs,
    behind the suite-expert interface of :func:`sims.suites.expert`: ``act(obs) -> [N, 7]``,
    ``expert(obs) -> [N, 1, 7]`` chunks, ``reset(done_mask)``.

    One expert per task the envs run (:func:`make_expert`), over that task's worlds (rebuilt when the env
    regroups its envs); the observation is not read: the experts act on the simulator's state.
    """

    def __init__(self, env: "LiberoVecEnv", gain: float = 1.0) -> None:  # noqa: F821
        if gain <= 0:
            raise ValueError(f"gain must be > 0, got {gain}")
        self.env, self.cfg = env, ExpertConfig(gain=gain)
        self._experts: dict[int, Any] = {}  # task -> its expert (make_expert)

    def supported(self, task: int) -> bool:
        """Whether task ``task`` of the env (an index into ``env.tasks``) has a scripted expert."""
        from sims.libero import scenes

        extras = self.env.tasks[task].extras
        try:  # the exported scene knows which regions are drawers
            meta = scenes.read_meta(scenes.task_dir(self.env.suite, extras["task_index"], self.env.cache))
        except scenes.SceneCacheError:
            meta = {"goal_state": extras["goal"], "objects": extras["objects"]}
        return expert_kind(meta) is not None

    def check_tasks(self, tasks: list[int]) -> None:
        """``ValueError`` naming the tasks of ``tasks`` without a scripted expert."""
        missing = [t for t in tasks if not self.supported(t)]
        if missing:
            goals = {t: self.env.tasks[t].extras["goal"] for t in missing}
            raise ValueError(
                f"no scripted expert for {self.env.suite} task(s) {missing} (goals {goals}): the "
                "experts handle " + "; ".join(EXPERT_KINDS.values()) + "; choose tasks=[...] among the others"
            )

    def _expert(self, task: int) -> Any:
        worlds = self.env.worlds(task)
        expert = self._experts.get(task)
        if expert is None or expert.worlds is not worlds:
            expert = self._experts[task] = make_expert(worlds, self.cfg.gain)
        return expert

    def act(self, obs: dict | None = None) -> torch.Tensor:
        """Actions ``[N, 7]`` (float32) for every env's current state."""
        env = self.env
        out = np.zeros((env.num_envs, 7), np.float32)
        for t in np.unique(env.task_ids):
            out[env.env_rows(int(t))] = self._expert(int(t)).act()
        return torch.from_numpy(out)

    def __call__(self, obs: dict | None = None) -> torch.Tensor:
        """Chunks of one action ``[N, 1, 7]``."""
        return self.act(obs)[:, None]

    def reset(self, mask: np.ndarray | torch.Tensor | None = None) -> None:
        """Start the envs of ``mask [N]`` (default all) over: their episodes begin anew."""
        env = self.env
        if mask is None:
            self._experts.clear()  # built again over the worlds the envs run now
            return
        ended = np.asarray(mask, bool)
        for t, expert in self._experts.items():
            if expert.worlds is not env.worlds_or_none(t):
                continue  # rebuilt at its next action
            rows = env.env_rows(t)
            expert.reset(np.flatnonzero(ended[rows]))


def run_episodes(
    worlds: LiberoWorlds, init_ids: np.ndarray, expert: Any = None, max_steps: int | None = None
) -> dict[str, np.ndarray]:
    """One episode per env from ``init_ids [N]`` (the protocol's reset and wait steps), the expert
    (default: :func:`make_expert`'s) acting until the goal holds or ``max_steps`` (the suite's limit);
    ``success [N]`` bool, ``length [N]`` (steps until success, or the limit) and ``phase [N]`` (the
    phase each ended in, an index into ``expert.phases``)."""
    expert = expert or make_expert(worlds)
    limit = max_steps or worlds.max_steps
    worlds.reset(init_ids)
    expert.reset()
    n = worlds.num_envs
    success = np.zeros(n, dtype=bool)
    length = np.full(n, limit)
    for t in range(limit):
        done = worlds.step(expert.act())
        new = done & ~success
        length[new] = t + 1
        success |= done
        if success.all():
            break
    return {"success": success, "length": length, "phase": expert.phase.copy()}


def main(argv: list[str] | None = None) -> int:
    """``python -m sims.libero.experts --cache CACHE [--suites ...] [--tasks ...] [--states N] [--first-state F]
    [--json FILE]``: the expert's success per task on init states ``F..F+N-1`` (one env per state; 0..49
    official, 50..99 the held-out states LIBERO's placement initializer sampled) in our simulator."""
    import argparse
    import json
    import time
    from pathlib import Path

    from sims.libero import scenes

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0] if main.__doc__ else None)
    ap.add_argument("--cache", default=None, help="the scene cache root (default: $EMBODIED_LIBERO_CACHE)")
    ap.add_argument("--suites", nargs="+", default=["libero_spatial", "libero_object"])
    ap.add_argument("--tasks", type=int, nargs="+", default=None, help="task indices (default: every exported one)")
    ap.add_argument("--states", type=int, default=10, help="init states F..F+N-1 of each task")
    ap.add_argument(
        "--first-state",
        type=int,
        default=0,
        help="F: the first init state (0..49 official, 50..99 sampled and held out)",
    )
    ap.add_argument("--box-contacts", default="native", choices=scenes.BOX_CONTACTS)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    from sims.libero import INIT_IDS, NUM_STATES

    inits = np.arange(args.first_state, args.first_state + args.states)
    if args.states < 1 or inits[0] < 0 or inits[-1] >= NUM_STATES:
        ap.error(f"--first-state {args.first_state} --states {args.states}: the init states must be in {INIT_IDS}")
    rows = []
    for folder in scenes.task_dirs(args.cache, args.suites):
        meta = scenes.read_meta(folder)
        if args.tasks is not None and int(meta["task_index"]) not in args.tasks:
            continue
        worlds = LiberoWorlds(folder, args.states, box_contacts=args.box_contacts)
        row = {
            "suite": meta["suite"],
            "task": int(meta["task_index"]),
            "goal": meta["goal_state"],
            "inits": inits.tolist(),
        }
        t0 = time.perf_counter()
        try:
            expert = make_expert(worlds)
            result = run_episodes(worlds, inits, expert)
        except ValueError as err:  # a goal this expert does not handle
            row["skipped"] = str(err)
            print(f"{row['suite']} {row['task']}: skipped ({err})", flush=True)
        else:
            ok = result["success"]
            row.update(
                success=float(ok.mean()),
                lengths=result["length"][ok].tolist(),
                failed_in=[expert.phases[p] for p, s in zip(result["phase"], ok) if not s],
                failed_inits=inits[~ok].tolist(),
            )
            print(
                f"{row['suite']} {row['task']}: {row['success']:.0%} ({time.perf_counter() - t0:.0f} s); failures end "
                f"in {row['failed_in'] or 'none'}",
                flush=True,
            )
        worlds.close()
        rows.append(row)
    done = [r["success"] for r in rows if "success" in r]
    print(f"{len(done)} tasks, mean success {np.mean(done):.1%}" if done else "no task run")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
