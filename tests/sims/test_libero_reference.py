"""Real LIBERO's reference env in its own venv (``.venv-libero``, made by ``scripts/setup.sh``):
privileged access and success detection, the protocol's observation, the request a server gets."""

from __future__ import annotations

import json
import subprocess

import mujoco
import numpy as np
import pytest

import sims.libero as libero

needs_venv = pytest.mark.skipif(
    not libero.VENV.joinpath("bin", "python").is_file(),
    reason="the reference LIBERO venv is missing: run bash scripts/setup.sh",
)

PROBE = r"""
import json, sys
import numpy as np
from reference.env import ReferenceTask, quat2axisangle
from reference.client import request_builder

out = {}
with ReferenceTask("libero_spatial", 0, image_size=32) as task:
    raw = task.reset(1)
    obs = task.observation()
    out["state"] = obs["state"].tolist()
    out["image"] = [list(obs["agentview"].shape), str(obs["agentview"].dtype)]
    out["rotated"] = bool((obs["agentview"] == raw["agentview_image"][::-1, ::-1]).all())
    out["eef"] = raw["robot0_eef_pos"].tolist()
    out["language"] = task.language
    out["objects"], out["fixtures"] = task.object_names(), task.fixture_names()
    (pred, holds), = task.goal()
    out["goal_before"], out["success_before"] = [pred, holds], task.success()
    _, bowl, plate = pred
    plate_pos, _ = task.pose(plate)
    task.place(bowl, plate_pos + np.array([0.0, 0.0, 0.05]))
    done = False
    for _ in range(15):  # let the bowl settle on the plate
        done = task.step(np.array([0, 0, 0, 0, 0, 0, -1.0])) or done
    out["bowl_after"], out["plate"] = task.pose(bowl)[0].tolist(), plate_pos.tolist()
    out["goal_after"], out["success_after"], out["done"] = task.goal()[0][1], task.success(), done
    ours = request_builder({"request_keys": ["observation/state"], "state_dim": 8, "action_dim": 7,
                            "cameras": ["front", "wrist"]})(obs, task.language)
    openpi = request_builder({})(obs, task.language)
    out["ours"] = {k: list(getattr(v, "shape", [])) for k, v in ours.items()}
    out["openpi"] = {k: list(getattr(v, "shape", [])) for k, v in openpi.items()}
from reference.env import instruction, load_suite
out["pro_instruction"] = instruction("libero_goal_lan", load_suite("libero_goal_lan").get_task(1))
out["standard_instruction"] = instruction("libero_goal", load_suite("libero_goal").get_task(1))
out["axis_angle_identity"] = quat2axisangle(np.array([0.0, 0.0, 0.0, 1.0])).tolist()
out["axis_angle_half_turn_z"] = quat2axisangle(np.array([0.0, 0.0, 1.0, 0.0])).tolist()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    argv, env = libero.reference_command("env")
    proc = subprocess.run([argv[0], "-c", PROBE], capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@needs_venv
def test_placing_the_bowl_on_the_plate_is_detected_as_success(probe):
    assert probe["language"].startswith("pick up the black bowl between the plate and the ramekin")
    assert probe["goal_before"] == [["on", "akita_black_bowl_1", "plate_1"], False]
    assert probe["success_before"] is False
    assert "akita_black_bowl_1" in probe["objects"] and "plate_1" in probe["objects"]
    assert probe["goal_after"] is True and probe["success_after"] is True and probe["done"] is True
    assert abs(probe["bowl_after"][0] - probe["plate"][0]) < 0.02 and probe["bowl_after"][2] > probe["plate"][2]


@needs_venv
def test_the_protocol_observation(probe):
    assert probe["image"] == [[32, 32, 3], "uint8"] and probe["rotated"]
    state = probe["state"]
    assert len(state) == 8 and state[:3] == pytest.approx(probe["eef"], abs=1e-6)
    assert probe["axis_angle_identity"] == [0.0, 0.0, 0.0]
    assert probe["axis_angle_half_turn_z"] == pytest.approx([0.0, 0.0, 3.14159265], abs=1e-6)


@needs_venv
def test_requests_follow_the_server(probe):
    """Our server's metadata names its cameras (the wrist one by name); an openpi server gets
    openpi's LIBERO keys with 224 px images."""
    assert probe["ours"] == {
        "observation/state": [8],
        "prompt": [],
        "observation/images/front": [32, 32, 3],
        "observation/images/wrist": [32, 32, 3],
    }
    assert probe["openpi"] == {
        "observation/image": [224, 224, 3],
        "observation/wrist_image": [224, 224, 3],
        "observation/state": [8],
        "prompt": [],
    }


