"""``bench=libero``: the reference LIBERO env's speed here, and what one official evaluation costs.

Runs :mod:`sims.libero.reference.bench` in ``.venv-libero``: env steps/s with two cameras at each
of ``image_sizes`` and without rendering (random actions; the median of ``repeats`` runs of
``steps`` steps), and the seconds of a reset with and without ``hard_reset``. From them, the time of
one full official evaluation of each suite on this machine (10 tasks, 90 for libero_90, x 50
initial states; every episode at its step limit plus the 10 wait steps, the worst case, and a reset
each) at the protocol's 256 px, env time only (the policy's inference comes on top). Then the same
task's exported scene in our batched physics (:class:`sims.libero.worlds.LiberoWorlds`: LIBERO's
controller and goal on MuJoCo 4, no rendering) at each of ``batched_num_envs``, with both box-contact
settings, against the reference's no-rendering rate measured in the same run (``ratio_vs_reference``)
and against MuJoCo's own physics doing the same substeps (``physics_limit_steps_per_s``, and
``ratio_to_limit``: our time over MuJoCo's): a plain ``mujoco.batch.Batch`` of the same model with our
batch's thread count, from the same init states, replaying the controls our run applied (one
``Batch.rollout`` of a control step's 25 substeps per step, timed in the same repeat right after ours;
``limit_state_err``, the largest qpos difference at the end, 0 when they stepped the same
trajectories). Every run of ours starts from init states 0..N-1. Then with the two cameras at 128 px
(visual meshes as they are, and decimated to ``render_faces`` with and without multisampling) against
the reference's rate with its two cameras at 128 px (when ``image_sizes`` has 128). ``image_sizes=[]``
times the reference without rendering only (the evaluation's cost is then that of no rendering).
Writes ``libero.json`` and ``libero.csv``.
"""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json

TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}


@dataclass
class LiberoBenchConfig(BenchConfig):
    """``bench=libero``: the reference env's steps/s and reset times, and an official evaluation's cost."""

    suite: str = "libero_spatial"  # the suite and task whose scene is measured
    task: int = 0
    image_sizes: list[int] = field(default_factory=lambda: [128, 256])  # two cameras at each size
    steps: int = 20  # env steps per run
    repeats: int = 3  # runs per case (the median is reported)
    resets: int = 3  # resets timed per reset mode (the median is reported)
    batched_num_envs: list[int] = field(default_factory=lambda: [1, 8, 32])  # our LiberoWorlds; [] skips them
    # ours with the two cameras at 128 px (at the first of batched_num_envs), the visual meshes as they
    # are and decimated to each of these face budgets (with and without multisampling); [] renders
    # only as they are
    render_faces: list[int] = field(default_factory=lambda: [2000])
    cache: Optional[str] = None  # the scene cache root (default: $EMBODIED_LIBERO_CACHE or ~/.cache/embodied/libero)
    # The RL workload (benchmarks/chunk_render.py): our env (sims.make, its defaults) with the two views at
    # 128 px, step_chunk rendering on demand against every step, at each N x H; the reference renders
    # every step and, at each H, only at chunk boundaries (needs 128 in image_sizes). [] skips it
    workload_num_envs: list[int] = field(default_factory=lambda: [8, 32])
    workload_chunk_sizes: list[int] = field(default_factory=lambda: [5, 10])
    workload_control_steps: int = 40  # control steps per timed repeat (whole chunks)
    workload_repeats: int = 3


SCHEMA = LiberoBenchConfig


def evaluation_cost(steps_per_s: float, reset_s: float) -> dict[str, float]:
    """Hours of one official evaluation per suite at ``steps_per_s``, every episode at its limit."""
    import sims.libero as libero

    out = {}
    for suite, tasks in TASKS.items():
        episodes = tasks * libero.NUM_INIT_STATES
        seconds = episodes * ((libero.MAX_STEPS[suite] + libero.NUM_WAIT_STEPS) / steps_per_s + reset_s)
        out[suite] = round(seconds / 3600, 2)
    return out


