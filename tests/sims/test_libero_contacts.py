"""mujoco 2.3.7's box-box contact depth emulated in MuJoCo 4 (sims/libero/contacts.py), on tiny models."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from sims.libero.contacts import add_reference_box_pairs, collidable_box_pairs

#: a floor, a wall welded to a moving body's parent, and free bodies of boxes with unlike parameters
SCENE = """<mujoco><option timestep="0.002"/><worldbody>
  <geom name="floor" type="box" size="1 1 .1" pos="0 0 -.1" friction=".8 .01 .001"/>
  <geom name="ball_floor" type="sphere" size=".05" pos=".6 .6 .05"/>
  <body name="a" pos="0 0 .06"><freejoint/>
    <geom name="a1" type="box" size=".05 .05 .05" solref=".01 .5" solimp=".95 .99 .002 .5 2" solmix="2"/>
    <geom type="box" size=".02 .02 .02" pos=".06 0 0" friction="1.2 .02 .002" priority="1"/>
    <body name="a_child" pos="0 0 .1"><joint type="hinge"/><geom name="c1" type="box" size=".02 .02 .02"/></body>
  </body>
  <body name="b" pos=".03 .02 .2" euler="10 20 30"><freejoint/>
    <geom name="b1" type="box" size=".04 .04 .04" condim="4"/>
    <geom name="b2" type="box" size=".01 .01 .01" pos="0 0 .05" contype="2" conaffinity="2"/>
    <geom name="b3" type="sphere" size=".02" pos="0 .05 0"/>
  </body>
</worldbody></mujoco>"""


def _run(model: mujoco.MjModel, steps: int = 300) -> np.ndarray:
    data = mujoco.MjData(model)
    for _ in range(steps):
        mujoco.mj_step(model, data)
    return np.r_[data.qpos, data.qvel]


def test_the_pairs_are_the_box_pairs_mujoco_would_collide():
    model = mujoco.MjModel.from_xml_string(SCENE)
    names = {
        tuple(sorted((model.geom(g1).name or str(g1), model.geom(g2).name or str(g2))))
        for g1, g2 in collidable_box_pairs(model)
    }
    # geom 3 is unnamed; not: same body (a1 and geom 3), the weld child c1 with a's boxes, b2 (contype 2) with
    # anything of type 1, spheres
    assert names == {
        ("a1", "floor"),
        ("3", "floor"),
        ("c1", "floor"),
        ("a1", "b1"),
        ("3", "b1"),
        ("b1", "c1"),
        ("b1", "floor"),
    }


def test_depth_scale_one_changes_nothing():
    """The pairs carry exactly the parameters MuJoCo mixes (priority, solmix, maxima): a box pile falls
    the same way with and without them."""
    spec = mujoco.MjSpec.from_string(SCENE)
    assert add_reference_box_pairs(spec, depth_scale=1.0) == 7
    model = spec.compile()
    assert model.npair == 7
    plain = _run(mujoco.MjModel.from_xml_string(SCENE))
    np.testing.assert_allclose(_run(model), plain, atol=1e-9)


def test_a_box_at_twice_the_depth_feels_what_the_native_one_feels_at_the_depth():
    """mujoco 2.3.7 reports half the box-box depth: at true depth 2d the emulated contact's force is the
    native force at depth d (frictionless, at rest), and the emulation sinks deeper than native."""
    xml = (
        "<mujoco><worldbody><geom type='box' size='1 1 .1' pos='0 0 -.1' condim='1'/>"
        "<body pos='0 0 {z}'><freejoint/><geom type='box' size='.05 .05 .05' condim='1'/></body>"
        "</worldbody></mujoco>"
    )
    native = mujoco.MjModel.from_xml_string(xml.format(z=0.05 - 0.004))
    spec = mujoco.MjSpec.from_string(xml.format(z=0.05 - 0.008))
    assert add_reference_box_pairs(spec) == 1
    emulated = spec.compile()
    forces = []
    for model in (native, emulated):
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        assert data.ncon == 4
        forces.append(np.sort(data.efc_force[:4]))
    np.testing.assert_allclose(forces[1], forces[0], rtol=1e-9)
    assert forces[0].min() > 0
    rest = [_run(m, 500)[2] for m in (native, emulated)]
    assert rest[1] < rest[0] - 1e-5  # softer: the emulated box rests deeper in the floor


def test_bad_uses_are_refused():
    with pytest.raises(ValueError, match=r"depth_scale=0: must be in \(0, 1\]"):
        add_reference_box_pairs(mujoco.MjSpec.from_string(SCENE), depth_scale=0)
    spec = mujoco.MjSpec.from_string(
        SCENE.replace("</worldbody>", "</worldbody><contact><pair geom1='a1' geom2='floor'/></contact>")
    )
    with pytest.raises(ValueError, match="already has 1 explicit contact pairs"):
        add_reference_box_pairs(spec)
