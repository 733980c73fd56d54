"""``embodied-pipeline``: the main job on the embedded default (MuJoCo on CPU).

Stages so far:

1. ``collect``: the scripted experts of a suite in parallel envs write a LeRobot v3.0
   demonstration dataset (``out/data``).

Outputs in the run folder ``out``: ``results.json`` (per-task expert success rates, dataset
size, throughput, machine), ``report.md``, ``videos/collect.mp4`` (the first demonstration of the
first tasks, both camera views side by side with the instruction and the step drawn on), and
Hydra's ``.hydra/config.yaml``. Later stages (SFT -> RL -> eval) extend this app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import OmegaConf

from embodied.config import SimConfig, store
from embodied.runs import machine_info, prepare_run_dir, write_json
from embodied.video import VideoWriter, annotate_frame, count_frames


@dataclass
class PipelineConfig:
    """Schema of ``embodied-pipeline``."""

    sim: SimConfig = field(default_factory=SimConfig)  # suite, parallel envs, cameras, image size
    out: str = "runs/pipeline"  # run folder: every output goes here
    seed: int = 0
    episodes_per_task: int = 2  # demonstrations collected per task of the suite
    video_tasks: int = 3  # first demonstration of this many tasks goes into videos/collect.mp4


store("pipeline_schema", PipelineConfig)


def stage_collect(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    """Collect demonstrations on ``cfg.sim.suite``; returns the stage's results."""
    import sims
    from embodied.data.collect import collect_suite

    if cfg.sim.suite is None:
        raise ValueError("the collect stage needs a suite: set sim.suite=spatial (or object, goal, long, dynamic)")
    if cfg.sim.suite not in sims.suites.names():
        raise ValueError(f"unknown suite {cfg.sim.suite!r}; choose one of {sims.suites.names()}")
    if cfg.video_tasks > 0 and not cfg.sim.cameras:
        raise ValueError("video_tasks > 0 needs cameras: set sim.cameras=[agentview,wrist] or video_tasks=0")
    video = VideoWriter(out / "videos" / "collect.mp4", fps=cfg.sim.control_hz) if cfg.video_tasks else None
    filmed: set[int] = set()

    def film(ep: dict[str, Any]) -> None:
        if video is None or ep["rgb"] is None or ep["task"] in filmed or len(filmed) >= cfg.video_tasks:
            return
        filmed.add(ep["task"])
        instruction = sims.suites.tasks(cfg.sim.suite)[ep["task"]].instruction
        for step, views in enumerate(ep["rgb"]):
            video.write(annotate_frame(list(views), [
                instruction, f"task {ep['task']}  init {ep['init_id']}  step {step + 1}/{ep['length']}  "
                f"success {ep['success'] and step + 1 == ep['length']}"]))

    try:
        result = collect_suite(
            cfg.sim.suite, out / "data", episodes_per_task=cfg.episodes_per_task, num_envs=cfg.sim.num_envs,
            cameras=cfg.sim.cameras, image_size=cfg.sim.image_size, seed=cfg.seed,
            num_threads=cfg.sim.num_threads or None, on_episode=film,
        )
    finally:
        if video is not None:
            video.close()
    rates = [t["success_rate"] for t in result.tasks]
    return {
        "suite": cfg.sim.suite,
        "dataset": str(result.root.relative_to(out)),
        "episodes": result.episodes,
        "frames": result.frames,
        "wall_s": round(result.wall_s, 2),
        "frames_per_s": round(result.frames / max(result.wall_s, 1e-9), 1),
        "expert_success_rate": float(np.mean(rates)),
        "tasks": result.tasks,
        "video": str(video.path.relative_to(out)) if video is not None else None,
        "video_frames": count_frames(video.path) if video is not None else 0,
    }


def write_report(results: dict[str, Any], out: Path) -> Path:
    """``report.md``: what the run did, per task."""
    c = results["collect"]
    lines = [
        f"# Pipeline run: suite `{c['suite']}`",
        "",
        "## Stage 1: demonstrations from the scripted experts",
        "",
        f"{c['episodes']} episodes, {c['frames']} frames in {c['wall_s']:.1f} s "
        f"({c['frames_per_s']:.0f} frames/s with rendering), dataset `{c['dataset']}` (LeRobot v3.0 layout).",
        f"Mean expert success: **{c['expert_success_rate']:.1%}**.",
        "",
        "| task | instruction | success | attempts | kept |",
        "|---|---|---|---|---|",
    ]
    for t in c["tasks"]:
        lines.append(f"| {t['task']} {t['name']} | {t['instruction']} | {t['success_rate']:.0%} | "
                     f"{t['attempts']} | {t['episodes']} |")
    lines.append("")
    if c["video"]:
        lines += [f"Video: [{c['video']}]({c['video']}) ({c['video_frames']} frames)", ""]
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
    if (out / "data" / "meta" / "info.json").exists():
        raise SystemExit(f"embodied-pipeline: {out} already holds a finished run; choose a new out=...")
    try:
        results = {"collect": stage_collect(config, out), "machine": machine_info()}
    except ValueError as err:
        raise SystemExit(f"embodied-pipeline: {err}") from None
    write_json(out / "results.json", results)
    report = write_report(results, out)
    print(f"expert success {results['collect']['expert_success_rate']:.1%} on suite {config.sim.suite}; "
          f"report: {report}")


if __name__ == "__main__":
    main()
