"""Suite ``dynamic``: objects move while the robot acts (a sliding cube, a rolling ball, a tray
on a moving carriage). Solved well only by a policy that acts on fresh observations."""

from __future__ import annotations

from sims.mujoco.suites.base import Carriage, SuiteScene, SuiteTask, lifted, on, place_apart
from sims.mujoco.suites.objects import ball, cube, plate

SUITE = "dynamic"
CARRIAGE = Carriage(name="tray", x=0.02, half=(0.06, 0.06, 0.01), travel=0.16)


def scene() -> SuiteScene:
    return SuiteScene(
        [
            cube("slider", "red", friction=0.02),
            ball("ball", "orange", friction=1.0),
            cube("cube", "blue"),
            plate(extra={}),
        ],
        carriages=[CARRIAGE],
    )


def tasks() -> list[SuiteTask]:
    sc = scene()
    edge = ((-0.2, -0.1), (-0.22, 0.22))

    def slide_sampler(rng):
        return place_apart(rng, sc, {"slider": edge})

    def slide_plate_sampler(rng):
        return place_apart(rng, sc, {"plate": ((-0.16, -0.08), (-0.2, -0.12)), "slider": ((-0.2, -0.1), (0.0, 0.2))})

    def ball_sampler(rng):
        return place_apart(rng, sc, {"ball": edge})

    def tray_place_sampler(rng):
        return place_apart(rng, sc, {"cube": ((-0.2, -0.12), (-0.12, 0.12))})

    def tray_pick_sampler(rng):
        return {}  # the cube rides on the tray (motion["on_tray"])

    moving = {"carriage": {"tray": (0.12, 5.0)}}
    return [
        SuiteTask(
            name="pick_up_the_sliding_cube",
            instruction="pick up the sliding red cube",
            suite=SUITE,
            scene=sc,
            sampler=slide_sampler,
            goals=(lifted("slider"),),
            plan=(("lift", "slider"),),
            max_steps=160,
            motion={"velocity": {"slider": (0.12, 0.2)}},
        ),
        SuiteTask(
            name="put_the_sliding_cube_on_the_plate",
            instruction="put the sliding red cube on the plate",
            suite=SUITE,
            scene=sc,
            sampler=slide_plate_sampler,
            goals=(on("slider", "plate"),),
            plan=(("pick_place", "slider", ("on", "plate")),),
            max_steps=220,
            motion={"velocity": {"slider": (0.12, 0.2)}},
        ),
        SuiteTask(
            name="pick_up_the_rolling_ball",
            instruction="pick up the rolling orange ball",
            suite=SUITE,
            scene=sc,
            sampler=ball_sampler,
            goals=(lifted("ball"),),
            plan=(("lift", "ball"),),
            max_steps=160,
            motion={"velocity": {"ball": (0.08, 0.14)}},
        ),
        SuiteTask(
            name="put_the_cube_on_the_moving_tray",
            instruction="put the blue cube on the moving tray",
            suite=SUITE,
            scene=sc,
            sampler=tray_place_sampler,
            goals=(on("cube", "tray"),),
            plan=(("pick_place", "cube", ("on", "tray")),),
            max_steps=220,
            motion=dict(moving),
        ),
        SuiteTask(
            name="pick_the_cube_from_the_moving_tray",
            instruction="pick up the blue cube from the moving tray",
            suite=SUITE,
            scene=sc,
            sampler=tray_pick_sampler,
            goals=(lifted("cube", 0.12),),
            plan=(("lift", "cube"),),
            max_steps=160,
            motion=dict(moving, on_tray={"cube": "tray"}),
        ),
    ]
