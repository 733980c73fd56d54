"""Objects of the LIBERO-style scenes, built from primitives with ``mujoco.MjSpec``.

Every movable object is a body with a free joint ``<name>_joint``. Fixtures (drawer cabinet)
are welded to the table; the drawer slides on ``<name>_slide``. Objects not used by the task an
env runs are parked on a hidden shelf outside the cameras' view (:data:`PARK_X`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from sims.mujoco.scene import WORLD_CONAFFINITY, WORLD_CONTYPE

PARK_X = 2.5  # parking shelf, far outside both cameras' view
PARK_Z = 0.0
HANDLE_OUT = 0.075  # drawer handle bar distance in front of the drawer face (room for the fingers)
DRAWER_TRAVEL = 0.16

COLORS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.12, 0.1, 1.0),
    "blue": (0.12, 0.25, 0.85, 1.0),
    "green": (0.1, 0.7, 0.2, 1.0),
    "yellow": (0.95, 0.8, 0.1, 1.0),
    "purple": (0.55, 0.2, 0.7, 1.0),
    "orange": (0.95, 0.5, 0.1, 1.0),
    "white": (0.92, 0.92, 0.92, 1.0),
    "brown": (0.45, 0.3, 0.18, 1.0),
    "gray": (0.5, 0.5, 0.55, 1.0),
}


@dataclass(frozen=True)
class ObjectSpec:
    """A scene object.

    Attributes:
        name: body name (unique in the scene).
        kind: ``cube`` | ``cylinder`` | ``ball`` | ``plate`` | ``basket`` | ``drawer``.
        color: key of :data:`COLORS`.
        size: kind-specific half-extents (m): cube ``(h,)``, cylinder ``(r, h)``, ball ``(r,)``,
            plate ``(r, h)``, basket ``(half_x, half_y, wall_h)``, drawer ``(half_x, half_y, half_z)``.
        mass: kg.
        friction: sliding friction with the table (low values make sliding objects).
    """

    name: str
    kind: str
    color: str = "red"
    size: tuple[float, ...] = (0.02,)
    mass: float = 0.05
    friction: float = 1.0
    extra: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def rest_z(self) -> float:
        """Height of the body origin when the object rests on the table."""
        if self.kind in ("cube", "ball"):
            return self.size[0]
        if self.kind in ("cylinder", "plate"):
            return self.size[1]
        if self.kind == "basket":
            return 0.005
        return 0.0

    @property
    def footprint(self) -> float:
        """Radius of a disc covering the object on the table (for collision-free placement)."""
        if self.kind in ("cube",):
            return self.size[0] * 1.45
        if self.kind in ("cylinder", "ball", "plate"):
            return self.size[0]
        if self.kind == "basket":
            return float(np.hypot(self.size[0], self.size[1])) + 0.01
        return float(np.hypot(self.size[0], self.size[1]))

    @property
    def graspable(self) -> bool:
        return self.kind in ("cube", "cylinder", "ball")


def cube(name: str, color: str, half: float = 0.02, **kw) -> ObjectSpec:
    return ObjectSpec(name, "cube", color, (half,), **kw)


def cylinder(name: str, color: str, radius: float = 0.02, half_height: float = 0.025, **kw) -> ObjectSpec:
    return ObjectSpec(name, "cylinder", color, (radius, half_height), **kw)


def ball(name: str, color: str, radius: float = 0.022, **kw) -> ObjectSpec:
    return ObjectSpec(name, "ball", color, (radius,), **kw)


def plate(name: str = "plate", color: str = "white", radius: float = 0.065, **kw) -> ObjectSpec:
    kw.setdefault("mass", 0.4)
    return ObjectSpec(name, "plate", color, (radius, 0.006), **kw)


def basket(name: str = "basket", color: str = "brown", **kw) -> ObjectSpec:
    kw.setdefault("mass", 2.0)
    return ObjectSpec(name, "basket", color, (0.08, 0.08, 0.05), **kw)


def drawer(name: str = "drawer", color: str = "gray", **kw) -> ObjectSpec:
    return ObjectSpec(name, "drawer", color, (0.09, 0.1, 0.06), **kw)


def _geom_kw(obj: ObjectSpec) -> dict:
    # priority 1: an object's own friction rules its contact with the table (a low value makes
    # it slide); the fingers have priority 2, so grasping always uses the fingers' friction.
    return dict(
        rgba=list(COLORS[obj.color]),
        contype=WORLD_CONTYPE,
        conaffinity=WORLD_CONAFFINITY,
        condim=4,
        friction=[obj.friction, 0.01, 0.001],
        solref=[0.01, 1.0],
        priority=1,
    )


def add_object(spec: mujoco.MjSpec, obj: ObjectSpec, park_slot: int) -> None:
    """Add ``obj`` to ``spec``; movable objects start on the parking shelf at ``park_slot``."""
    world = spec.worldbody
    park = [PARK_X, -1.0 + 0.25 * park_slot, PARK_Z + obj.rest_z]
    g = mujoco.mjtGeom
    if obj.kind == "drawer":
        _add_drawer(spec, obj)
        return
    body = world.add_body(name=obj.name, pos=park)
    body.add_freejoint(name=f"{obj.name}_joint")
    kw = _geom_kw(obj)
    if obj.kind == "cube":
        body.add_geom(name=obj.name, type=g.mjGEOM_BOX, size=[obj.size[0]] * 3, mass=obj.mass, **kw)
    elif obj.kind == "cylinder":
        body.add_geom(name=obj.name, type=g.mjGEOM_CYLINDER, size=[obj.size[0], obj.size[1], 0], mass=obj.mass, **kw)
    elif obj.kind == "ball":
        kw["condim"] = 6  # rolling friction so a rolling ball slows down
        kw["friction"] = [obj.friction, 0.005, 0.0002]
        body.add_geom(name=obj.name, type=g.mjGEOM_SPHERE, size=[obj.size[0], 0, 0], mass=obj.mass, **kw)
    elif obj.kind == "plate":
        body.add_geom(name=obj.name, type=g.mjGEOM_CYLINDER, size=[obj.size[0], obj.size[1], 0], mass=obj.mass, **kw)
    elif obj.kind == "basket":
        hx, hy, wall = obj.size
        t = 0.005
        body.add_geom(name=obj.name, type=g.mjGEOM_BOX, size=[hx, hy, t], mass=obj.mass * 0.4, **kw)
        for sx, sy, size in (
            (1, 0, [t, hy, wall / 2]),
            (-1, 0, [t, hy, wall / 2]),
            (0, 1, [hx, t, wall / 2]),
            (0, -1, [hx, t, wall / 2]),
        ):
            body.add_geom(
                type=g.mjGEOM_BOX, size=size, pos=[sx * (hx - t), sy * (hy - t), wall / 2], mass=obj.mass * 0.15, **kw
            )
    else:
        raise ValueError(f"unknown object kind {obj.kind!r}")


def _add_drawer(spec: mujoco.MjSpec, obj: ObjectSpec) -> None:
    """A cabinet welded to the table, opening toward the robot (-x); drawer on a slide joint.

    The cabinet is placed by the task through the mocap-free route of moving its body position
    at build time: its pose is ``obj.extra["pos"]`` (x, y) on the table.
    """
    g = mujoco.mjtGeom
    hx, hy, hz = obj.size
    x, y = obj.extra.get("pos", (0.2, 0.18))
    t = 0.008
    kw = _geom_kw(obj)
    cab = spec.worldbody.add_body(name=f"{obj.name}_cabinet", pos=[x, y, hz])
    # top, bottom, back, two sides; open toward -x.
    for pos, size in (
        ([0, 0, hz - t], [hx, hy, t]),
        ([0, 0, -hz + t], [hx, hy, t]),
        ([hx - t, 0, 0], [t, hy, hz]),
        ([0, hy - t, 0], [hx, t, hz]),
        ([0, -hy + t, 0], [hx, t, hz]),
    ):
        cab.add_geom(type=g.mjGEOM_BOX, pos=pos, size=size, **kw)
    dk = dict(kw, rgba=[0.75, 0.75, 0.78, 1.0])
    box = cab.add_body(name=obj.name, pos=[0, 0, 0])
    box.add_joint(
        name=f"{obj.name}_slide",
        type=mujoco.mjtJoint.mjJNT_SLIDE,
        axis=[-1, 0, 0],
        range=[0.0, DRAWER_TRAVEL],
        damping=8.0,
        armature=0.05,
        frictionloss=6.0,
    )
    inner_hx, inner_hy, inner_hz = hx - 2 * t, hy - 2 * t - 0.004, hz - 2 * t - 0.004
    for pos, size in (
        ([0, 0, -inner_hz + t], [inner_hx, inner_hy, t]),  # floor
        ([-inner_hx + t, 0, 0], [t, inner_hy, inner_hz]),  # front panel
        ([inner_hx - t, 0, 0], [t, inner_hy, inner_hz]),  # back panel
        ([0, inner_hy - t, 0], [inner_hx, t, inner_hz]),
        ([0, -inner_hy + t, 0], [inner_hx, t, inner_hz]),
    ):
        box.add_geom(type=g.mjGEOM_BOX, pos=pos, size=size, mass=0.2, **dk)
    # Handle: a bar along y in front of the front panel, reachable from above.
    hk = dict(kw, rgba=[0.15, 0.15, 0.15, 1.0])
    for sy in (-1, 1):
        box.add_geom(
            type=g.mjGEOM_BOX,
            pos=[-inner_hx - HANDLE_OUT / 2, sy * 0.045, 0.0],
            size=[HANDLE_OUT / 2, 0.005, 0.006],
            mass=0.01,
            **hk,
        )
    box.add_geom(
        name=f"{obj.name}_handle",
        type=g.mjGEOM_BOX,
        pos=[-inner_hx - HANDLE_OUT, 0, 0.0],
        size=[0.007, 0.05, 0.007],
        mass=0.02,
        **hk,
    )
    box.add_site(name=f"{obj.name}_handle", pos=[-inner_hx - HANDLE_OUT, 0, 0.0], group=5)
    box.add_site(name=f"{obj.name}_inside", pos=[0, 0, -inner_hz + 2 * t], group=5)
