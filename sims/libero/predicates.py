"""LIBERO's BDDL goal predicates on our MuJoCo state, for an exported scene.

A task succeeds when every predicate of its goal holds (``meta.json["goal_state"]``, e.g.
``[["on", "akita_black_bowl_1", "plate_1"]]``). The predicates are LIBERO's (``envs/predicates``,
``envs/object_states``, ``envs/objects``), evaluated on an ``MjData`` after ``mj_forward``:

- ``on A B``: B an object: A's root body is not below B's, A and B touch, and their centres are
  within 3 cm horizontally; B a site (a region or a fixture's surface): A's position in the site's
  frame is within the site's half-extents horizontally and between its top face minus 5 mm and
  10 cm above it, and, where the site has a parent fixture, A touches that fixture;
- ``in A B`` (B a site): A's position inside the site's box (its half-extents rotated into the world,
  as absolute values; 1 cm of slack below);
- ``open`` / ``close`` / ``turnon`` / ``turnoff`` X: X's joints (a site's: its own joints, judged by
  its parent's class) against the thresholds of X's class (:data:`ARTICULATION`); ``open`` and
  ``turnon`` need one joint, ``close`` and ``turnoff`` all;
- ``up A``: A's root body at or above z = 1 m.

"Touch" is any active contact between collision geoms of the two objects' bodies.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import mujoco
import numpy as np

#: per articulated class, predicate -> (comparison of a joint's qpos, threshold) (LIBERO's
#: ``articulated_objects.py``: the ``max``/``min`` of each class's default ranges)
_CABINET = {"open": ("<", -0.14), "close": (">", 0.0)}
_STOVE = {"turnon": (">=", 0.5), "turnoff": ("<", 0.0)}
ARTICULATION: dict[str, dict[str, tuple[str, float]]] = {
    "Microwave": {"open": ("<", -1.3), "close": (">", -0.005)},
    "ShortCabinet": {"open": (">", 0.10), "close": ("<", 0.0)},
    "ShortFridge": {"open": (">", 2.0), "close": ("<", 0.0)},
    "WoodenCabinet": _CABINET,
    "YellowCabinet": _CABINET,
    "WhiteCabinet": _CABINET,
    "FlatStove": _STOVE,
    "YellowStove": _STOVE,
}
_OPS: dict[str, Callable[[float, float], bool]] = {"<": operator.lt, ">": operator.gt, ">=": operator.ge}
#: which predicates need one joint (any) and which need all
_ANY = {"open", "turnon"}
ON_XY = 0.03  # on an object: horizontal distance of the centres
UNDER_HEIGHT = 0.10  # on a site: how far above its top face
UNDER_SLACK = 0.005
IN_SLACK = 0.01


class GoalChecker:
    """The goal of one exported LIBERO task (its ``meta.json``) on a model of its scene."""

    def __init__(self, model: mujoco.MjModel, meta: dict[str, Any]) -> None:
        self.model, self.meta = model, meta
        self._ids: dict[tuple[int, str], int] = {}
        self.goal: list[list[str]] = [list(p) for p in meta["goal_state"]]
        self.things = {**meta["objects"], **meta["fixtures"]}
        self.sites = meta["sites"]
        for pred in self.goal:
            if pred[0] not in ("on", "in", "open", "close", "turnon", "turnoff", "up"):
                raise ValueError(
                    f"predicate {pred[0]!r} of {pred} is not implemented; have on, in, open, close, turnon, turnoff, up"
                )
            for name in pred[1:]:
                if name not in self.things and name not in self.sites:
                    raise ValueError(f"{pred}: no object, fixture or site {name!r} in this task")
        self._geoms = {name: self._collision_geoms(info["bodies"]) for name, info in self.things.items()}

    def _id(self, kind: mujoco.mjtObj, name: str) -> int:
        """The model id of ``name`` (looked up once: predicates are judged every step)."""
        key = (int(kind), name)
        if key not in self._ids:
            i = mujoco.mj_name2id(self.model, kind, name)
            if i < 0:
                raise ValueError(f"the scene has no {kind.name[6:].lower()} {name!r}")
            self._ids[key] = i
        return self._ids[key]

    def _collision_geoms(self, bodies: list[str]) -> frozenset[int]:
        ids = {self._id(mujoco.mjtObj.mjOBJ_BODY, b) for b in bodies}
        m = self.model
        return frozenset(
            g for g in range(m.ngeom) if int(m.geom_bodyid[g]) in ids and (m.geom_contype[g] or m.geom_conaffinity[g])
        )

    # -- what the predicates read ---------------------------------------------------------------
    def position(self, data: mujoco.MjData, name: str) -> np.ndarray:
        """An object's root body position, or a site's position ``[3]``."""
        if name in self.sites:
            return data.site_xpos[self._id(mujoco.mjtObj.mjOBJ_SITE, self.sites[name]["site"])]
        return data.xpos[self._id(mujoco.mjtObj.mjOBJ_BODY, self.things[name]["root_body"])]

    def touching(self, data: mujoco.MjData, a: str, b: str) -> bool:
        ga, gb = self._geoms[a], self._geoms[b]
        for c in data.contact[: data.ncon]:
            g1, g2 = int(c.geom1), int(c.geom2)
            if (g1 in ga and g2 in gb) or (g1 in gb and g2 in ga):
                return True
        return False

    def _joint_values(self, data: mujoco.MjData, name: str) -> tuple[list[float], str]:
        if name in self.sites:
            site = self.sites[name]
            joints, cls = site["joints"] or [], self.things[site["parent"]]["class"] if site["parent"] else ""
        else:
            joints, cls = self.things[name]["joints"], self.things[name]["class"]
        values = []
        for j in joints:
            jid = self._id(mujoco.mjtObj.mjOBJ_JOINT, j)
            if int(self.model.jnt_type[jid]) not in (
                int(mujoco.mjtJoint.mjJNT_HINGE),
                int(mujoco.mjtJoint.mjJNT_SLIDE),
            ):
                raise ValueError(f"{name}: joint {j!r} is not a hinge or slide; its state has no open/close threshold")
            values.append(float(data.qpos[self.model.jnt_qposadr[jid]]))
        return values, cls

    # -- the predicates -------------------------------------------------------------------------
    def holds(self, data: mujoco.MjData, pred: list[str]) -> bool:
        """Whether predicate ``pred`` (e.g. ``["on", "bowl_1", "plate_1"]``) holds in ``data``."""
        name, args = pred[0], pred[1:]
        if name == "up":
            return bool(self.position(data, args[0])[2] >= 1.0)
        if name in ("on", "in"):
            a, b = args
            pa = np.asarray(self.position(data, a))
            if b not in self.sites:
                if name == "in":
                    raise ValueError(f"{pred}: 'in' an object (not a site) is not implemented")
                pb = np.asarray(self.position(data, b))
                return bool(pb[2] <= pa[2] and self.touching(data, b, a) and np.linalg.norm(pa[:2] - pb[:2]) < ON_XY)
            site = self.sites[b]
            sid = self._id(mujoco.mjtObj.mjOBJ_SITE, site["site"])
            ps, mat, size = data.site_xpos[sid], data.site_xmat[sid].reshape(3, 3), np.asarray(site["size"])
            if name == "in":
                half = np.abs(mat @ size)
                lo, hi = ps - half, ps + half
                lo[2] -= IN_SLACK
                return bool(np.all(pa > lo) and np.all(pa < hi))
            local = mat @ (pa - ps)
            under = (size[2] - UNDER_SLACK < local[2] < size[2] + UNDER_HEIGHT) and bool(
                np.all(np.abs(local[:2]) < size[:2])
            )
            return bool(under and (site["parent"] is None or self.touching(data, site["parent"], a)))
        values, cls = self._joint_values(data, args[0])
        if cls not in ARTICULATION or name not in ARTICULATION[cls]:
            raise ValueError(f"{pred}: class {cls!r} has no {name!r} threshold; known: {sorted(ARTICULATION)}")
        op, threshold = ARTICULATION[cls][name]
        results = [_OPS[op](v, threshold) for v in values]
        return any(results) if name in _ANY else all(results)

    def truth(self, data: mujoco.MjData) -> list[bool]:
        """Each goal predicate's truth in ``data`` (after ``mj_forward``)."""
        return [self.holds(data, p) for p in self.goal]

    def success(self, data: mujoco.MjData) -> bool:
        return all(self.truth(data))
