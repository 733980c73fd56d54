"""Tabletop scene family built programmatically with ``mujoco.MjSpec``.

World frame: the table top is the plane z = 0, its centre at the origin; x points away from the
robot, whose base stands at ``ROBOT_BASE``. Objects are placed in the workspace around the
origin. Two cameras: ``agentview`` (in front of the table, looking at the robot) and ``wrist``
(on the hand, looking along the gripper).

Rendering-cost choices (CPU rendering follows triangle count and passes): low-poly geometry,
no shadows, no reflections, no multisampling, no skybox.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from sims.mujoco.robot import HAND_BODY, build_panda

TABLE_HALF = (0.45, 0.6, 0.025)
ROBOT_BASE = (-0.62, 0.0, 0.0)
PHYSICS_TIMESTEP = 0.002
CAMERAS = ("agentview", "wrist")

# Collision classes: robot geoms are contype 2 / conaffinity 1 (no self-collision);
# world and objects are contype 1 / conaffinity 3 (collide with everything).
WORLD_CONTYPE, WORLD_CONAFFINITY = 1, 3


def look_at_quat(pos: np.ndarray, target: np.ndarray, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Quaternion (w, x, y, z) of a MuJoCo camera at ``pos`` looking at ``target``.

    MuJoCo cameras look along their -z axis with +y up.
    """
    fwd = np.asarray(target, float) - np.asarray(pos, float)
    fwd /= np.linalg.norm(fwd)
    z = -fwd
    x = np.cross(np.asarray(up, float), z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    mat = np.stack([x, y, z], axis=1)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.reshape(-1))
    return quat


@dataclass(frozen=True)
class SceneOptions:
    """Scene-level settings.

    Attributes:
        image_size: square render size (pixels) of every camera; sets the offscreen buffer.
        timestep: physics step (s).
        table_top_plane: objects collide with a plane at the table top instead of the table's box
            (the box stays, visual only). Used for MuJoCo Warp 4.0.0, whose convex cylinder-box
            collision with the table's box sometimes returned a phantom contact about the table's
            half-width deep that launched the can (public reports describe the same for box-box
            pairs with large boxes); plane contacts are primitive. The plane is unbounded: an
            object pushed past the table edge rests at table height.
    """

    image_size: int = 128
    timestep: float = PHYSICS_TIMESTEP
    table_top_plane: bool = False


def build_tabletop(options: SceneOptions = SceneOptions()) -> mujoco.MjSpec:
    """Panda on a table with lights, floor and the two cameras; tasks add their objects."""
    spec = build_panda(base_pos=ROBOT_BASE)
    spec.modelname = "tabletop"
    spec.option.timestep = options.timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.option.impratio = 10.0
    vis = spec.visual
    vis.global_.offwidth = max(options.image_size, 64)
    vis.global_.offheight = max(options.image_size, 64)
    vis.quality.offsamples = 0
    vis.quality.shadowsize = 0
    vis.headlight.ambient = [0.4, 0.4, 0.4]
    vis.headlight.diffuse = [0.5, 0.5, 0.5]

    world = spec.worldbody
    world.add_light(
        pos=[0.3, 0.0, 1.6], dir=[-0.2, 0.0, -1.0], castshadow=False, diffuse=[0.6, 0.6, 0.6], specular=[0.1, 0.1, 0.1]
    )
    world.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[2.0, 2.0, 0.1],
        pos=[0, 0, -0.75],
        rgba=[0.35, 0.37, 0.4, 1],
        contype=WORLD_CONTYPE,
        conaffinity=WORLD_CONAFFINITY,  # what falls off the table lands here
    )
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=list(TABLE_HALF),
        pos=[-0.1, 0.0, -TABLE_HALF[2]],
        rgba=[0.62, 0.48, 0.35, 1],
        contype=0 if options.table_top_plane else WORLD_CONTYPE,
        conaffinity=0 if options.table_top_plane else WORLD_CONAFFINITY,
        friction=[1.0, 0.005, 0.0001],
    )
    if options.table_top_plane:  # invisible (alpha 0): the images stay those of the box
        world.add_geom(
            name="table_top",
            type=mujoco.mjtGeom.mjGEOM_PLANE,
            size=[TABLE_HALF[0], TABLE_HALF[1], 0.01],
            pos=[-0.1, 0.0, 0.0],
            rgba=[0.62, 0.48, 0.35, 0],
            contype=WORLD_CONTYPE,
            conaffinity=WORLD_CONAFFINITY,
            friction=[1.0, 0.005, 0.0001],
        )
    for sx in (-1, 1):
        for sy in (-1, 1):
            world.add_geom(
                type=mujoco.mjtGeom.mjGEOM_BOX,
                size=[0.025, 0.025, 0.36],
                pos=[-0.1 + sx * 0.4, sy * 0.55, -0.41],
                rgba=[0.4, 0.3, 0.2, 1],
                contype=0,
                conaffinity=0,
            )
    agent_pos = np.array([0.62, 0.0, 0.58])
    world.add_camera(
        name="agentview",
        pos=agent_pos.tolist(),
        quat=look_at_quat(agent_pos, np.array([-0.2, 0.0, 0.1])).tolist(),
        fovy=55.0,
    )
    # Wrist camera on the hand, offset along +x of the hand, looking down the gripper.
    wrist_pos = np.array([0.08, 0.0, 0.0])
    spec.body(HAND_BODY).add_camera(
        name="wrist",
        pos=wrist_pos.tolist(),
        quat=look_at_quat(wrist_pos, np.array([0.0, 0.0, 0.3]), up=(1.0, 0.0, 0.0)).tolist(),
        fovy=70.0,
    )
    return spec


def add_box(
    spec: mujoco.MjSpec, name: str, half: tuple[float, float, float], rgba, *, mass: float = 0.05, free: bool = True
) -> mujoco.MjsBody:
    """A box object with a free joint named ``<name>_joint`` (placed by the task on reset)."""
    body = spec.worldbody.add_body(name=name, pos=[0, 0, half[2]])
    if free:
        body.add_freejoint(name=f"{name}_joint")
    body.add_geom(
        name=name,
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=list(half),
        rgba=list(rgba),
        mass=mass,
        contype=WORLD_CONTYPE,
        conaffinity=WORLD_CONAFFINITY,
        condim=4,
        friction=[1.0, 0.01, 0.001],
        solref=[0.01, 1.0],
    )
    return body


def add_marker(spec: mujoco.MjSpec, name: str, radius: float, rgba, *, flat: bool = False) -> mujoco.MjsBody:
    """A non-colliding visual target on a mocap body: its pose is per-env state (mocap_pos)."""
    body = spec.worldbody.add_body(name=name, mocap=True, pos=[0, 0, 0])
    if flat:
        body.add_geom(
            type=mujoco.mjtGeom.mjGEOM_CYLINDER,
            size=[radius, 0.001, 0],
            rgba=list(rgba),
            contype=0,
            conaffinity=0,
            group=1,
        )
    else:
        body.add_geom(
            type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[radius, 0, 0], rgba=list(rgba), contype=0, conaffinity=0, group=1
        )
    return body