@needs_venv
def test_a_language_perturbation_reaches_the_policy(probe):
    """LIBERO-PRO's ``_lan`` variant keeps the task, with its BDDL file's reworded instruction."""
    assert probe["standard_instruction"] == "put the bowl on the stove"
    assert probe["pro_instruction"] == "place the bowl on the stove"


def test_suite_names_and_limits():
    assert libero.max_steps("libero_10") == 520 and libero.max_steps("libero_goal_swap") == 300
    assert len(libero.suite_names()) == 5 + 16
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_spacial'"):
        libero.base_suite("libero_spacial")


def test_a_missing_venv_names_the_setup_command(monkeypatch, tmp_path):
    monkeypatch.setenv(libero.PYTHON_ENV, str(tmp_path / "nothing" / "python"))
    with pytest.raises(libero.LiberoSetupError, match="bash scripts/setup.sh"):
        libero.venv_python()


SAMPLED_PROBE = r"""
import json
import numpy as np
from reference.env import ReferenceTask

out = {}
with ReferenceTask("libero_spatial", 0, image_size=0) as task:
    task.reset(60, wait_steps=0)
    sim = task.inner.sim
    out["state"] = np.asarray(sim.get_state().flatten()).tolist()
    out["objects"] = {n: np.asarray(sim.data.body_xpos[task.inner.obj_body_id[n]]).tolist()
                      for n in task.object_names()}
    out["proprio"] = task.observation()["state"].tolist()
    out["num_states"] = task.num_states
    try:
        task.reset(100)
    except ValueError as err:
        out["error"] = str(err)
print("RESULT " + json.dumps(out))
"""


@needs_venv
def test_both_simulators_start_a_sampled_state_alike(libero_exported, monkeypatch):
    """Init id 60 (sampled state 10): the reference env reads it from the scene cache, and after loading its
    objects stand where ours do (as after the official states' loading, 8.9e-16 m measured)."""
    from sims.libero import INIT_IDS, scenes
    from sims.libero.worlds import LiberoWorlds

    root = libero_exported[0]
    argv, env = libero.reference_command("env")
    env.update({scenes.CACHE_ENV: str(root), scenes.AUTO_EXPORT_ENV: "0"})  # in the cache: nothing exported
    proc = subprocess.run([argv[0], "-c", SAMPLED_PROBE], capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT ") :])
    folder = scenes.task_dir("libero_spatial", 0, root)
    np.testing.assert_array_equal(ref["state"], scenes.load_sampled_states(folder)[10])
    assert ref["num_states"] == 100 and INIT_IDS in ref["error"]
    worlds = LiberoWorlds(folder, 1, box_contacts="native")
    proprio = worlds.reset([60], wait_steps=0)[0]
    meta = worlds.meta
    for name, pos in ref["objects"].items():
        body = mujoco.mj_name2id(worlds.model, mujoco.mjtObj.mjOBJ_BODY, meta["objects"][name]["root_body"])
        np.testing.assert_allclose(worlds.datas[0].xpos[body], pos, rtol=0, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(proprio, ref["proprio"], rtol=0, atol=1e-6)  # the 8-D state after loading
    worlds.close()
