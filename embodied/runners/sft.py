"""``embodied-sft``: supervised fine-tuning of any policy family on a demonstration dataset.

    embodied-sft data=DIR policy=flow out=DIR [steps=2000] [resume=true] [eval.suite=spatial]
    embodied-sft data=DIR init=LEROBOT_CHECKPOINT out=DIR      # fine-tune a pretrained pi0 / pi0.5 / SmolVLA

Writes into ``out``: ``ckpt/`` (the policy bundle, refreshed every ``save_every`` steps and at the
end), ``train_state/`` (optimizer, step, RNG: what ``resume=true`` continues from),
``metrics.csv`` (step, loss, lr, seconds), TensorBoard events under ``tb/``, ``sft.json`` (summary)
and, with ``eval.suite`` set, ``eval.json``: success per task on the suite's fixed initial states.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied.config import hydra_app, policy_overrides, register_policy_schemas, store
from embodied.metrics_log import MetricsLog, check_logger
from embodied.runs import machine_info, plain_config, prepare_run_dir, write_json

#: the columns of ``metrics.csv``
METRIC_FIELDS = ["step", "loss", "lr", "seconds"]


@dataclass
class SFTEvalConfig:
    """Evaluation after training (skipped when ``suite`` is null)."""

    suite: Optional[str] = None  # e.g. spatial
    tasks: Optional[list[int]] = None  # task indices (default: all)
    episodes_per_task: int = 10  # fixed initial states 0..k-1 per task
    num_envs: int = 10
    # rendered size; default: the dataset's frame size, so the policy sees images made as in training
    # (rendering at another size and resizing changes how small objects look)
    image_size: Optional[int] = None


@dataclass
class SFTConfig:
    """Schema of ``embodied-sft``."""

    data: str = MISSING  # demonstration dataset (LeRobot v3.0 layout, e.g. from embodied-collect)
    out: str = MISSING  # run folder
    policy: Any = MISSING  # config group policy/: flow | autoregressive | diffusion | pi0 | pi05 | smolvla
    # start from this policy instead of a fresh one of the policy group: a bundle, or a LeRobot checkpoint
    # folder (pi0, pi0.5, SmolVLA; in .venv-lerobot). Its state/action statistics are replaced by the
    # dataset's, as LeRobot's fine-tuning does.
    init: Optional[str] = None
    # with a LeRobot checkpoint as init: our camera names for its image features, in their order (e.g.
    # [agentview,wrist] for LeRobot's LIBERO checkpoints, whose features are image and wrist_image)
    init_cameras: Optional[list[str]] = None
    steps: int = 2000  # optimizer steps
    batch_size: int = 64
    lr: float = 3e-4
    weight_decay: float = 1e-4
    warmup_steps: int = 100  # linear warm-up, then cosine decay to 10%
    grad_clip: float = 1.0
    augment_shift: int = 0  # random shift of every view by up to this many pixels (DrQ); 0 = off
    save_every: int = 500  # bundle + training state every this many steps
    log_every: int = 25
    seed: int = 0
    device: str = "cpu"
    # torch threads (null: torch's default, one per core). The count changes the order of floating-point
    # sums, so a fixed count trains the same policy on machines with other core counts (of one CPU type).
    threads: Optional[int] = None
    resume: bool = False  # continue from out/train_state and out/ckpt
    logger: str = "tensorboard"  # where the scalars go besides metrics.csv: tensorboard | wandb | both
    episodes: Optional[list[int]] = None  # subset of the dataset's episodes (default: all)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)


store("sft_schema", SFTConfig)
register_policy_schemas()


def _lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0))))


def _start_policy(cfg: SFTConfig, out: Path) -> tuple[Any, str, dict[str, Any]]:
    """The policy SFT starts from (this run's checkpoint on resume, ``cfg.init``'s bundle, or a new one of
    the policy group), its family and its config overrides."""
    import policies

    family, overrides = policy_overrides(cfg.policy)
    if cfg.resume:
        if not (out / "ckpt" / "config.json").is_file():
            raise FileNotFoundError(f"resume=true but {out / 'ckpt'} holds no checkpoint bundle")
        return policies.load(out / "ckpt", device=cfg.device).train(), family, overrides
    if (out / "ckpt" / "config.json").is_file():
        raise FileExistsError(f"{out} already holds a checkpoint: pass resume=true to continue, or a new out=...")
    if cfg.init is not None:
        policy = policies.load(cfg.init, device=cfg.device, cameras=cfg.init_cameras).train()
        print(
            f"embodied-sft: starting from {cfg.init} (a {policy.family} policy; the policy group is not used)",
            flush=True,
        )
        return policy, policy.family, policy.config.to_dict()
    return policies.make(family, **overrides).to(cfg.device), family, overrides


def _sized_to_data(cfg: SFTConfig, policy: Any, family: str, overrides: dict[str, Any], width: int) -> Any:
    """The policy, made again with ``state_dim=width`` when it was left at its default size and the
    dataset's state has another (privileged vectors, another robot's proprioception, real LIBERO's 8-D
    state); a mismatch the user chose is refused."""
    import policies

    if width == policy.config.state_dim:
        return policy
    state_obs = policy.config.state_obs
    default_dim = policies.config_class(family)().state_dim
    if cfg.resume or cfg.init is not None or (state_obs != "privileged" and policy.config.state_dim != default_dim):
        raise ValueError(
            f"the dataset's state has {width} values (state_obs={state_obs!r}), the policy reads "
            f"{policy.config.state_dim}: set policy.state_dim={width} or use a matching dataset"
        )
    print(f"embodied-sft: policy.state_dim={width}, the dataset's state (state_obs={state_obs!r})", flush=True)
    return policies.make(family, **{**overrides, "state_dim": width}).to(cfg.device)


def _sft_step(
    policy: Any, optimizer: torch.optim.Optimizer, demos: Any, gen: torch.Generator, cfg: SFTConfig, step: int
) -> float:
    """One optimiser step on a random batch of ``cfg.batch_size`` chunks (random image shifts); its loss."""
    from embodied.data.augment import random_shift

    idx = torch.randint(0, len(demos), (cfg.batch_size,), generator=gen)
    obs, chunks = demos.batch(idx)
    if policy.config.cameras:
        obs["rgb"] = random_shift(obs["rgb"], cfg.augment_shift, gen)
    loss = policy.sft_loss(obs, chunks)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite SFT loss at step {step}; lower lr=... (now {cfg.lr})")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.item()


def _fit(
    cfg: SFTConfig, out: Path, policy: Any, optimizer: torch.optim.Optimizer, demos: Any, start_step: int
) -> tuple[int, list[float], float]:
    """Steps ``start_step..cfg.steps`` with the learning-rate schedule, logging every ``cfg.log_every``
    and checkpointing every ``cfg.save_every``; the step reached, the losses and the seconds."""
    metrics = MetricsLog(
        out,
        METRIC_FIELDS,
        "step",
        resume_upto=start_step if cfg.resume else None,
        tb_prefix="sft",
        logger=cfg.logger,
        config=plain_config(cfg),
    )
    gen = torch.Generator().manual_seed(cfg.seed + start_step)
    t0 = time.perf_counter()
    losses: list[float] = []
    policy.train()
    step = start_step
    try:
        with tqdm(total=cfg.steps, initial=start_step, desc=f"sft {policy.family}", unit="step") as bar:
            for step in range(start_step, cfg.steps):
                lr = _lr_at(step, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                losses.append(_sft_step(policy, optimizer, demos, gen, cfg, step))
                if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                    mean = float(np.mean(losses[-cfg.log_every :]))
                    metrics.row(
                        {
                            "step": step + 1,
                            "loss": f"{mean:.6f}",
                            "lr": f"{lr:.3e}",
                            "seconds": f"{time.perf_counter() - t0:.1f}",
                        }
                    )
                    metrics.scalars({"loss": mean, "lr": lr}, step + 1)
                    bar.set_postfix(loss=f"{mean:.4f}")
                if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                    _checkpoint(policy, optimizer, step + 1, out, cfg)
                bar.update(1)
            step = cfg.steps
    finally:
        metrics.close()
    return step, losses, time.perf_counter() - t0


def train(cfg: SFTConfig) -> dict[str, Any]:
    """Run SFT as configured; returns the summary written to ``sft.json``."""
    from embodied.data.training import load_demonstrations
    from embodied.train_state import load_train_state

    check_logger(cfg.logger)
    if cfg.augment_shift < 0:
        raise ValueError(f"augment_shift must be >= 0 pixels, got {cfg.augment_shift}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 (or null for one per core), got {cfg.threads}")
    out = prepare_run_dir(cfg.out)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    policy, family, overrides = _start_policy(cfg, out)
    demos = load_demonstrations(
        cfg.data,
        chunk_size=policy.config.chunk_size,
        image_size=policy.config.image_size,
        cameras=policy.config.cameras,
        episodes=cfg.episodes,
        state_obs=policy.config.state_obs,
    )
    policy = _sized_to_data(cfg, policy, family, overrides, int(demos.state.shape[1]))
    if not cfg.resume:
        policy.processor.set_stats(policy.processor.stats_from_arrays(demos.state.numpy(), demos.actions.numpy()))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_step = int(load_train_state(out / "train_state", optimizer=optimizer)["step"]) if cfg.resume else 0
    step, losses, seconds = _fit(cfg, out, policy, optimizer, demos, start_step)
    _checkpoint(policy, optimizer, step, out, cfg)
    summary = {
        "family": policy.family,
        "data": str(cfg.data),
        "episodes": int(demos.episode.unique().numel()),
        "samples": len(demos),
        "steps": step,
        "final_loss": float(np.mean(losses[-cfg.log_every :])) if losses else None,
        "train_seconds": round(seconds, 1),
        "checkpoint": str(out / "ckpt"),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "machine": machine_info(),
    }
    if cfg.eval.suite:
        from embodied.eval.quick import evaluate_suite

        result = evaluate_suite(
            policy,
            cfg.eval.suite,
            tasks=cfg.eval.tasks,
            episodes_per_task=cfg.eval.episodes_per_task,
            num_envs=cfg.eval.num_envs,
            image_size=cfg.eval.image_size or demos.frame_size,
            seed=cfg.seed,
        )
        write_json(out / "eval.json", result)
        summary["eval_success_rate"] = result["success_rate"]
    write_json(out / "sft.json", summary)
    return summary


def _checkpoint(policy: Any, optimizer: torch.optim.Optimizer, step: int, out: Path, cfg: SFTConfig) -> None:
    import policies
    from embodied.train_state import save_train_state

    # weights first, then the state that points at them: a kill in between resumes one save back
    policies.save(policy, out / "ckpt", extra={"step": step, "data": str(cfg.data)})
    save_train_state(out / "train_state", optimizer=optimizer, step=step)


@hydra_app("embodied-sft", "sft")
def main(cfg: Any) -> None:
    config: SFTConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        summary = train(config)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        raise SystemExit(f"embodied-sft: {err}") from None
    line = f"trained {summary['family']} for {summary['steps']} steps, final loss {summary['final_loss']:.4f}"
    if "eval_success_rate" in summary:
        line += f", success {summary['eval_success_rate']:.1%} on {config.eval.suite}"
    print(line + f"; bundle: {summary['checkpoint']}")


if __name__ == "__main__":
    main()