def run(cfg: LiberoBenchConfig, out: Path) -> dict[str, Any]:
    import sims.libero as libero

    if any(s < 16 for s in cfg.image_sizes):
        raise BenchError(f"image_sizes must be sizes >= 16 px, got {cfg.image_sizes}")
    try:
        libero.base_suite(cfg.suite)
        argv, env = libero.reference_command(
            "bench",
            [
                "--suite",
                cfg.suite,
                "--task",
                str(cfg.task),
                "--image-sizes",
                *map(str, cfg.image_sizes),
                "--steps",
                str(cfg.steps),
                "--repeats",
                str(cfg.repeats),
                "--resets",
                str(cfg.resets),
                "--seed",
                str(cfg.seed),
                *(["--chunk-sizes", *map(str, cfg.workload_chunk_sizes)] if cfg.workload_num_envs else []),
            ],
        )
    except (ValueError, libero.LiberoSetupError) as err:
        raise BenchError(str(err)) from None
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    result, tail = None, []
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
        else:
            tail = (tail + [line.rstrip()])[-20:]
            if line.startswith("[libero bench]"):
                print(line.rstrip(), flush=True)
    if proc.wait() != 0 or result is None:
        raise BenchError(f"the reference env benchmark failed (status {proc.returncode}): " + "\n".join(tail[-5:]))
    by_size = {c["image_size"]: c for c in result["cases"]}
    protocol = by_size.get(256) or by_size[max(cfg.image_sizes, default=0)]
    soft = protocol["soft_reset_s"]
    result["official_evaluation_hours"] = {
        "image_size": protocol["image_size"],
        "soft_reset": evaluation_cost(protocol["steps_per_s"], soft),
        "hard_reset": evaluation_cost(protocol["steps_per_s"], result["hard_reset_s"]),
    }
    result["hard_over_soft_reset"] = round(result["hard_reset_s"] / max(soft, 1e-9), 1)
    reference_rate = next(c["steps_per_s"] for c in result["cases"] if c["image_size"] == 0)
    camera_rate = next((c["steps_per_s"] for c in result["cases"] if c["image_size"] == 128), None)
    result["batched"] = batched_rates(cfg, reference_rate, camera_rate) if cfg.batched_num_envs else []
    if cfg.workload_num_envs:
        camera_case = next((c for c in result["cases"] if c["image_size"] == 128), None)
        if camera_case is None:
            raise BenchError(
                "the RL workload compares with the reference's two 128 px cameras: add 128 to image_sizes "
                "(or set workload_num_envs=[])"
            )
        result["rl_workload"] = rl_workload(cfg, camera_case)
    result["machine"] = machine_info()
    result["config"] = {
        k: getattr(cfg, k)
        for k in (
            "suite",
            "task",
            "image_sizes",
            "steps",
            "repeats",
            "resets",
            "batched_num_envs",
            "render_faces",
            "cache",
        )
    }
    result["config"].update(
        {
            k: getattr(cfg, k)
            for k in ("workload_num_envs", "workload_chunk_sizes", "workload_control_steps", "workload_repeats")
        }
    )
    write_json(out / "libero.json", result)
    with open(out / "libero.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "case",
                "image_size",
                "steps_per_s",
                "soft_reset_s",
                "build_s",
                "physics_limit_steps_per_s",
                "ratio_to_limit",
            ]
        )
        for c in result["cases"]:
            w.writerow([c["case"], c["image_size"], c["steps_per_s"], c["soft_reset_s"], c["build_s"], "", ""])
        w.writerow(["hard reset", "", "", result["hard_reset_s"], "", "", ""])
        for b in result["batched"]:
            meshes = "" if b["render_faces"] is None else f", meshes {b['render_faces']} faces"
            meshes += "" if b.get("antialias", True) else ", no multisampling"
            w.writerow(
                [
                    f"ours {b['box_contacts']} contacts, {b['num_envs']} envs{meshes}",
                    b["image_size"],
                    b["steps_per_s"],
                    "",
                    "",
                    b.get("physics_limit_steps_per_s", ""),
                    b.get("ratio_to_limit", ""),
                ]
            )
    return result


