"""Suite scenes and suite tasks: declarative tasks on a scene shared by a whole suite.

A :class:`SuiteScene` lists every object of a suite; all its tasks run on one compiled model, so
envs of one ``VecEnv`` can run different tasks. A :class:`SuiteTask` declares which objects are
on the table, how they are placed (a sampler), the success predicates (all must hold), the
scripted expert's plan and the step limit. Objects a task does not use are parked off-table.

Privileged observation layout (same for every task of a suite): for each movable object, in
scene order, position (3), quaternion w,x,y,z (4), linear velocity (3); then each drawer's
opening (1); then each carriage's position (3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import mujoco
import numpy as np

from sims.mujoco.arrays import like
from sims.mujoco.suites.objects import DRAWER_TRAVEL, PARK_X, PARK_Z, ObjectSpec, add_object
from sims.mujoco.task import MujocoTask, free_joint_qpos, free_joint_qvel, yaw_quat
from sims.protocol import ROBOT_INIT_NOISE

OBJ_STRIDE = 10

Placement = dict[str, tuple[float, float, float]]  # object -> (x, y, yaw)
Sampler = Callable[[np.random.Generator], Placement]


@dataclass(frozen=True)
class Carriage:
    """A tray on a slide joint along y, driven by a position servo (a moving target)."""

    name: str = "carriage"
    x: float = 0.08
    half: tuple[float, float, float] = (0.07, 0.07, 0.01)
    travel: float = 0.16  # +/- y range


@dataclass
class SuiteScene:
    """Every object of a suite, built once into the tabletop spec."""

    objects: Sequence[ObjectSpec]
    carriages: Sequence[Carriage] = ()

    def __post_init__(self) -> None:
        self.by_name = {o.name: o for o in self.objects}
        self.movable = [o for o in self.objects if o.kind != "drawer"]
        self.drawers = [o for o in self.objects if o.kind == "drawer"]
        self.privileged_dim = OBJ_STRIDE * len(self.movable) + len(self.drawers) + 3 * len(self.carriages)

    def build(self, spec: mujoco.MjSpec) -> None:
        for slot, obj in enumerate(self.objects):
            add_object(spec, obj, slot)
        for car in self.carriages:
            hx, hy, hz = car.half
            body = spec.worldbody.add_body(name=car.name, pos=[car.x, 0.0, hz])
            body.add_joint(
                name=f"{car.name}_slide",
                type=mujoco.mjtJoint.mjJNT_SLIDE,
                axis=[0, 1, 0],
                range=[-car.travel - 0.05, car.travel + 0.05],
                damping=5.0,
            )
            body.add_geom(
                name=car.name,
                type=mujoco.mjtGeom.mjGEOM_BOX,
                size=[hx, hy, hz],
                mass=2.0,
                rgba=[0.25, 0.55, 0.75, 1],
                contype=1,
                conaffinity=3,
                condim=4,
                friction=[1.2, 0.01, 0.001],
            )
            act = spec.add_actuator(
                name=f"{car.name}_servo", target=f"{car.name}_slide", trntype=mujoco.mjtTrn.mjTRN_JOINT
            )
            act.set_to_position(kp=400.0, kv=60.0)
            act.ctrlrange = [-car.travel - 0.05, car.travel + 0.05]
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.forcerange = [-80.0, 80.0]
            act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE


class SceneView:
    """Ids and views of a scene's objects in a compiled env (shared by its tasks and experts)."""

    def __init__(self, scene: SuiteScene, env: Any):
        m = env.model
        self.env = env
        self.scene = scene
        self.qpos = {o.name: free_joint_qpos(m, f"{o.name}_joint") for o in scene.movable}
        self.qvel = {o.name: free_joint_qvel(m, f"{o.name}_joint") for o in scene.movable}
        self.body = {o.name: m.body(o.name).id for o in scene.objects}
        self.drawer_qpos = {d.name: m.joint(f"{d.name}_slide").qposadr[0] for d in scene.drawers}
        self.site = {m.site(i).name: i for i in range(m.nsite)}
        self.carriage_qpos = {c.name: m.joint(f"{c.name}_slide").qposadr[0] for c in scene.carriages}
        self.carriage_act = {c.name: m.actuator(f"{c.name}_servo").id for c in scene.carriages}
        self.carriage_body = {c.name: m.body(c.name).id for c in scene.carriages}

    def pos(self, name: str, ids: np.ndarray) -> np.ndarray:
        """``[len(ids), 3]`` world position of an object's body (or a drawer's box)."""
        return self.env.xpos[ids, self.body[name]]

    def site_pos(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.env.site_xpos[ids, self.site[name]]

    def opening(self, drawer: str, ids: np.ndarray) -> np.ndarray:
        return self.env.qpos[ids, self.drawer_qpos[drawer]]

    def privileged(self, ids: np.ndarray) -> Any:
        env, parts = self.env, []
        qpos, qvel = env.qpos[ids], env.qvel[ids]
        for o in self.scene.movable:
            parts += [qpos[:, self.qpos[o.name]], qvel[:, self.qvel[o.name]][:, :3]]
        for d in self.scene.drawers:
            parts.append(self.opening(d.name, ids)[:, None])
        for c in self.scene.carriages:
            parts.append(env.xpos[ids, self.carriage_body[c.name]])
        return env.xp.concat(parts, axis=1) if parts else qpos[:, :0]


#: ``(view, ids) -> bool [len(ids)]``, numpy or torch like the env's fields (``view.env.xp``)
Predicate = Callable[[SceneView, np.ndarray], Any]


@dataclass
class SuiteTask(MujocoTask):
    """A declarative task of a suite (see the module docstring).

    Attributes:
        plan: the scripted expert's plan, a sequence of steps such as ``("pick_place", "cube",
            ("on", "plate"))``, ``("open", "drawer")``, ``("close", "drawer")``, ``("lift", "cube")``
            (see :mod:`sims.mujoco.suites.experts`).
        drawer_open: initial opening of each drawer (m) by name; others start closed.
        motion: dynamic behaviour: ``{"velocity": {obj: speed range}}`` and/or ``{"carriage":
            {name: (amplitude, period)}}``.
    """

    _declarative = True  # named per instance, not per class

    name: str = ""
    instruction: str = ""
    suite: str = ""
    scene: SuiteScene | None = None
    sampler: Sampler | None = None
    goals: Sequence[Predicate] = ()
    plan: Sequence[tuple] = ()
    max_steps: int = 200
    drawer_open: dict[str, float] = field(default_factory=dict)
    motion: dict[str, Any] = field(default_factory=dict)
    terminate_on_success: bool = True

    def __post_init__(self) -> None:
        assert self.scene is not None and self.sampler is not None
        self.privileged_keys = tuple(
            [(f"{o.name}", OBJ_STRIDE) for o in self.scene.movable]
            + [(f"{d.name}_opening", 1) for d in self.scene.drawers]
            + [(f"{c.name}_pos", 3) for c in self.scene.carriages]
        )

    def bind(self, env) -> None:
        super().bind(env)
        self.view = SceneView(self.scene, env)

    def sample_init(self, rng: np.random.Generator) -> dict[str, Any]:
        init: dict[str, Any] = {"placement": self.sampler(rng)}
        vel = {}
        for obj, (lo, hi) in self.motion.get("velocity", {}).items():
            speed = rng.uniform(lo, hi)
            x, y, _ = init["placement"][obj]
            # toward the middle of the workspace, with some spread
            heading = np.arctan2(-y, -0.1 - x) + rng.uniform(-0.4, 0.4)
            vel[obj] = speed * np.array([np.cos(heading), np.sin(heading)])
        init["velocity"] = vel
        init["carriage_phase"] = {c: rng.uniform(0, 2 * np.pi) for c in self.motion.get("carriage", {})}
        return init

    def initial_state(self, init_id: int) -> dict[str, Any]:
        """Plain-data description of fixed initial state ``init_id``, what ``reset(init_ids=...)`` applies
        (with the default ``init_noise``): the robot's joint offsets from home, object placements
        ``(x, y, yaw)``, initial velocities and carriage phases."""
        joints, init = self.draw_init(self.init_rng(init_id), ROBOT_INIT_NOISE)
        return {
            "init_id": init_id,
            "robot_joint_offsets": [float(v) for v in joints],
            "placement": {k: [float(v) for v in xyz] for k, xyz in sorted(init["placement"].items())},
            "velocity": {k: [float(v) for v in vel] for k, vel in sorted(init["velocity"].items())},
            "carriage_phase": {k: float(v) for k, v in sorted(init["carriage_phase"].items())},
        }

    def apply_init(self, ids: np.ndarray, inits: list[dict[str, Any]]) -> None:
        env, view = self.env, self.view
        for i, init in zip(ids, inits):
            placement = init["placement"]
            for slot, obj in enumerate(self.scene.movable):
                if obj.name in placement:
                    x, y, yaw = placement[obj.name]
                    pose = [x, y, obj.rest_z, *yaw_quat(yaw)]
                else:
                    pose = [PARK_X, -1.0 + 0.25 * slot, PARK_Z + obj.rest_z, 1, 0, 0, 0]
                env.qpos[i, view.qpos[obj.name]] = pose
                qv = np.zeros(6)
                if obj.name in init["velocity"]:
                    qv[:2] = init["velocity"][obj.name]
                    if obj.kind == "ball":  # rolling without slipping
                        r = obj.size[0]
                        qv[3:5] = [-qv[1] / r, qv[0] / r]
                env.qvel[i, view.qvel[obj.name]] = qv
            for d in self.scene.drawers:
                env.qpos[i, view.drawer_qpos[d.name]] = self.drawer_open.get(d.name, 0.0)
            for c in self.scene.carriages:
                y0 = self._carriage_target(c.name, 0.0, init["carriage_phase"].get(c.name))
                env.qpos[i, view.carriage_qpos[c.name]] = y0
                env.ctrl[i, view.carriage_act[c.name]] = y0
                for obj_name, car_name in self.motion.get("on_tray", {}).items():
                    if car_name == c.name:
                        obj = self.scene.by_name[obj_name]
                        env.qpos[i, view.qpos[obj_name]] = [c.x, y0, 2 * c.half[2] + obj.rest_z, 1, 0, 0, 0]
        if self.motion.get("carriage"):
            if not hasattr(self, "_phase"):
                self._phase = {c: np.zeros(env.num_envs) for c in self.motion["carriage"]}
            for c in self.motion["carriage"]:
                self._phase[c][ids] = [init["carriage_phase"][c] for init in inits]

    def _carriage_target(self, name: str, t: float, phase: Any) -> Any:
        if name not in self.motion.get("carriage", {}):
            return 0.0
        amplitude, period = self.motion["carriage"][name]
        return amplitude * np.sin(2 * np.pi * t / period + phase)

    def before_step(self, ids: np.ndarray) -> None:
        env = self.env
        for c in self.motion.get("carriage", {}):
            # target at the end of this control step: a smooth back-and-forth motion
            t = (env._elapsed[ids] + 1) / env.control_hz
            ctrl = env.ctrl
            ctrl[ids, self.view.carriage_act[c]] = like(self._carriage_target(c, t, self._phase[c][ids]), ctrl)

    def success(self, ids: np.ndarray) -> Any:
        ok = None
        for goal in self.goals:
            holds = goal(self.view, ids)
            ok = holds if ok is None else ok & holds
        if ok is None:
            raise ValueError(f"task {self.name!r} has no goal predicates")
        return ok

    def privileged(self, ids: np.ndarray) -> Any:
        return self.view.privileged(ids)

    def dense_reward(self, ids: np.ndarray) -> Any:
        """Shaped reward in [0, 1]: the mean over the plan's steps of a progress term, plus the
        goals. ``pick_place``/``lift``/``hold_above``: reach the object (0.25), lift it (0.25),
        bring it over its target (0.5); ``open``/``close``: the drawer's opening toward the goal.
        A step's term is 1 once its goal predicates hold, so success scores 1."""
        view, env, xp = self.view, self.env, self.env.xp
        tcp = env.tcp_pos()[ids]
        terms = []
        for step in self.plan:
            op = step[0]
            if op in ("open", "close"):
                frac = view.opening(step[1], ids) / DRAWER_TRAVEL
                terms.append(xp.clip(frac if op == "open" else 1.0 - frac, 0.0, 1.0))
                continue
            obj = step[1]
            pos = view.pos(obj, ids)
            reach = 1.0 - xp.tanh(10.0 * xp.linalg.vector_norm(tcp - pos, axis=1))
            lift = xp.clip((pos[:, 2] - self.scene.by_name[obj].rest_z) / 0.05, 0.0, 1.0)
            if op == "pick_place" or op == "hold_above":
                where = step[2][1] if op == "pick_place" else step[2]
                target = (
                    view.pos(where, ids)
                    if where not in view.carriage_body
                    else env.xpos[ids, view.carriage_body[where]]
                )
                if where in self.scene.by_name and self.scene.by_name[where].kind == "drawer":
                    target = view.site_pos(f"{where}_inside", ids)
                carry = 1.0 - xp.tanh(5.0 * xp.linalg.vector_norm(pos[:, :2] - target[:, :2], axis=1))
                terms.append(0.25 * reach + 0.25 * lift + 0.5 * carry)
            else:  # lift
                terms.append(0.5 * reach + 0.5 * lift)
        progress = xp.mean(xp.stack(terms), axis=0) if terms else xp.zeros_like(tcp[:, 0])
        done = self.success(ids)
        return xp.where(done, xp.ones_like(progress), xp.clip(progress, 0.0, 1.0) * 0.9)


# ------------------------------------------------------------------------------- predicates
def on(obj: str, support: str, radius: float | None = None) -> Predicate:
    """``obj`` rests on ``support`` (a plate or carriage): within its radius, just above its top."""

    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        o = view.scene.by_name.get(obj)
        p = view.pos(obj, ids)
        if support in view.carriage_body:
            car = next(c for c in view.scene.carriages if c.name == support)
            s = view.env.xpos[ids, view.carriage_body[support]]
            inside = (abs(p[:, 0] - s[:, 0]) < car.half[0]) & (abs(p[:, 1] - s[:, 1]) < car.half[1])
            top = s[:, 2] + car.half[2]
        else:
            sup = view.scene.by_name[support]
            s = view.pos(support, ids)
            r = radius if radius is not None else sup.size[0] - 0.01
            inside = view.env.xp.linalg.vector_norm(p[:, :2] - s[:, :2], axis=1) < r
            top = s[:, 2] + sup.size[1]
        resting = abs(p[:, 2] - (top + o.rest_z)) < 0.012
        return inside & resting

    pred.__name__ = f"On({obj},{support})"
    return pred


def inside(obj: str, container: str) -> Predicate:
    """``obj`` is inside a basket or a drawer (within its walls, below their top)."""

    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        p = view.pos(obj, ids)
        c = view.scene.by_name[container]
        if c.kind == "drawer":
            floor = view.site_pos(f"{container}_inside", ids)
            hx, hy, hz = c.size[0] - 0.02, c.size[1] - 0.02, c.size[2] * 2
        else:
            floor = view.pos(container, ids)
            hx, hy, hz = c.size[0] - 0.008, c.size[1] - 0.008, c.size[2]
        d = p - floor
        return (abs(d[:, 0]) < hx) & (abs(d[:, 1]) < hy) & (d[:, 2] > -0.01) & (d[:, 2] < hz)

    pred.__name__ = f"In({obj},{container})"
    return pred


def is_open(drawer: str, min_opening: float = 0.12) -> Predicate:
    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        return view.opening(drawer, ids) > min_opening

    pred.__name__ = f"Open({drawer})"
    return pred


def is_closed(drawer: str, max_opening: float = 0.01) -> Predicate:
    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        return view.opening(drawer, ids) < max_opening

    pred.__name__ = f"Closed({drawer})"
    return pred


def lifted(obj: str, height: float = 0.1) -> Predicate:
    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        return view.pos(obj, ids)[:, 2] > view.scene.by_name[obj].rest_z + height

    pred.__name__ = f"Lifted({obj})"
    return pred


def above(obj: str, target: str, height: float = 0.08) -> Predicate:
    """``obj`` is held over ``target`` (within its radius) at least ``height`` above the table."""

    def pred(view: SceneView, ids: np.ndarray) -> np.ndarray:
        p, s = view.pos(obj, ids), view.pos(target, ids)
        r = view.scene.by_name[target].size[0]
        return (view.env.xp.linalg.vector_norm(p[:, :2] - s[:, :2], axis=1) < r) & (p[:, 2] > height)

    pred.__name__ = f"Above({obj},{target})"
    return pred


# ------------------------------------------------------------------------------- placement
def place_apart(
    rng: np.random.Generator,
    scene: SuiteScene,
    regions: dict[str, tuple[tuple[float, float], tuple[float, float]]],
    fixed: Placement | None = None,
    margin: float = 0.025,
    tries: int = 2000,
) -> Placement:
    """Sample ``(x, y, yaw)`` per object in its region so footprints do not overlap.

    Objects are placed in the order of ``regions``; ``fixed`` ones are kept as given.
    """
    placed: Placement = dict(fixed or {})
    for name, ((x0, x1), (y0, y1)) in regions.items():
        obj = scene.by_name[name]
        for _ in range(tries):
            x, y = rng.uniform(x0, x1), rng.uniform(y0, y1)
            clear = all(
                np.hypot(x - px, y - py) > obj.footprint + scene.by_name[other].footprint + margin
                for other, (px, py, _) in placed.items()
            )
            if clear:
                placed[name] = (x, y, rng.uniform(-np.pi / 4, np.pi / 4))
                break
        else:
            raise RuntimeError(f"could not place {name!r} in region {regions[name]} without overlap")
    return placed
