"""Suites ``goal`` (one goal, fixed layout) and ``long`` (two-stage goals) on one kitchen-like
scene: a drawer cabinet, a plate, a basket, a red cube and a blue can."""

from __future__ import annotations

import numpy as np

from sims.mujoco.suites.base import SuiteScene, SuiteTask, above, inside, is_closed, is_open, lifted, on
from sims.mujoco.suites.objects import DRAWER_TRAVEL, basket, cube, cylinder, drawer, plate

# Fixed layout (metres, world frame); each initial state jitters it by up to JITTER.
LAYOUT = {"plate": (-0.13, -0.14), "basket": (0.03, -0.15), "cube": (-0.06, 0.03), "can": (-0.18, 0.06)}
JITTER = 0.015


def scene() -> SuiteScene:
    return SuiteScene(
        [cube("cube", "red"), cylinder("can", "blue"), plate(), basket(), drawer(extra={"pos": (0.12, 0.2)})]
    )


def _sampler(rng: np.random.Generator):
    return {
        name: (x + rng.uniform(-JITTER, JITTER), y + rng.uniform(-JITTER, JITTER), rng.uniform(-0.5, 0.5))
        for name, (x, y) in LAYOUT.items()
    }


OPEN = {"drawer": DRAWER_TRAVEL}

GOAL_TASKS = [
    ("open_the_drawer", "open the drawer", (is_open("drawer"),), (("open", "drawer"),), {}),
    ("close_the_drawer", "close the drawer", (is_closed("drawer"),), (("close", "drawer"),), OPEN),
    (
        "put_the_cube_on_the_plate",
        "put the red cube on the plate",
        (on("cube", "plate"),),
        (("pick_place", "cube", ("on", "plate")),),
        {},
    ),
    (
        "put_the_cube_in_the_basket",
        "put the red cube in the basket",
        (inside("cube", "basket"),),
        (("pick_place", "cube", ("in", "basket")),),
        {},
    ),
    (
        "put_the_can_on_the_plate",
        "put the blue can on the plate",
        (on("can", "plate"),),
        (("pick_place", "can", ("on", "plate")),),
        {},
    ),
    (
        "put_the_can_in_the_basket",
        "put the blue can in the basket",
        (inside("can", "basket"),),
        (("pick_place", "can", ("in", "basket")),),
        {},
    ),
    (
        "put_the_cube_in_the_drawer",
        "put the red cube in the open drawer",
        (inside("cube", "drawer"),),
        (("pick_place", "cube", ("in", "drawer")),),
        OPEN,
    ),
    (
        "put_the_can_in_the_drawer",
        "put the blue can in the open drawer",
        (inside("can", "drawer"),),
        (("pick_place", "can", ("in", "drawer")),),
        OPEN,
    ),
    ("lift_the_can", "pick up the blue can and lift it", (lifted("can"),), (("lift", "can"),), {}),
    (
        "hold_the_cube_above_the_plate",
        "hold the red cube above the plate",
        (above("cube", "plate"),),
        (("hold_above", "cube", "plate"),),
        {},
    ),
]

LONG_TASKS = [
    (
        "open_drawer_put_cube_inside",
        "open the drawer and put the red cube in it",
        (inside("cube", "drawer"),),
        (("open", "drawer"), ("pick_place", "cube", ("in", "drawer"))),
        {},
    ),
    (
        "open_drawer_put_can_inside",
        "open the drawer and put the blue can in it",
        (inside("can", "drawer"),),
        (("open", "drawer"), ("pick_place", "can", ("in", "drawer"))),
        {},
    ),
    (
        "put_cube_in_drawer_and_close_it",
        "put the red cube in the drawer and close it",
        (inside("cube", "drawer"), is_closed("drawer")),
        (("pick_place", "cube", ("in", "drawer")), ("close", "drawer")),
        OPEN,
    ),
    (
        "put_can_in_drawer_and_close_it",
        "put the blue can in the drawer and close it",
        (inside("can", "drawer"), is_closed("drawer")),
        (("pick_place", "can", ("in", "drawer")), ("close", "drawer")),
        OPEN,
    ),
    (
        "cube_on_plate_can_in_basket",
        "put the red cube on the plate and the blue can in the basket",
        (on("cube", "plate"), inside("can", "basket")),
        (("pick_place", "cube", ("on", "plate")), ("pick_place", "can", ("in", "basket"))),
        {},
    ),
    (
        "can_on_plate_cube_in_basket",
        "put the blue can on the plate and the red cube in the basket",
        (on("can", "plate"), inside("cube", "basket")),
        (("pick_place", "can", ("on", "plate")), ("pick_place", "cube", ("in", "basket"))),
        {},
    ),
    (
        "both_in_basket",
        "put both the red cube and the blue can in the basket",
        (inside("cube", "basket"), inside("can", "basket")),
        (
            ("pick_place", "cube", ("in", "basket", (0.0, -0.025))),
            ("pick_place", "can", ("in", "basket", (0.0, 0.025))),
        ),
        {},
    ),
    (
        "both_on_plate",
        "put both the red cube and the blue can on the plate",
        (on("cube", "plate"), on("can", "plate")),
        (("pick_place", "cube", ("on", "plate", (0.0, -0.028))), ("pick_place", "can", ("on", "plate", (0.0, 0.028)))),
        {},
    ),
    (
        "cube_in_basket_close_drawer",
        "put the red cube in the basket and close the drawer",
        (inside("cube", "basket"), is_closed("drawer")),
        (("pick_place", "cube", ("in", "basket")), ("close", "drawer")),
        OPEN,
    ),
    (
        "cube_on_plate_open_drawer",
        "put the red cube on the plate and open the drawer",
        (on("cube", "plate"), is_open("drawer")),
        (("pick_place", "cube", ("on", "plate")), ("open", "drawer")),
        {},
    ),
]


def _build(suite: str, rows) -> list[SuiteTask]:
    sc = scene()
    return [
        SuiteTask(
            name=name,
            instruction=instruction,
            suite=suite,
            scene=sc,
            sampler=_sampler,
            goals=goals,
            plan=plan,
            drawer_open=dict(init),
            max_steps=220 if suite == "goal" else 400,
        )
        for name, instruction, goals, plan, init in rows
    ]


def goal_tasks() -> list[SuiteTask]:
    return _build("goal", GOAL_TASKS)


def long_tasks() -> list[SuiteTask]:
    return _build("long", LONG_TASKS)
