"""The scripted experts of LIBERO's articulated goals (sims/libero/fixture_experts.py,
sims/libero/drawer_place_expert.py) on exported libero_goal tasks: open the middle drawer (task 0),
turn on the stove (task 7), open the top drawer and put the bowl inside (task 3), judged by LIBERO's
own predicates; which expert a goal gets (sims.libero.experts.make_expert)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_libero_venv

from sims.libero import scenes
from sims.libero.experts import expert_kind, make_expert, run_episodes
from sims.libero.fixture_experts import DrawerExpert, KnobExpert, frame_rotation, rotation_vector
from sims.libero.worlds import LiberoWorlds


def _rot(axis: list[float], angle: float) -> np.ndarray:
    k = np.asarray(axis, float) / np.linalg.norm(axis)
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


def test_rotation_vector_and_frame_rotation():
    assert np.allclose(rotation_vector(np.eye(3)), 0.0)
    assert np.allclose(rotation_vector(_rot([0, 0, 1], 0.3)), [0, 0, 0.3])
    assert np.allclose(rotation_vector(_rot([1, 1, 0], -2.0)), -2.0 * np.array([1, 1, 0]) / np.sqrt(2))
    # the hand pointing down with the fingers along y, turned to point along -y with the fingers along z
    rot = frame_rotation(np.array([0, 0, -1.0]), np.array([0, 1.0, 0]), np.array([0, -1.0, 0]), np.array([0, 0, 1.0]))
    assert np.allclose(rot @ [0, 0, -1], [0, -1, 0]) and np.allclose(rot @ [0, 1, 0], [0, 0, 1])
    assert np.allclose(rot @ rot.T, np.eye(3)) and np.isclose(np.linalg.det(rot), 1.0)


def test_expert_kind_by_goal():
    sites = {
        "cab_middle_region": {"joints": ["cab_middle"]},
        "cab_top_region": {"joints": ["cab_top"]},
        "stove_cook_region": {"joints": []},
    }
    meta = {"objects": {"bowl_1": {}}, "sites": sites}
    assert expert_kind({**meta, "goal_state": [["on", "bowl_1", "stove_cook_region"]]}) == "pick_place"
    assert expert_kind({**meta, "goal_state": [["open", "cab_middle_region"]]}) == "drawer"
    assert expert_kind({**meta, "goal_state": [["turnon", "stove_1"]]}) == "knob"
    # a plate is pushed onto a table region (no parent fixture); onto a fixture's surface it has no expert
    table = {
        "main_table_front_region": {"joints": None, "parent": None},
        "stove_cook_region": {"joints": [], "parent": "stove_1"},
    }
    plate = {"objects": {"plate_1": {"class": "Plate"}}, "sites": table}
    assert expert_kind({**plate, "goal_state": [["on", "plate_1", "main_table_front_region"]]}) == "push"
    assert expert_kind({**plate, "goal_state": [["on", "plate_1", "stove_cook_region"]]}) is None
    assert expert_kind({"objects": ["plate_1"], "goal_state": [["on", "plate_1", "main_table_front_region"]]}) == "push"
    # into a drawer that starts closed: open it, then the pick-and-place; two predicates, a fixed object moved: none
    assert expert_kind({**meta, "goal_state": [["in", "bowl_1", "cab_top_region"]]}) == "drawer_place"
    assert expert_kind({**meta, "goal_state": [["open", "cab_middle_region"], ["turnon", "stove_1"]]}) is None
    assert expert_kind({**meta, "goal_state": [["on", "plate_2", "stove_cook_region"]]}) is None


@needs_libero_venv
def test_drawer_expert_opens_the_middle_drawer(libero_goal_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 0, libero_goal_exported), 2, box_contacts="reference")
    expert = make_expert(worlds)
    assert isinstance(expert, DrawerExpert)
    result = run_episodes(worlds, np.array([0, 1]), expert)
    assert result["success"].all(), result
    assert (result["length"] < worlds.max_steps).all()
    for d in worlds.datas:
        assert d.qpos[expert.qadr] < -0.14  # LIBERO's open threshold for its wooden cabinet
        # the hand points at the cabinet (its grip axis horizontal), the fingers closing vertically
        assert abs(d.xaxis[expert._finger][2]) > 0.9
    # the other drawers stayed shut
    top, _ = expert._joint("wooden_cabinet_1_top_level")
    assert all(abs(d.qpos[worlds.model.jnt_qposadr[top]]) < 0.02 for d in worlds.datas)


@needs_libero_venv
def test_knob_expert_turns_the_stove_on(libero_goal_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 7, libero_goal_exported), 2, box_contacts="reference")
    expert = make_expert(worlds)
    assert isinstance(expert, KnobExpert)
    worlds.reset([0, 1])
    assert not worlds.success().any()
    result = run_episodes(worlds, np.array([0, 1]), expert)
    assert result["success"].all(), result
    assert all(d.qpos[expert.qadr] >= 0.5 for d in worlds.datas)
    assert all(expert.phases[p] in ("turn", "release", "retreat") for p in result["phase"])
    # a goal without an expert is refused by name
    worlds.goal.goal = [["open", "wooden_cabinet_1_top_region"], ["turnon", "flat_stove_1"]]
    worlds.meta = {**worlds.meta, "goal_state": worlds.goal.goal}
    with pytest.raises(ValueError, match="no scripted expert for libero_goal task 7"):
        make_expert(worlds)


@needs_libero_venv
def test_drawer_expert_closed_loop_in_the_reference_env(libero_goal_exported):
    """The drawer expert drives LIBERO's own env (robosuite 1.4): its physics, controller and success."""
    from sims.libero.closed_loop import ReferenceLoop, run_closed_loop

    with ReferenceLoop("libero_goal") as ref:
        result = run_closed_loop(scenes.task_dir("libero_goal", 0, libero_goal_exported), ref, [0])
    assert result["success"].tolist() == [True] and 0 < result["length"][0] < 300


@needs_libero_venv
def test_drawer_place_expert_opens_the_top_drawer_and_puts_the_bowl_inside(libero_goal_exported):
    """libero_goal task 3: the drawer expert opens the top drawer, the hand returns to where and how it
    started (pointing down), and the pick-and-place expert puts the bowl into the drawer's region."""
    from sims.libero.drawer_place_expert import DrawerPlaceExpert

    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 3, libero_goal_exported), 2, box_contacts="reference")
    expert = make_expert(worlds)
    assert isinstance(expert, DrawerPlaceExpert) and expert.drawer.joint >= 0
    worlds.reset([0, 1])
    assert not any(expert.drawer.past_target(d) for d in worlds.datas)  # closed at the start
    result = run_episodes(worlds, np.array([0, 1]), expert)
    assert result["success"].all(), result
    for d in worlds.datas:
        assert expert.drawer.past_target(d)
    assert all(expert.phases[p].startswith("place:") for p in result["phase"])
