"""LIBERO's BDDL goal predicates on our state (sims/libero/predicates.py): each predicate's rule on a
tiny scene, and the reference env's truth on states around a real task's goal."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from conftest import needs_libero_venv

from sims.libero import parity, scenes
from sims.libero.predicates import GoalChecker

SCENE = """
<mujoco>
  <worldbody>
    <body name="plate_main"><geom type="box" size="0.1 0.1 0.01"/></body>
    <body name="bowl_main" pos="0 0 0.029"><freejoint name="bowl_joint0"/><geom type="box" size="0.02 0.02 0.02"/></body>
    <body name="cab_main" pos="1 0 0">
      <geom type="box" size="0.1 0.1 0.1"/>
      <body name="cab_drawer">
        <joint name="cab_top_level" type="slide" axis="1 0 0" range="-0.16 0.01"/>
        <geom type="box" size="0.05 0.05 0.02" pos="0 0 0.2" contype="0" conaffinity="0"/>
        <site name="cab_top_region" pos="0 0 0.2" size="0.05 0.05 0.02" type="box"/>
      </body>
    </body>
    <body name="stove_main" pos="-1 0 0">
      <body name="stove_knob"><joint name="stove_button" type="hinge" range="-0.1 2.1"/><geom size="0.01"/></body>
    </body>
    <site name="region" pos="0.5 0 0" size="0.05 0.05 0.005" type="box"/>
  </worldbody>
</mujoco>"""

META = {
    "objects": {
        "bowl_1": {"class": "Bowl", "root_body": "bowl_main", "joints": ["bowl_joint0"], "bodies": ["bowl_main"]}
    },
    "fixtures": {
        "plate_1": {"class": "Plate", "root_body": "plate_main", "joints": [], "bodies": ["plate_main"]},
        "cab_1": {
            "class": "WoodenCabinet",
            "root_body": "cab_main",
            "joints": ["cab_top_level"],
            "bodies": ["cab_main", "cab_drawer"],
        },
        "stove_1": {
            "class": "FlatStove",
            "root_body": "stove_main",
            "joints": ["stove_button"],
            "bodies": ["stove_main", "stove_knob"],
        },
    },
    "sites": {
        "cab_1_top_region": {
            "class": "SiteObject",
            "site": "cab_top_region",
            "parent": "cab_1",
            "type": "box",
            "size": [0.05, 0.05, 0.02],
            "joints": ["cab_top_level"],
        },
        "table_region": {
            "class": "TargetZone",
            "site": "region",
            "parent": None,
            "type": "box",
            "size": [0.05, 0.05, 0.005],
            "joints": None,
        },
    },
}


@pytest.fixture()
def scene():
    model = mujoco.MjModel.from_xml_string(SCENE)
    return model, mujoco.MjData(model)


def _check(model, data, goal, bowl=None, joints=None):
    """The truth of ``goal`` with the bowl at ``bowl`` and named joints set."""
    if bowl is not None:
        data.qpos[:3] = bowl
    for name, q in (joints or {}).items():
        data.qpos[model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)]] = q
    mujoco.mj_forward(model, data)
    return GoalChecker(model, {**META, "goal_state": goal}).truth(data)


def test_on_an_object_needs_contact_height_and_a_centred_position(scene):
    model, data = scene
    on = [["on", "bowl_1", "plate_1"]]
    assert _check(model, data, on, bowl=[0, 0, 0.029]) == [True]
    assert _check(model, data, on, bowl=[0.04, 0, 0.029]) == [False]  # touching, 4 cm off centre
    assert _check(model, data, on, bowl=[0.02, 0, 0.029]) == [True]
    assert _check(model, data, on, bowl=[0, 0, 0.2]) == [False]  # centred, not touching


def test_on_a_region_is_a_slab_above_its_top_face(scene):
    model, data = scene
    on = [["on", "bowl_1", "table_region"]]
    assert _check(model, data, on, bowl=[0.5, 0, 0.05]) == [True]  # no parent: no contact needed
    assert _check(model, data, on, bowl=[0.5, 0, 0.2]) == [False]  # above the 10 cm slab
    assert _check(model, data, on, bowl=[0.56, 0, 0.05]) == [False]  # beside it
    # a site with a parent fixture also needs contact with it
    assert _check(model, data, [["on", "bowl_1", "cab_1_top_region"]], bowl=[1.0, 0, 0.23]) == [False]


def test_in_a_site_is_inside_its_box_with_slack_below(scene):
    model, data = scene
    inside = [["in", "bowl_1", "cab_1_top_region"]]
    assert _check(model, data, inside, bowl=[1.0, 0, 0.19]) == [True]
    assert _check(model, data, inside, bowl=[1.0, 0, 0.175]) == [True]  # 1 cm of slack below
    assert _check(model, data, inside, bowl=[1.0, 0, 0.165]) == [False]
    assert _check(model, data, inside, bowl=[1.06, 0, 0.19]) == [False]


def test_articulation_thresholds_follow_the_class(scene):
    model, data = scene
    drawer = [["open", "cab_1_top_region"], ["close", "cab_1_top_region"], ["open", "cab_1"]]
    assert _check(model, data, drawer, joints={"cab_top_level": -0.15}) == [True, False, True]
    assert _check(model, data, drawer, joints={"cab_top_level": 0.0}) == [False, False, False]
    assert _check(model, data, drawer, joints={"cab_top_level": 0.005}) == [False, True, False]
    stove = [["turnon", "stove_1"], ["turnoff", "stove_1"]]
    assert _check(model, data, stove, joints={"stove_button": 0.6}) == [True, False]
    assert _check(model, data, stove, joints={"stove_button": 0.4}) == [False, False]
    assert _check(model, data, stove, joints={"stove_button": -0.05}) == [False, True]
    assert _check(model, data, [["up", "bowl_1"]], bowl=[0, 0, 1.2]) == [True]


def test_bad_goals_are_refused(scene):
    model, _ = scene
    with pytest.raises(ValueError, match="'stack' .* not implemented"):
        GoalChecker(model, {**META, "goal_state": [["stack", "bowl_1", "plate_1"]]})
    with pytest.raises(ValueError, match="no object, fixture or site 'mug_1'"):
        GoalChecker(model, {**META, "goal_state": [["on", "mug_1", "plate_1"]]})
    checker = GoalChecker(model, {**META, "goal_state": [["open", "plate_1"]]})
    with pytest.raises(ValueError, match="class 'Plate' has no 'open' threshold"):
        checker.truth(mujoco.MjData(model))


@needs_libero_venv
def test_goal_truth_matches_the_reference_env(libero_exported, tmp_path):
    """libero_spatial 0's goal (the bowl on the plate) on the reference's states: init states, the bowl
    put above the plate 0 / 2 / 4 cm off centre, in the air and after settling."""
    folder = scenes.task_dir("libero_spatial", 0, libero_exported[0])
    row = parity.predicate_parity(folder, "libero_spatial", 0, tmp_path)
    assert row["goal"] == ["on akita_black_bowl_1 plate_1"]
    assert row["disagree"] == [], row
    assert 0 < row["reference_true"] < row["states"], row  # both truths occur
    truth = np.load(tmp_path / "libero_spatial_0_predicates.npz")["truth"][:, 0]
    assert not truth[:2].any()  # the init states are not goals
