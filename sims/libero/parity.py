"""Our LIBERO pieces against the reference env (robosuite 1.4 in ``.venv-libero``), task by task.

    python -m sims.libero.parity predicates --cache DIR --suites libero_goal [--tasks 0 1] [--json OUT]
    python -m sims.libero.parity osc --cache DIR --suites libero_spatial [--tasks 0] [--inits 0 7]
    python -m sims.libero.parity views --cache DIR --suites libero_spatial [--tasks 0] [--inits 0 1]

``predicates``: the reference builds states around each goal predicate of a task
(:mod:`sims.libero.reference.predicate_states`: init states, the goal's object placed on / in /
beside its target and settled, the target's joints swept across their range) with its truth of each
predicate; :class:`sims.libero.predicates.GoalChecker` judges the same states on the exported scene
(the reference's fixture placement applied). ``osc``: an 85-step action sequence
(:func:`parity_actions`) played by robosuite's OSC_POSE (:mod:`sims.libero.reference.osc_trace`) and
by :class:`sims.libero.osc.OSCArm` from the same state, and the whole episode in
:class:`sims.libero.worlds.LiberoWorlds` from the init state (the protocol's 8-D state as the
reference reports it, and the goal's truth, step by step). ``views``: the protocol's two camera views
after the reset (each init state with the protocol's whole reset, whose fixture placement and
carried-over gripper command are applied to ours), PSNR against the reference's, with and without
MuJoCo's shadow and reflection passes. One line per task; exit status 1 if any
task disagrees (predicates) or exceeds ``--tol-eef`` (osc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import mujoco
import numpy as np

from sims.libero import reference_command, scenes
from sims.libero.predicates import GoalChecker
from sims.libero.worlds import LiberoWorlds

#: the end effector's agreement asserted by ``osc`` (measured: <= 6.4e-9 m on libero_spatial 0)
TOL_EEF = 1e-6


def _run_reference(module: str, args: list[str]) -> None:
    argv, env = reference_command(module, args)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"reference.{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def predicate_parity(folder: Path, suite: str, task: int, work: Path) -> dict[str, Any]:
    """The reference's predicate states of one task judged by :class:`GoalChecker`."""
    out = work / f"{suite}_{task}_predicates.npz"
    _run_reference("predicate_states", ["--suite", suite, "--task", str(task), "--out", str(out)])
    ref = np.load(out)
    model = scenes.load_scene(folder, box_contacts="reference")
    model.body_pos[:] = ref["body_pos"]
    model.body_quat[:] = ref["body_quat"]
    checker = GoalChecker(model, scenes.read_meta(folder))
    data = mujoco.MjData(model)
    ours, site_err = [], 0.0
    for k, state in enumerate(ref["states"]):
        scenes.apply_init_state(model, data, state)
        ours.append(checker.truth(data))
        for j, site in enumerate(ref["sites"]):
            site_err = max(site_err, float(np.abs(checker.position(data, str(site)) - ref["site_pos"][k, j]).max()))
    ours_a = np.asarray(ours, dtype=bool)
    return {
        "suite": suite,
        "task": task,
        "goal": [str(g) for g in ref["goal"]],
        "states": len(ours_a),
        "reference_true": int(ref["truth"].sum()),
        "ours_true": int(ours_a.sum()),
        "disagree": np.nonzero((ours_a != ref["truth"]).any(axis=1))[0].tolist(),
        "site_err": site_err,
    }


def parity_actions() -> np.ndarray:
    """85 control steps ``[85, 7]``: down and forward 14 steps, close the gripper, up with a yaw (the
    orientation goal kept while the rotation is zero), then 40 random steps with the gripper switching."""
    a = np.zeros((45, 7))
    a[:, 6] = -1.0
    a[0:14, 2], a[0:14, 0] = -1.0, 0.3
    a[14:, 6] = 1.0
    a[24:, 2] = 1.0
    a[24:34, 5] = 0.5
    rng = np.random.default_rng(0)
    b = np.clip(rng.normal(0, 0.5, (40, 7)), -1, 1)
    b[10:20, 3:6] = 0.0
    b[:, 6] = np.where(np.arange(40) % 20 < 12, -1.0, 1.0)
    return np.vstack([a, b])


