"""``embodied-collect``: scripted experts in parallel envs -> a demonstration dataset.

    embodied-collect suite=spatial episodes_per_task=10 out=DIR [tasks=[0,3]]
    embodied-collect suite=libero_spatial episodes_per_task=5 out=DIR   # real LIBERO in our simulator
    embodied-collect suite=maniskill cameras=[agentview] episodes_per_task=5 out=DIR   # ManiSkill's planners
    embodied-collect suite=libero_spatial checkpoint=BUNDLE init_pool=protocol episodes_per_task=50 \
        attempts_per_task=50 out=DIR   # a policy's successful greedy rollouts, once per protocol state

Writes a LeRobot v3.0 dataset into ``DIR`` (see :mod:`embodied.data.lerobot_format`) and
``DIR/summary.json``: ``{"tasks": [{"suite", "task", "name", "episodes", "success_rate"}]}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf

from embodied.config import hydra_app, store
from embodied.runs import machine_info, prepare_run_dir, write_json


@dataclass
class CollectConfig:
    """Schema of ``embodied-collect``."""

    suite: str = "spatial"  # spatial | object | goal | long | dynamic | maniskill | libero_spatial | ...
    episodes_per_task: int = 10  # demonstrations kept per task
    out: str = MISSING  # dataset folder (must not hold a dataset already)
    tasks: Optional[list[int]] = None  # task indices of the suite (default: all)
    num_envs: int = 8  # parallel envs
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])  # recorded views
    image_size: Optional[int] = None  # square images (pixels); default: 128, with checkpoint the policy's
    keep_failures: bool = False  # also store failed expert episodes (flagged success=false)
    seed: int = 0
    num_threads: int = 0  # MuJoCo threads; 0 = all cores
    expert_gain: float = 1.0  # share of the remaining error the experts command per step (<1: smoother chunks)
    action_noise: float = 0.0  # DART: std of noise on the executed arm actions; the clean expert action is recorded
    # a policy bundle acting instead of the experts (its executed actions recorded; e.g. its successful
    # rollouts for self-imitation), sampling in mode: greedy (the ODE evaluation scores) | explore
    checkpoint: Optional[str] = None
    mode: str = "greedy"
    init_pool: str = "training"  # where episodes start: training (states) | protocol (0..49: checkpoint only)
    attempts_per_task: Optional[int] = None  # episodes run per task at most (default: 2 x episodes_per_task + 2)


store("collect_schema", CollectConfig)


def run(cfg: CollectConfig) -> dict[str, Any]:
    import sims
    from embodied.data.collect import collect_suite

    choices = sims.suites.expert_names() if cfg.checkpoint is None else sims.suites.env_names()
    if cfg.suite not in choices:
        raise ValueError(f"unknown suite {cfg.suite!r}; choose one of {choices}")
    actor, image_size = None, cfg.image_size or 128
    if cfg.checkpoint is not None:
        import policies
        from embodied.data.collect import PolicyActor

        if cfg.mode not in ("greedy", "explore"):
            raise ValueError(f"mode={cfg.mode!r}: choose greedy or explore")
        policy = policies.load(cfg.checkpoint)
        image_size = cfg.image_size or policy.config.image_size
        if image_size != policy.config.image_size:
            raise ValueError(
                f"image_size={image_size}: the policy reads {policy.config.image_size}-pixel views; leave "
                "image_size unset to record what it sees"
            )
        actor = PolicyActor(policy, cfg.mode, cfg.seed)
    out = prepare_run_dir(cfg.out)
    result = collect_suite(
        cfg.suite,
        out,
        episodes_per_task=cfg.episodes_per_task,
        task_ids=cfg.tasks,
        num_envs=cfg.num_envs,
        cameras=cfg.cameras,
        image_size=image_size,
        keep_failures=cfg.keep_failures,
        max_attempts_per_task=cfg.attempts_per_task,
        seed=cfg.seed,
        num_threads=cfg.num_threads or None,
        expert_gain=cfg.expert_gain,
        action_noise=cfg.action_noise,
        actor=actor,
        init_pool=cfg.init_pool,
    )
    summary = {
        "suite": cfg.suite,
        "actor": "experts" if cfg.checkpoint is None else {"checkpoint": cfg.checkpoint, "mode": cfg.mode},
        "init_pool": cfg.init_pool,
        "episodes": result.episodes,
        "frames": result.frames,
        "wall_s": round(result.wall_s, 2),
        "tasks": result.tasks,
        "machine": machine_info(),
    }
    write_json(out / "summary.json", summary)
    return summary


@hydra_app("embodied-collect", "collect")
def main(cfg: Any) -> None:
    config: CollectConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    from sims.libero.scenes import SceneCacheError

    try:
        summary = run(config)
    except (ValueError, FileExistsError, SceneCacheError) as err:
        raise SystemExit(f"embodied-collect: {err}") from None
    low = [t for t in summary["tasks"] if t["episodes"] < config.episodes_per_task]
    print(f"wrote {summary['episodes']} episodes ({summary['frames']} frames) to {config.out}")
    for t in low:
        print(
            f"warning: task {t['task']} {t['name']} kept {t['episodes']} episodes "
            f"({'expert' if config.checkpoint is None else 'policy'} success {t['success_rate']:.0%})"
        )


if __name__ == "__main__":
    main()
