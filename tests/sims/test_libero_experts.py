"""The scripted LIBERO expert (sims/libero/experts.py) on an exported libero_spatial task: it picks
the bowl by its rim and puts it on the plate, judged by LIBERO's own goal predicate."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_libero_venv

from sims.libero import scenes
from sims.libero.experts import PickPlaceExpert, run_episodes
from sims.libero.worlds import LiberoWorlds

pytestmark = needs_libero_venv  # the scene export runs in the reference venv


def test_expert_puts_the_bowl_on_the_plate(libero_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 2, box_contacts="native")
    result = run_episodes(worlds, np.array([0, 3]))
    assert result["success"].all(), result
    assert (result["length"] < worlds.max_steps).all()
    # the goal holds because the bowl sits on the plate, centred within LIBERO's 3 cm
    for d in worlds.datas:
        bowl, plate = worlds.goal.position(d, "akita_black_bowl_1"), worlds.goal.position(d, "plate_1")
        assert np.linalg.norm((bowl - plate)[:2]) < 0.03 and bowl[2] >= plate[2]


def test_expert_refuses_other_goals(libero_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 1, box_contacts="native")
    worlds.goal.goal = [["open", "wooden_cabinet_1_top_region"]]
    with pytest.raises(ValueError, match="one 'on' or 'in' predicate with a movable object"):
        PickPlaceExpert(worlds)


def test_expert_knows_a_dropped_bowl_and_an_unreachable_rim(libero_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 1, box_contacts="native")
    worlds.reset([0])
    expert = PickPlaceExpert(worlds)
    eef = np.array([0.0, 0.0, 1.0])
    held = eef - [expert.rim, 0.0, expert.cfg.grasp_depth]  # gripped by the rim
    assert not expert.dropped(eef, held)
    assert expert.dropped(eef, held - [0.05, 0.0, 0.0])  # left the hand sideways
    assert expert.dropped(eef, held - [0.0, 0.0, 0.08])  # fell below it


def test_expert_grasps_a_level_bowl_near_the_base_and_a_tilted_one_by_its_higher_rim(libero_exported):
    """The two rim points the fingers can straddle lie along the finger axis, on either side of the
    bowl. A level bowl is taken by the one that keeps the hand nearer the robot's base at the grasp
    and at the place (near full extension OSC_POSE cannot bring the hand back); a tilted one by the
    higher, unless that lies beyond the arm's reach."""
    from dataclasses import replace

    import mujoco

    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 1, box_contacts="native")
    worlds.reset([0])
    expert = PickPlaceExpert(worlds)
    d = worlds.datas[0]
    points = expert.rim_points(d)
    assert abs(np.linalg.norm((points[1] - points[-1])[:2]) - 2 * expert.rim) < 0.01  # one diameter's ends
    level = expert.rim_side(d)
    centre, plate = d.xpos[expert._body], worlds.goal.position(d, "plate_1")
    assert expert._reach(points[level]) < expert._reach(points[-level])
    assert expert._reach(plate + points[level] - centre) < expert._reach(plate + points[-level] - centre)

    # tilt the bowl 10 degrees so that the rim point on the chosen side is the lower one
    joint = worlds.model.body_jntadr[expert._body]
    adr = worlds.model.jnt_qposadr[joint]
    tilt_axis = np.cross([0.0, 0.0, 1.0], expert.finger_axis)
    tilt = np.zeros(4)
    mujoco.mju_axisAngle2Quat(tilt, tilt_axis, np.deg2rad(10.0) * level)
    quat = np.zeros(4)
    mujoco.mju_mulQuat(quat, tilt, d.qpos[adr + 3 : adr + 7].copy())
    d.qpos[adr + 3 : adr + 7] = quat
    mujoco.mj_kinematics(worlds.model, d)
    points = expert.rim_points(d)
    higher = 1 if points[1][2] > points[-1][2] else -1
    assert higher == -level and points[higher][2] - points[level][2] > expert.cfg.rim_tilt
    assert expert.rim_side(d) == higher
    expert.cfg = replace(expert.cfg, reach=expert._reach(points[higher]) - 0.01)  # the higher one out of reach
    assert expert.rim_side(d) == level


def test_expert_closed_loop_in_the_reference_env(libero_exported):
    """The expert reads the reference env's state each step and its actions drive the reference env:
    LIBERO's own simulator, controller and success check judge the episode."""
    from sims.libero.closed_loop import ReferenceLoop, run_closed_loop

    with ReferenceLoop("libero_spatial") as ref:
        with pytest.raises(RuntimeError, match="refused step: ValueError: step before any reset"):
            ref.step(np.zeros(7))
        result = run_closed_loop(scenes.task_dir("libero_spatial", 0, libero_exported[0]), ref, [0])
    assert result["success"].tolist() == [True] and 0 < result["length"][0] < 220


def test_expert_takes_a_bottle_by_its_neck(libero_goal_exported):
    """The wine bottle (libero_goal task 9, onto the rack): grasped just below its top, where the open
    hand fits around the neck, it is carried and placed (its body is as wide as the open hand)."""
    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 9, libero_goal_exported), 2, box_contacts="reference")
    expert = PickPlaceExpert(worlds)
    assert expert.neck and expert.obj == "wine_bottle_1"
    worlds.reset([0, 1])
    top = expert.vertical_span(worlds.datas[0])[1]
    assert expert.grasp_point(worlds.datas[0])[2] == pytest.approx(top - expert.cfg.below_top)
    assert run_episodes(worlds, np.array([0, 1]), expert)["success"].all()