def osc_parity(
    folder: Path, suite: str, task: int, init: int, work: Path, actions: np.ndarray | None = None
) -> dict[str, Any]:
    """An action sequence from init state ``init`` (after the protocol's reset and wait steps in the
    reference): robosuite's controller against :class:`OSCArm` continuing from the same state (whose
    default orientation goal and null-space posture must be robosuite's)."""
    actions = parity_actions() if actions is None else np.asarray(actions, dtype=np.float64)
    np.save(work / "actions.npy", actions)
    out = work / f"{suite}_{task}_{init}_osc.npz"
    _run_reference(
        "osc_trace",
        [
            "--suite",
            suite,
            "--task",
            str(task),
            "--init",
            str(init),
            "--actions",
            str(work / "actions.npy"),
            "--out",
            str(out),
        ],
    )
    ref = np.load(out)
    worlds = LiberoWorlds(folder, 1)  # its scene (reference box contacts) serves both comparisons
    model, arm, data = worlds.model, worlds.arm, worlds.datas[0]
    # the reference's state after its reset and wait steps: continue from it (the gripper command
    # is the reference's; the goal orientation and null-space posture are OSCArm's defaults)
    worlds.continue_from(ref["start"][None], gripper_command=ref["gripper_action"])
    hidden = max(
        float(np.abs(arm.q_null[0] - ref["nullspace_target"]).max()),
        float(np.abs(arm.goal_mat[0] - ref["goal_ori"]).max()),
    )
    eef, qpos = [], []
    for k, a in enumerate(actions):
        worlds.step(a[None])
        eef.append(float(np.abs(data.site_xpos[arm.site] - ref["eef_pos"][k]).max()))
        qpos.append(float(np.abs(data.qpos - ref["states"][k][1 : 1 + model.nq]).max()))
    # the whole episode in LiberoWorlds: its reset (init state, fresh controller, wait steps) and the
    # protocol's state as the reference reports it, and the goal's truth, step by step
    proprio = [float(np.abs(worlds.reset([init])[0] - ref["start_proprio"]).max())]
    success_agree = 0
    for k, a in enumerate(actions):
        success_agree += int(bool(worlds.step(a[None])[0]) == bool(ref["success"][k]))
        proprio.append(float(np.abs(worlds.state()[0] - ref["proprio"][k]).max()))
    return {
        "suite": suite,
        "task": task,
        "init": init,
        "steps": len(actions),
        "hidden_state_err": hidden,
        "eef_err": max(eef),
        "qpos_err": max(qpos),
        "eef_travel": float(np.abs(ref["eef_pos"] - ref["eef_pos"][0]).max()),
        "reset_state_err": proprio[0],
        "state_err": max(proprio),
        "success_agree": success_agree / len(actions),
    }


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 images (inf when equal)."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * float(np.log10(255.0**2 / mse))