def batched_rates(
    cfg: LiberoBenchConfig, reference_rate: float, camera_rate: float | None = None
) -> list[dict[str, Any]]:
    """Env steps/s of :class:`LiberoWorlds` (random actions, the median of ``repeats`` runs of ``steps``
    steps): without rendering per env count and box-contact setting, against ``reference_rate`` and
    MuJoCo's own physics doing the same substeps (:func:`replay_physics`); with two 128 px cameras per
    mesh setting, against ``camera_rate`` (the reference's, None: skipped)."""
    import time

    import numpy as np
    from mujoco import batch as mjbatch

    from sims.libero import scenes
    from sims.libero.worlds import LiberoWorlds

    try:
        folder = scenes.task_dir(cfg.suite, cfg.task, cfg.cache)
    except scenes.SceneCacheError as err:
        raise BenchError(f"{err} (or set batched_num_envs=[] to measure the reference env only)") from None
    rng = np.random.default_rng(cfg.seed)

    def steps_per_s(worlds: LiberoWorlds, limit: bool = False) -> dict[str, float]:
        """The median env steps/s of ``repeats`` runs of ``steps`` random steps, each from init states
        0..N-1 (``steps_per_s``); ``limit``: also MuJoCo's own physics replaying each run's controls
        right after it (``physics_limit_steps_per_s``, ``limit_state_err``)."""
        n = worlds.num_envs
        ids = np.arange(n) % len(worlds.init_states)
        physics = worlds.physics
        batch = mjbatch.Batch(worlds.model, n, nthread=physics.batch.nthread, persistent=True) if limit else None
        rates, limit_rates, state_err = [], [], 0.0
        for _ in range(cfg.repeats):
            worlds.reset(ids, wait_steps=0)
            controls: list[np.ndarray] = []
            if limit:  # every substep's controls (a copy after the call: ~1 us of a ~1 ms substep)

                def substep(
                    *args: Any, _substep: Any = physics.substep, _controls: list = controls, **kwargs: Any
                ) -> None:
                    _substep(*args, **kwargs)
                    _controls.append(physics.ctrl.copy())

                physics.substep = substep  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                for _ in range(cfg.steps):
                    worlds.step(rng.uniform(-1, 1, (n, 7)))
                rates.append(n * cfg.steps / (time.perf_counter() - t0))
            finally:
                physics.__dict__.pop("substep", None)
            if batch is not None:
                seconds, qpos = replay_physics(
                    batch, worlds.init_states[ids], np.stack(controls, axis=1), worlds.arm.cfg.substeps
                )
                limit_rates.append(n * cfg.steps / seconds)
                state_err = max(state_err, float(np.abs(qpos - physics.qpos).max()))
        out = {"steps_per_s": float(np.median(rates))}
        if limit:
            out.update(physics_limit_steps_per_s=float(np.median(limit_rates)), limit_state_err=state_err)
        return out

    rows = []
    for contacts in scenes.BOX_CONTACTS:
        for n in cfg.batched_num_envs:
            worlds = LiberoWorlds(folder, n, box_contacts=contacts)
            timed = steps_per_s(worlds, limit=True)
            rate, limit_rate = timed["steps_per_s"], timed["physics_limit_steps_per_s"]
            rows.append(
                {
                    "box_contacts": contacts,
                    "num_envs": n,
                    "image_size": 0,
                    "render_faces": None,
                    "steps_per_s": round(rate, 2),
                    "ratio_vs_reference": round(rate / reference_rate, 2),
                    "physics_limit_steps_per_s": round(limit_rate, 2),
                    "ratio_to_limit": round(limit_rate / rate, 2),
                    "physics_nthread": worlds.physics.batch.nthread,
                    "limit_state_err": timed["limit_state_err"],
                }
            )
            print(
                f"[libero bench] ours, {contacts} box contacts, {n} envs: {rate:.1f} env steps/s "
                f"({rate / reference_rate:.2f}x the reference without rendering); MuJoCo's own physics of the same "
                f"substeps on {worlds.physics.batch.nthread} threads: {limit_rate:.1f} (ours takes "
                f"{limit_rate / rate:.2f}x its time)",
                flush=True,
            )
            worlds.close()
    if camera_rate is None:
        return rows
    n = cfg.batched_num_envs[0]
    for faces, antialias in [(None, True), *[(f, aa) for f in cfg.render_faces for aa in (True, False)]]:
        worlds = LiberoWorlds(
            folder,
            n,
            box_contacts="native",
            cameras=("agentview", "wrist"),
            image_size=128,
            render_faces=faces,
            antialias=antialias,
        )
        rate = steps_per_s(worlds)["steps_per_s"]
        rows.append(
            {
                "box_contacts": "native",
                "num_envs": n,
                "image_size": 128,
                "render_faces": faces,
                "antialias": antialias,
                "steps_per_s": round(rate, 2),
                "ratio_vs_reference": round(rate / camera_rate, 2),
            }
        )
        what = "meshes as they are" if faces is None else f"meshes decimated to {faces} faces"
        what += "" if antialias else ", no multisampling"
        print(
            f"[libero bench] ours, two 128 px cameras, {what}, {n} envs: {rate:.1f} env steps/s "
            f"({rate / camera_rate:.2f}x the reference with its two 128 px cameras)",
            flush=True,
        )
        worlds.close()
    return rows


