"""The GPU backends part of ``bench=sim``: env-steps/s of ``mujoco_gpu`` (our pick scene on MuJoCo
Warp) and ``maniskill`` (PickCube-v1) at large N, state-only and with one camera.

For every backend in ``cfg.gpu_backends`` and N in ``cfg.gpu_num_envs``: build the env (state
only, then with ``agentview`` at ``cfg.gpu_image_size``), ``cfg.warmup_steps`` untimed random-action
steps, then ``cfg.gpu_repeats`` timed runs of ``cfg.gpu_steps`` control steps; median env-steps/s.
On a machine without CUDA, MuJoCo Warp runs on Warp's CPU device and ManiSkill on PhysX CPU
(one scene per env): the numbers then only check the path, they say nothing about a GPU.
``mujoco_gpu``'s camera rows render with ``cfg.gpu_renderer`` (default ``auto``: MuJoCo Warp's
batched ray tracer on CUDA, OpenGL otherwise; ``warp`` / ``gl`` force one); each row records which
(``renderer``). ``mujoco_gpu`` rows come once per ``cfg.gpu_task_logic`` entry: the controller,
observations, rewards and success on the Warp device (``device``) or on host mirrors (``host``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import sims

TASK = {"mujoco_gpu": dict(task="pick_cube"), "maniskill": dict(task="pick_cube")}


def run_gpu_backends(cfg: Any) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(cfg.seed)
    logics = list(getattr(cfg, "gpu_task_logic", None) or ["device"])  # callers without the field: device only
    for backend in cfg.gpu_backends:
        for n in cfg.gpu_num_envs:
            for cams, logic in [
                (c, lg) for c in ((), ("agentview",)) for lg in (logics if backend == "mujoco_gpu" else [None])
            ]:
                kwargs = dict(
                    TASK[backend], num_envs=int(n), seed=cfg.seed, cameras=cams, image_size=cfg.gpu_image_size
                )
                if backend == "mujoco_gpu":
                    kwargs["task_logic"] = logic
                    if cams:
                        kwargs["renderer"] = cfg.gpu_renderer
                t0 = time.perf_counter()
                env = sims.make(backend, **kwargs)
                build = time.perf_counter() - t0
                try:
                    env.reset()
                    for _ in range(cfg.warmup_steps):
                        env.step(torch.rand(int(n), 7, generator=gen) * 2 - 1)
                    rates = []
                    for _ in range(cfg.gpu_repeats):
                        acts = [torch.rand(int(n), 7, generator=gen) * 2 - 1 for _ in range(cfg.gpu_steps)]
                        t0 = time.perf_counter()
                        for a in acts:
                            env.step(a)
                        rates.append(int(n) * cfg.gpu_steps / (time.perf_counter() - t0))
                    device = getattr(getattr(env, "sim", None), "device", None) or getattr(env, "sim_backend", "")
                    renderer = getattr(env, "renderer", backend) if cams else None
                    raw = raw_physics_rates(env, cfg.gpu_steps, cfg.gpu_repeats) if backend == "mujoco_gpu" else None
                finally:
                    env.close()
                row = {
                    "backend": backend,
                    "num_envs": int(n),
                    "camera": bool(cams),
                    "image_size": cfg.gpu_image_size,
                    "device": str(device),
                    "renderer": renderer,
                    "task_logic": logic,
                    "build_s": round(build, 2),
                    "cuda_graph": getattr(getattr(env, "sim", None), "cuda_graph", None),
                    "env_steps_per_s": round(statistics.median(rates), 1),
                    "samples": [round(r, 1) for r in rates],
                }
                if raw:
                    row["raw_physics_steps_per_s"] = round(statistics.median(raw), 1)
                    row["env_vs_raw"] = round(row["env_steps_per_s"] / row["raw_physics_steps_per_s"], 3)
                rows.append(row)
                extra = f", raw physics {row['raw_physics_steps_per_s']:.0f}" if raw else ""
                where = f", task logic on the {logic}" if logic else ""
                print(
                    f"{backend:10s} N={n:5d} {'rgb' if cams else 'state'}: {row['env_steps_per_s']:.0f} env-steps/s "
                    f"({row['device']}{', ' + str(renderer) + ' renderer' if renderer else ''}{where}{extra})",
                    flush=True,
                )
    return rows


def raw_physics_rates(env: Any, steps: int, repeats: int) -> list[float]:
    """The raw library doing the env's physics: MuJoCo Warp stepping the env's worlds ``env.substeps``
    times per control step (the same CUDA-graph replay the env uses), with no host copies, task logic or
    observations. Control steps x N per second, one value per repeat."""
    sim = env.sim
    wp = sim.wp
    rates = []
    with wp.ScopedDevice(sim.device):
        sim._physics(env.substeps)  # capture / compile outside the timing
        wp.synchronize()
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                sim._physics(env.substeps)
            wp.synchronize()
            rates.append(env.num_envs * steps / (time.perf_counter() - t0))
    return rates
