"""``embodied-pipeline``: the main job on the embedded default (MuJoCo on CPU).

Stage implemented so far: scripted pick-and-place in N parallel envs. It writes into the run
folder ``out``: ``results.json`` (success rate, episode lengths, throughput, machine),
``report.md``, ``episodes.csv`` and ``videos/scripted.mp4`` (both camera views side by side, the
instruction and the step drawn on each frame), plus Hydra's ``.hydra/config.yaml``.
Later stages (collect -> SFT -> RL -> eval) extend this app.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from embodied.config import SimConfig, make_env, store
from embodied.runs import machine_info, prepare_run_dir, write_json
from embodied.video import VideoWriter, annotate_frame, count_frames

SCRIPTED_TASKS = ("pick_cube", "place_cube")


@dataclass
class PipelineConfig:
    """Schema of ``embodied-pipeline``."""

    sim: SimConfig = field(default_factory=SimConfig)
    out: str = "runs/pipeline"  # run folder: every output goes here
    seed: int = 0  # seed of the per-env random streams
    episodes: int = 16  # scripted episodes in total, spread over the parallel envs
    video_episodes: int = 2  # episodes of env 0 recorded into videos/scripted.mp4 (0: none)


store("pipeline_schema", PipelineConfig)


def run_scripted(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    """Run the scripted pick-and-place expert; return the results written to ``results.json``."""
    from sims.mujoco.scripted import PickPlaceExpert

    if cfg.sim.task not in SCRIPTED_TASKS:
        raise ValueError(f"the scripted stage runs {SCRIPTED_TASKS}, not sim.task={cfg.sim.task!r}")
    if cfg.episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {cfg.episodes}")
    cameras = list(cfg.sim.cameras)
    if cfg.video_episodes > 0 and not cameras:
        raise ValueError("video_episodes > 0 needs cameras: set sim.cameras=[agentview,wrist] or video_episodes=0")
    n = min(cfg.sim.num_envs, cfg.episodes)
    env = make_env(cfg.sim, seed=cfg.seed, num_envs=n)
    task = env.tasks[0]
    expert = PickPlaceExpert(n, place=cfg.sim.task == "place_cube")
    quota = np.array([cfg.episodes // n + (i < cfg.episodes % n) for i in range(n)])
    finished = np.zeros(n, np.int64)
    episodes: list[dict[str, Any]] = []
    video = VideoWriter(out / "videos" / "scripted.mp4", fps=env.control_hz) if cfg.video_episodes else None
    steps = 0
    start = time.perf_counter()
    try:
        obs = env.reset(seed=cfg.seed)
        with tqdm(total=cfg.episodes, desc=f"scripted {task.name}", unit="ep") as bar:
            while (finished < quota).any():
                active = finished < quota
                actions = expert.act(obs)
                obs, reward, term, trunc, info = env.step(actions, active=torch.as_tensor(active))
                steps += int(active.sum())
                if video is not None and finished[0] < cfg.video_episodes and active[0]:
                    shown = info["final_obs"] if info["done"][0] else obs
                    video.write(annotate_frame(
                        list(shown["rgb"][0].numpy()),
                        [task.instruction,
                         f"episode {finished[0]}  step {int(info['episode']['length'][0]) if info['done'][0] else int(info['elapsed'][0])}"
                         f"  success {bool(info['success'][0])}"],
                    ))
                done = info["done"].numpy() & active
                for i in np.flatnonzero(done):
                    episodes.append({
                        "env": int(i), "episode": int(finished[i]),
                        "success": bool(info["success"][i]),
                        "length": int(info["episode"]["length"][i]),
                        "diverged": bool(info["diverged"][i]),
                    })
                finished += done
                expert.reset(done)
                bar.update(int(done.sum()))
    finally:
        if video is not None:
            video.close()
        env.close()
    wall = time.perf_counter() - start
    successes = np.array([e["success"] for e in episodes])
    lengths = np.array([e["length"] for e in episodes])
    results = {
        "stage": "scripted",
        "task": task.name,
        "instruction": task.instruction,
        "num_envs": n,
        "episodes": len(episodes),
        "success_rate": float(successes.mean()),
        "mean_length": float(lengths.mean()),
        "max_steps": task.max_steps,
        "diverged": int(sum(e["diverged"] for e in episodes)),
        "env_steps": steps,
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(steps / wall, 1),
        "cameras": cameras,
        "image_size": cfg.sim.image_size,
        "video": str(video.path.relative_to(out)) if video is not None else None,
        "video_frames": count_frames(video.path) if video is not None else 0,
        "machine": machine_info(),
    }
    with open(out / "episodes.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["env", "episode", "success", "length", "diverged"])
        writer.writeheader()
        writer.writerows(episodes)
    return results


def write_report(results: dict[str, Any], out: Path) -> Path:
    """A short Markdown report of the run."""
    lines = [
        f"# Scripted pick-and-place: `{results['task']}`",
        "",
        f"Instruction: *{results['instruction']}*",
        "",
        "| metric | value |",
        "|---|---|",
        f"| episodes | {results['episodes']} ({results['num_envs']} parallel envs) |",
        f"| success rate | {results['success_rate']:.1%} |",
        f"| mean episode length | {results['mean_length']:.1f} / {results['max_steps']} steps |",
        f"| diverged episodes | {results['diverged']} |",
        f"| throughput | {results['env_steps_per_s']:.0f} env-steps/s "
        f"({', '.join(results['cameras']) or 'no cameras'} at {results['image_size']}px) |",
        f"| wall time | {results['wall_s']:.1f} s |",
        "",
    ]
    if results["video"]:
        lines += [f"Video: [{results['video']}]({results['video']}) ({results['video_frames']} frames)", ""]
    m = results["machine"]
    lines += [f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}, mujoco {m['mujoco']}, "
              f"GL {m['mujoco_gl']}", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


@hydra.main(config_path="pkg://configs", config_name="pipeline", version_base="1.3")
def main(cfg: Any) -> None:
    config: PipelineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    out = prepare_run_dir(config.out)
    results = run_scripted(config, out)
    write_json(out / "results.json", results)
    report = write_report(results, out)
    print(f"success rate {results['success_rate']:.1%} over {results['episodes']} episodes; "
          f"report: {report}")


if __name__ == "__main__":
    main()
