"""Suite ``spatial``: two identical red cubes; the instruction names the target by its relation
to landmarks (plate, basket, blue can) or to the robot. The layout varies per initial state."""

from __future__ import annotations

import numpy as np

from sims.mujoco.suites.base import SuiteScene, SuiteTask, inside, on, place_apart
from sims.mujoco.suites.objects import basket, cube, cylinder, plate

SUITE = "spatial"
X, Y = (-0.2, 0.08), (-0.22, 0.22)


def scene() -> SuiteScene:
    return SuiteScene([cube("cube_a", "red"), cube("cube_b", "red"), plate(), basket(), cylinder("can", "blue")])


def _near(rng, anchor, dist=(0.1, 0.12)):
    ang = rng.uniform(0, 2 * np.pi)
    d = rng.uniform(*dist)
    return (anchor[0] + d * np.cos(ang), anchor[1] + d * np.sin(ang))


def _sampler(kind: str):
    """Layouts in which the relation in the instruction picks out ``cube_a`` alone."""

    def sample(rng: np.random.Generator):
        sc = _SCENE
        for _ in range(1000):
            base = place_apart(rng, sc, {"plate": (X, Y), "basket": (X, Y), "can": (X, Y)}, margin=0.04)
            a_xy = b_xy = None
            if kind in ("near_plate", "near_can", "near_basket"):
                anchor = base[{"near_plate": "plate", "near_can": "can", "near_basket": "basket"}[kind]]
                d = {"near_plate": (0.12, 0.14), "near_can": (0.1, 0.12), "near_basket": (0.16, 0.18)}[kind]
                a_xy = _near(rng, anchor, d)
                b_xy = (rng.uniform(*X), rng.uniform(*Y))
                if (
                    np.hypot(b_xy[0] - anchor[0], b_xy[1] - anchor[1])
                    < np.hypot(a_xy[0] - anchor[0], a_xy[1] - anchor[1]) + 0.1
                ):
                    continue
            elif kind in ("closest", "farthest"):
                xs = sorted([rng.uniform(*X), rng.uniform(*X)])
                if xs[1] - xs[0] < 0.12:
                    continue
                ax, bx = (xs[0], xs[1]) if kind == "closest" else (xs[1], xs[0])
                a_xy, b_xy = (ax, rng.uniform(*Y)), (bx, rng.uniform(*Y))
            elif kind in ("left", "right"):
                ys = sorted([rng.uniform(*Y), rng.uniform(*Y)])
                if ys[1] - ys[0] < 0.15:
                    continue
                ay, by = (ys[1], ys[0]) if kind == "left" else (ys[0], ys[1])  # left = +y seen from the robot
                a_xy, b_xy = (rng.uniform(*X), ay), (rng.uniform(*X), by)
            elif kind == "between":
                p, b = np.array(base["plate"][:2]), np.array(base["basket"][:2])
                if np.linalg.norm(p - b) < 0.34:
                    continue
                a_xy = tuple(0.5 * (p + b) + rng.uniform(-0.015, 0.015, 2))
                b_xy = (rng.uniform(*X), rng.uniform(*Y))
            elif kind == "on_plate":
                a_xy = tuple(np.array(base["plate"][:2]) + rng.uniform(-0.01, 0.01, 2))
                b_xy = (rng.uniform(*X), rng.uniform(*Y))
            if not (X[0] - 0.02 <= a_xy[0] <= X[1] and Y[0] <= a_xy[1] <= Y[1]):
                continue
            placed = dict(base)
            ok = True
            for name, xy in (("cube_a", a_xy), ("cube_b", b_xy)):
                skip = {"plate"} if (name == "cube_a" and kind == "on_plate") else set()
                clear = all(
                    np.hypot(xy[0] - px, xy[1] - py) > sc.by_name[name].footprint + sc.by_name[o].footprint + 0.02
                    for o, (px, py, _) in placed.items()
                    if o not in skip
                )
                if not clear:
                    ok = False
                    break
                placed[name] = (xy[0], xy[1], rng.uniform(-np.pi / 4, np.pi / 4))
            if ok:
                return placed
        raise RuntimeError(f"no layout found for spatial relation {kind!r}")

    return sample


_SCENE = scene()

_TASKS = [
    (
        "pick_cube_next_to_plate_place_on_plate",
        "pick up the cube next to the plate and place it on the plate",
        "near_plate",
        ("on", "plate"),
    ),
    (
        "pick_closest_cube_place_on_plate",
        "pick up the cube closest to the robot and place it on the plate",
        "closest",
        ("on", "plate"),
    ),
    (
        "pick_farthest_cube_place_on_plate",
        "pick up the cube farthest from the robot and place it on the plate",
        "farthest",
        ("on", "plate"),
    ),
    (
        "pick_left_cube_place_on_plate",
        "pick up the cube on the left and place it on the plate",
        "left",
        ("on", "plate"),
    ),
    (
        "pick_right_cube_place_in_basket",
        "pick up the cube on the right and place it in the basket",
        "right",
        ("in", "basket"),
    ),
    (
        "pick_cube_next_to_can_place_on_plate",
        "pick up the cube next to the blue can and place it on the plate",
        "near_can",
        ("on", "plate"),
    ),
    (
        "pick_cube_next_to_basket_place_in_basket",
        "pick up the cube next to the basket and place it in the basket",
        "near_basket",
        ("in", "basket"),
    ),
    (
        "pick_cube_between_plate_and_basket_place_on_plate",
        "pick up the cube between the plate and the basket and place it on the plate",
        "between",
        ("on", "plate"),
    ),
    (
        "pick_cube_on_plate_place_in_basket",
        "pick up the cube on the plate and place it in the basket",
        "on_plate",
        ("in", "basket"),
    ),
    (
        "pick_cube_next_to_can_place_in_basket",
        "pick up the cube next to the blue can and place it in the basket",
        "near_can",
        ("in", "basket"),
    ),
]


def tasks() -> list[SuiteTask]:
    sc = scene()
    out = []
    for name, instruction, relation, target in _TASKS:
        goal = on("cube_a", "plate") if target[0] == "on" else inside("cube_a", "basket")
        out.append(
            SuiteTask(
                name=name,
                instruction=instruction,
                suite=SUITE,
                scene=sc,
                sampler=_sampler(relation),
                goals=(goal,),
                plan=(("pick_place", "cube_a", target),),
                max_steps=220,
            )
        )
    return out