def view_parity(
    folder: Path,
    suite: str,
    task: int,
    inits: Sequence[int],
    work: Path,
    image_size: int = 128,
    render_faces: int | None = None,
) -> list[dict[str, Any]]:
    """The protocol's views after the reset of each init state, ours against the reference's: with
    shadows and reflections, without, without multisampling, and (``render_faces``) with decimated visual
    meshes, with and without multisampling."""
    out = work / f"{suite}_{task}_views.npz"
    _run_reference(
        "views",
        [
            "--suite",
            suite,
            "--task",
            str(task),
            "--inits",
            *map(str, inits),
            "--image-size",
            str(image_size),
            "--out",
            str(out),
        ],
    )
    ref = np.load(out)
    variants: dict[str, dict[str, Any]] = {
        "shadows": dict(shadows=True, reflections=True),
        "plain": {},
        "aliased": dict(antialias=False),
    }
    if render_faces is not None:
        variants["decimated"] = dict(render_faces=render_faces)
        variants["decimated_aliased"] = dict(render_faces=render_faces, antialias=False)
    worlds_by_variant = {
        tag: LiberoWorlds(folder, 1, cameras=("agentview", "wrist"), image_size=image_size, **kw)
        for tag, kw in variants.items()
    }
    rows = []
    for k, init in enumerate(ref["inits"]):
        row: dict[str, Any] = {"suite": suite, "task": task, "init": int(init)}
        for tag, worlds in worlds_by_variant.items():
            worlds.model.body_pos[:] = ref["body_pos"][k]
            worlds.model.body_quat[:] = ref["body_quat"][k]
            # robosuite keeps the gripper command across resets: open after the previous episode's wait
            state = worlds.reset([int(init)], gripper_command=None if k == 0 else [1.0, -1.0])
            images = worlds.images()[0]
            row["state_err"] = float(np.abs(state[0] - ref["state"][k]).max())
            for v, name in enumerate(worlds.cameras):
                row[f"{name}_psnr_{tag}"] = psnr(images[v], ref[name][k])
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["predicates", "osc", "views"])
    ap.add_argument("--cache", default=None, help="the scene cache root (default: $EMBODIED_LIBERO_CACHE)")
    ap.add_argument("--suites", nargs="+", default=["libero_spatial", "libero_object", "libero_goal", "libero_10"])
    ap.add_argument("--tasks", type=int, nargs="+", default=None, help="task indices (default: every exported one)")
    ap.add_argument("--inits", type=int, nargs="+", default=[0], help="osc, views: init states")
    ap.add_argument("--tol-eef", type=float, default=TOL_EEF)
    ap.add_argument("--render-faces", type=int, default=None, help="views: also with visual meshes decimated to this")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows, bad = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in scenes.task_dirs(args.cache, args.suites):
            meta = scenes.read_meta(folder)
            suite, task = meta["suite"], int(meta["task_index"])
            if args.tasks is not None and task not in args.tasks:
                continue
            t0 = time.perf_counter()
            if args.what == "predicates":
                row = predicate_parity(folder, suite, task, Path(tmp))
                ok = not row["disagree"]
                print(
                    f"{suite} {task}: {row['states']} states, reference true {row['reference_true']}, ours "
                    f"{row['ours_true']}, disagree {row['disagree'] or 'none'} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                rows.append(row)
                bad += [] if ok else [f"{suite} {task}"]
            elif args.what == "views":
                for row in view_parity(folder, suite, task, args.inits, Path(tmp), render_faces=args.render_faces):
                    decimated = (
                        f"; decimated to {args.render_faces} faces: {row['agentview_psnr_decimated']:.1f} / "
                        f"{row['wrist_psnr_decimated']:.1f} dB, and without multisampling: "
                        f"{row['agentview_psnr_decimated_aliased']:.1f} / "
                        f"{row['wrist_psnr_decimated_aliased']:.1f} dB"
                        if args.render_faces is not None
                        else ""
                    )
                    print(
                        f"{suite} {task} init {row['init']}: state {row['state_err']:.1e}; PSNR with shadows and "
                        f"reflections: agent view {row['agentview_psnr_shadows']:.1f} dB, wrist "
                        f"{row['wrist_psnr_shadows']:.1f} dB; without: {row['agentview_psnr_plain']:.1f} / "
                        f"{row['wrist_psnr_plain']:.1f} dB, and without multisampling: "
                        f"{row['agentview_psnr_aliased']:.1f} / {row['wrist_psnr_aliased']:.1f} dB{decimated}",
                        flush=True,
                    )
                    rows.append(row)
            else:
                for init in args.inits:
                    row = osc_parity(folder, suite, task, init, Path(tmp))
                    ok = row["eef_err"] <= args.tol_eef and row["hidden_state_err"] < 1e-9
                    print(
                        f"{suite} {task} init {init}: end effector {row['eef_err']:.1e} m, qpos {row['qpos_err']:.1e},"
                        f" hidden state {row['hidden_state_err']:.1e}, travel {row['eef_travel']:.2f} m; from the"
                        f" reset: state {row['state_err']:.1e}, success agrees {row['success_agree']:.0%}",
                        flush=True,
                    )
                    rows.append(row)
                    bad += [] if ok else [f"{suite} {task} init {init}"]
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "failed": bad}, indent=2))
    print(f"{len(rows)} rows, failed: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