def replay_physics(batch: Any, states: Any, controls: Any, substeps: int) -> tuple[float, Any]:
    """MuJoCo's own physics for a run of our controller: the simulations of ``batch`` (a
    ``mujoco.batch.Batch`` of the scene) from flattened states ``[n, 1 + nq + nv]`` (loaded as
    :meth:`sims.libero.physics.BatchPhysics.load` does), then the controls ``[n, steps * substeps, nu]``
    replayed, one ``Batch.rollout`` of ``substeps`` per control step. The seconds the replay took,
    and the qpos ``[n, nq]`` at its end."""
    import time

    import mujoco
    import numpy as np

    model = batch.model
    nq = model.nq
    batch.reset(None, stage=mujoco.mjtStage.mjSTAGE_NONE)
    batch.bind("time")[:], batch.bind("qpos")[:] = states[:, 0], states[:, 1 : 1 + nq]
    batch.bind("qvel")[:] = states[:, 1 + nq :]
    batch.forward(None, stage=mujoco.mjtStage.mjSTAGE_VEL)
    controls = np.ascontiguousarray(controls, dtype=np.float64)
    spec = int(mujoco.mjtState.mjSTATE_CTRL)
    t0 = time.perf_counter()
    for k in range(controls.shape[1] // substeps):
        batch.rollout(substeps, control=controls[:, k * substeps : (k + 1) * substeps], control_spec=spec, record=())
    return time.perf_counter() - t0, batch.bind("qpos").copy()


def rl_workload(cfg: LiberoBenchConfig, camera_case: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`benchmarks.chunk_render.time_workload` on ``cfg.suite``'s task ``cfg.task`` in our env (its
    defaults: reference box contacts, decimated meshes), two 128 px views; each row also against the
    reference env rendering every step (``camera_case["steps_per_s"]``, as openpi's and RLinf's loops run
    it) and rendering only at the chunk boundaries of the same H."""
    import sims
    from benchmarks.chunk_render import time_workload
    from sims.libero import scenes

    scenes.ensure_tasks(cfg.suite, [cfg.task], cfg.cache)

    def make(n: int) -> Any:
        return sims.make(
            "mujoco",
            suite=cfg.suite,
            tasks=[cfg.task],
            num_envs=n,
            seed=cfg.seed,
            cache=cfg.cache,
            cameras=("agentview", "wrist"),
            image_size=128,
        )

    rows = []
    every = camera_case["steps_per_s"]
    at_chunks = camera_case.get("chunk_boundary_steps_per_s", {})
    for row in time_workload(
        make,
        num_envs=cfg.workload_num_envs,
        chunk_sizes=cfg.workload_chunk_sizes,
        control_steps=cfg.workload_control_steps,
        repeats=cfg.workload_repeats,
        seed=cfg.seed,
        progress=lambda msg: print(f"[libero bench] RL workload {msg}", flush=True),
    ):
        rate = row["on_demand_env_steps_per_s"]
        boundary = at_chunks.get(str(row["chunk_size"]))
        row.update(
            suite=cfg.suite,
            task=cfg.task,
            image_size=128,
            vs_reference_every_step=round(rate / every, 2),
            reference_chunk_boundary_steps_per_s=boundary,
            vs_reference_chunk_boundary=None if not boundary else round(rate / boundary, 2),
        )
        print(
            f"[libero bench] RL workload, {row['num_envs']} envs, chunks of {row['chunk_size']}: {rate:.1f} env "
            f"steps/s on demand, {row['every_step_env_steps_per_s']:.1f} rendering every step "
            f"({row['speedup']:.2f}x); {row['vs_reference_every_step']:.1f}x the reference rendering every step"
            + ("" if not boundary else f", {row['vs_reference_chunk_boundary']:.1f}x rendering at chunk boundaries"),
            flush=True,
        )
        rows.append(row)
    return rows
