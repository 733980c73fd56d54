"""The Franka Panda with its parallel gripper, as an ``mujoco.MjSpec``.

Source: the Panda MJCF and meshes shipped in the ``gymnasium-robotics`` wheel
(``envs/assets/kitchen_franka/franka_assets``, Apache-2.0). Only its files are used: the package
is located without being imported. We rebuild what matters for learning:

- visuals are the low-poly collision meshes (~200-300 triangles per link instead of ~10-20k):
  CPU rendering cost follows triangle count;
- actuators are our own position servos (stiff, critically damped) with gravity compensation,
  so a 20 Hz end-effector controller tracks its targets within one control step;
- joints are exposed in the real Panda's convention: this model's joint 6 is offset by -pi/2
  from the real robot's, see :data:`JOINT_OFFSET`.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from sims.mujoco.arrays import like

ARM_JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
FINGER_JOINTS = ("panda_finger_joint1", "panda_finger_joint2")
TCP_SITE = "tcp"
HAND_BODY = "panda_hand"

#: real-robot joint angle = simulated joint angle + JOINT_OFFSET (radians).
JOINT_OFFSET = np.array([0.0, 0.0, 0.0, 0.0, 0.0, math.pi / 2, 0.0])
#: real Panda joint limits (radians), from Franka's published constants.
REAL_JOINT_LOWER = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
REAL_JOINT_UPPER = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
#: the classic "ready" pose in the real convention: gripper pointing down.
HOME_QPOS_REAL = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
FINGER_MAX = 0.04  # metres per finger, fully open
#: the entries of the robot's state vector (``obs["state"]``, and what a real robot reports): TCP
#: position, TCP quaternion w,x,y,z, gripper width (m), arm joints in the real convention
STATE_NAMES = (
    "tcp_x",
    "tcp_y",
    "tcp_z",
    "tcp_qw",
    "tcp_qx",
    "tcp_qy",
    "tcp_qz",
    "gripper_width",
    "joint1",
    "joint2",
    "joint3",
    "joint4",
    "joint5",
    "joint6",
    "joint7",
)
#: the entries of an end-effector delta action (``action_mode="ee_delta"``)
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
# Servo gains (N m / rad, N m s / rad). The same kv/kp ratio (20 ms) on every joint keeps the
# lag equal across joints, so a Cartesian step is realised along its direction (~93% of it within
# one 50 ms control step); armature keeps the stiff servo stable at a 2 ms physics step.
_KP = (4500.0, 4500.0, 4500.0, 4500.0, 2000.0, 2000.0, 2000.0)
_KV = (90.0, 90.0, 90.0, 90.0, 40.0, 40.0, 40.0)
_ARMATURE = 0.1
_FORCE = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)


class MissingAssetError(FileNotFoundError):
    """A robot or object model file is not installed."""


def franka_asset_dir() -> Path:
    """Folder holding the Panda MJCF files and meshes (inside the gymnasium-robotics wheel)."""
    spec = importlib.util.find_spec("gymnasium_robotics")
    if spec is None or not spec.submodule_search_locations:
        raise MissingAssetError(
            "the Panda model ships in the 'gymnasium-robotics' package, which is not installed: "
            "run `pip install gymnasium-robotics==1.4.2` (or the README's set-up command)"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    folder = root / "envs" / "assets" / "kitchen_franka" / "franka_assets"
    if not (folder / "chain.xml").is_file():
        raise MissingAssetError(f"Panda model files not found under {folder}: reinstall gymnasium-robotics")
    return folder


def _strip_include(text: str) -> str:
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"</?mujocoinclude>", "", text)


def _panda_xml(folder: Path) -> str:
    assets = _strip_include((folder / "assets.xml").read_text())
    chain = _strip_include((folder / "chain.xml").read_text())
    # Collision meshes only: the visual ones are 50x heavier to render.
    assets = re.sub(r'<mesh name="\w+_viz"[^>]*/>', "", assets)
    chain = re.sub(r'<geom[^>]*class="panda_viz"[^>]*/>', "", chain)
    assets = assets.replace('meshdir="franka_assets/meshes"', f'meshdir="{folder / "meshes"}"')
    # Names in our convention.
    chain = re.sub(r"robot:panda0_joint(\d)", r"panda_joint\1", chain)
    chain = chain.replace("robot:panda0_finger_joint", "panda_finger_joint")
    chain = chain.replace('name="panda0_', 'name="panda_')
    return f'<mujoco model="panda">{assets}<worldbody>{chain}</worldbody></mujoco>'


def build_panda(base_pos: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> mujoco.MjSpec:
    """A spec holding the Panda at ``base_pos``, with servos, gravity compensation and a TCP site.

    Robot geoms collide with the world (``contype=2``, ``conaffinity=1``) but not with each other.
    """
    spec = mujoco.MjSpec.from_string(_panda_xml(franka_asset_dir()))
    spec.compiler.degree = False
    link0 = spec.body("panda_link0")
    link0.pos = base_pos
    # Remove the original (sluggish, joint-damped) actuators' leftovers: none were included;
    # the user fields of the source defaults are irrelevant to us.
    for body in spec.bodies:
        if body.name.startswith("panda_"):
            body.gravcomp = 1.0
    for geom in spec.geoms:
        geom.contype = 2
        geom.conaffinity = 1
        geom.group = 0
        geom.rgba = [0.92, 0.92, 0.95, 1.0]
    for name, kp, kv, frc in zip(ARM_JOINTS, _KP, _KV, _FORCE):
        joint = spec.joint(name)
        joint.damping = [0.0, 0.0, 0.0]
        joint.armature = _ARMATURE
        joint.actfrcrange = [-frc, frc]
        joint.actfrclimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act = spec.add_actuator(name=name, target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=kp, kv=kv)
        act.ctrlrange = joint.range
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
    for name in FINGER_JOINTS:
        joint = spec.joint(name)
        joint.damping = [5.0, 0.0, 0.0]
        joint.armature = 0.1
        for geom in spec.body(
            name.replace("panda_finger_joint1", "panda_leftfinger").replace("panda_finger_joint2", "panda_rightfinger")
        ).geoms:
            geom.rgba = [0.3, 0.3, 0.33, 1.0]
            geom.friction = [1.5, 0.05, 0.001]
            geom.condim = 4
            geom.priority = 2  # finger friction rules every grasp
    # Both fingers follow one command: the second is tied to the first by an equality.
    spec.add_equality(
        type=mujoco.mjtEq.mjEQ_JOINT,
        name1=FINGER_JOINTS[0],
        name2=FINGER_JOINTS[1],
        data=[0, 1, 0, 0, 0] + [0] * 7,
        solref=[0.005, 1],
    )
    grip = spec.add_actuator(name="gripper", target=FINGER_JOINTS[0], trntype=mujoco.mjtTrn.mjTRN_JOINT)
    grip.set_to_position(kp=800.0, kv=20.0)
    grip.ctrlrange = [0.0, FINGER_MAX]
    grip.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
    grip.forcerange = [-60.0, 60.0]
    grip.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    # The source file's site sits between the fingertips; rename it as our TCP.
    site = spec.site("end_effector")
    site.name = TCP_SITE
    site.pos = [0.0, 0.0, 0.2304]  # between the finger pads
    site.group = 5
    spec.body("panda_link7").add_body(name=HAND_BODY, pos=[0, 0, 0.107], quat=[0.92388, 0, 0, -0.382683])
    return spec


def home_qpos_sim() -> np.ndarray:
    """Home arm pose ``[7]`` in this model's convention."""
    return HOME_QPOS_REAL - JOINT_OFFSET


def to_real_joints(q_sim: Any) -> Any:
    """Simulated arm angles ``[..., 7]`` (numpy or torch) -> real Panda convention."""
    return q_sim + like(JOINT_OFFSET, q_sim)


def to_sim_joints(q_real: Any) -> Any:
    """Real Panda arm angles ``[..., 7]`` (numpy or torch) -> this model's convention."""
    return q_real - like(JOINT_OFFSET, q_real)
