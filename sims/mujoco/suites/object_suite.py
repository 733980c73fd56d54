"""Suite ``object``: which object to pick, among distractors; always into the basket."""

from __future__ import annotations

from sims.mujoco.suites.base import SuiteScene, SuiteTask, inside, place_apart
from sims.mujoco.suites.objects import basket, cube, cylinder

SUITE = "object"
_OBJECTS = [
    ("red_cube", "red cube", cube, "red"),
    ("blue_cube", "blue cube", cube, "blue"),
    ("green_cube", "green cube", cube, "green"),
    ("yellow_cube", "yellow cube", cube, "yellow"),
    ("purple_cube", "purple cube", cube, "purple"),
    ("red_can", "red can", cylinder, "red"),
    ("blue_can", "blue can", cylinder, "blue"),
    ("green_can", "green can", cylinder, "green"),
    ("yellow_can", "yellow can", cylinder, "yellow"),
    ("orange_can", "orange can", cylinder, "orange"),
]
OBJ_REGION = ((-0.2, 0.08), (-0.02, 0.24))


def scene() -> SuiteScene:
    return SuiteScene([make(name, color) for name, _, make, color in _OBJECTS] + [basket()])


def tasks() -> list[SuiteTask]:
    sc = scene()
    out = []
    n = len(_OBJECTS)
    for k, (name, words, _, _) in enumerate(_OBJECTS):
        # three distractors per task, a fixed choice, mixing shapes and colours
        distractors = [_OBJECTS[(k + d) % n][0] for d in (1, 4, 7)]
        regions = {"basket": ((-0.14, 0.0), (-0.2, -0.12))}
        for obj in [name, *distractors]:
            regions[obj] = OBJ_REGION

        def sampler(rng, regions=regions):
            return place_apart(rng, sc, regions)

        out.append(
            SuiteTask(
                name=f"pick_{name}_place_in_basket",
                instruction=f"pick up the {words} and place it in the basket",
                suite=SUITE,
                scene=sc,
                sampler=sampler,
                goals=(inside(name, "basket"),),
                plan=(("pick_place", name, ("in", "basket")),),
                max_steps=220,
            )
        )
    return out
