"""``bench=libero``: the reference LIBERO env's speed here, and what one official evaluation costs.

Runs :mod:`sims.libero.reference.bench` in ``.venv-libero``: env steps/s with two cameras at each
of ``image_sizes`` and without rendering (random actions; the median of ``repeats`` runs of
``steps`` steps), and the seconds of a reset with and without ``hard_reset``. From them, the time of
one full official evaluation of each suite on this machine (10 tasks, 90 for libero_90, x 50
initial states; every episode at its step limit plus the 10 wait steps, the worst case, and a reset
each) at the protocol's 256 px, env time only (the policy's inference comes on top). Then the same
task's exported scene in our batched physics (:class:`sims.libero.worlds.LiberoWorlds`: LIBERO's
controller and goal on MuJoCo 4, no rendering) at each of ``batched_num_envs``, with both box-contact
settings, against the reference's no-rendering rate measured in the same run (``ratio_vs_reference``),
and with the two cameras at 128 px (visual meshes as they are, and decimated to ``render_faces``
with and without multisampling) against the reference's rate with its two cameras at 128 px (when
``image_sizes`` has 128).
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

    if not cfg.image_sizes or any(s < 16 for s in cfg.image_sizes):
        raise BenchError(f"image_sizes must be sizes >= 16 px, got {cfg.image_sizes}")
    try:
        libero.base_suite(cfg.suite)
        argv, env = libero.reference_command("bench", [
            "--suite", cfg.suite, "--task", str(cfg.task), "--image-sizes", *map(str, cfg.image_sizes),
            "--steps", str(cfg.steps), "--repeats", str(cfg.repeats), "--resets", str(cfg.resets),
            "--seed", str(cfg.seed)])
    except (ValueError, libero.LiberoSetupError) as err:
        raise BenchError(str(err)) from None
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    result, tail = None, []
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        else:
            tail = (tail + [line.rstrip()])[-20:]
            if line.startswith("[libero bench]"):
                print(line.rstrip(), flush=True)
    if proc.wait() != 0 or result is None:
        raise BenchError(f"the reference env benchmark failed (status {proc.returncode}): " + "\n".join(tail[-5:]))
    by_size = {c["image_size"]: c for c in result["cases"]}
    protocol = by_size.get(256) or by_size[max(cfg.image_sizes)]
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
    result["machine"] = machine_info()
    result["config"] = {k: getattr(cfg, k) for k in ("suite", "task", "image_sizes", "steps", "repeats", "resets",
                                                      "batched_num_envs", "render_faces", "cache")}
    write_json(out / "libero.json", result)
    with open(out / "libero.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "image_size", "steps_per_s", "soft_reset_s", "build_s"])
        for c in result["cases"]:
            w.writerow([c["case"], c["image_size"], c["steps_per_s"], c["soft_reset_s"], c["build_s"]])
        w.writerow(["hard reset", "", "", result["hard_reset_s"], ""])
        for b in result["batched"]:
            meshes = "" if b["render_faces"] is None else f", meshes {b['render_faces']} faces"
            meshes += "" if b.get("antialias", True) else ", no multisampling"
            w.writerow([f"ours {b['box_contacts']} contacts, {b['num_envs']} envs{meshes}", b["image_size"],
                        b["steps_per_s"], "", ""])
    return result


def batched_rates(cfg: LiberoBenchConfig, reference_rate: float, camera_rate: float | None = None
                  ) -> list[dict[str, Any]]:
    """Env steps/s of :class:`LiberoWorlds` (random actions, the median of ``repeats`` runs of ``steps``
    steps): without rendering per env count and box-contact setting, against ``reference_rate``; with
    two 128 px cameras per mesh setting, against ``camera_rate`` (the reference's, None: skipped)."""
    import time

    import numpy as np

    from sims.libero import scenes
    from sims.libero.worlds import LiberoWorlds

    try:
        folder = scenes.task_dir(cfg.suite, cfg.task, cfg.cache)
    except scenes.SceneCacheError as err:
        raise BenchError(f"{err} (or set batched_num_envs=[] to measure the reference env only)") from None
    rng = np.random.default_rng(cfg.seed)

    def steps_per_s(worlds: LiberoWorlds) -> float:
        """The median env steps/s of ``repeats`` runs of ``steps`` random steps from init states 0.."""
        n = worlds.num_envs
        worlds.reset(np.arange(n) % len(worlds.init_states), wait_steps=0)
        rates = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            for _ in range(cfg.steps):
                worlds.step(rng.uniform(-1, 1, (n, 7)))
            rates.append(n * cfg.steps / (time.perf_counter() - t0))
        return float(np.median(rates))

    rows = []
    for contacts in scenes.BOX_CONTACTS:
        for n in cfg.batched_num_envs:
            worlds = LiberoWorlds(folder, n, box_contacts=contacts)
            rate = steps_per_s(worlds)
            rows.append({"box_contacts": contacts, "num_envs": n, "image_size": 0, "render_faces": None,
                         "steps_per_s": round(rate, 2), "ratio_vs_reference": round(rate / reference_rate, 2)})
            print(f"[libero bench] ours, {contacts} box contacts, {n} envs: {rate:.1f} env steps/s "
                  f"({rate / reference_rate:.2f}x the reference without rendering)", flush=True)
            worlds.close()
    if camera_rate is None:
        return rows
    n = cfg.batched_num_envs[0]
    for faces, antialias in [(None, True), *[(f, aa) for f in cfg.render_faces for aa in (True, False)]]:
        worlds = LiberoWorlds(folder, n, box_contacts="native", cameras=("agentview", "wrist"), image_size=128,
                              render_faces=faces, antialias=antialias)
        rate = steps_per_s(worlds)
        rows.append({"box_contacts": "native", "num_envs": n, "image_size": 128, "render_faces": faces,
                     "antialias": antialias,
                     "steps_per_s": round(rate, 2), "ratio_vs_reference": round(rate / camera_rate, 2)})
        what = "meshes as they are" if faces is None else f"meshes decimated to {faces} faces"
        what += "" if antialias else ", no multisampling"
        print(f"[libero bench] ours, two 128 px cameras, {what}, {n} envs: {rate:.1f} env steps/s "
              f"({rate / camera_rate:.2f}x the reference with its two 128 px cameras)", flush=True)
        worlds.close()
    return rows
