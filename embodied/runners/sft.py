"""``embodied-sft``: supervised fine-tuning of any policy family on a demonstration dataset.

    embodied-sft data=DIR policy=flow out=DIR [steps=2000] [resume=true] [eval.suite=spatial]
    embodied-sft data=DIR init=LEROBOT_CHECKPOINT out=DIR      # fine-tune a pretrained pi0 / pi0.5 / SmolVLA
    embodied-sft data=DIR policy=flow out=DIR nproc=4          # DDP on 4 local processes (or under torchrun)

Writes into ``out``: ``ckpt/`` (the policy bundle, refreshed every ``save_every`` steps and at the
end), ``train_state/`` (optimizer, step, RNG: what ``resume=true`` continues from),
``metrics.csv`` (step, loss, lr, seconds), TensorBoard events under ``tb/``, ``sft.json`` (summary)
and, with ``eval.suite`` set, ``eval.json``: success per task on the suite's fixed initial states.
With several processes (``nproc``, or the ranks torchrun starts) rank 0 alone writes all of it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied import distributed
from embodied.config import hydra_app, policy_overrides, register_policy_schemas, store
from embodied.distributed import Rank
from embodied.metrics_log import MetricsLog, check_logger
from embodied.runs import machine_info, plain_config, prepare_run_dir, write_json
from policies.precision import PRECISIONS, compile_policy
from policies.precision import lookup as lookup_precision

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
    # more datasets of the same layout trained on together with data, every step alike (e.g. a policy's
    # own successful rollouts: embodied-collect checkpoint=...)
    extra_data: list[str] = field(default_factory=list)
    # train on the episodes that succeeded alone (self-imitation: a policy's rollouts, kept with their
    # failures by embodied-collect keep_failures=true, filtered by their outcome)
    only_successes: bool = False
    out: str = MISSING  # run folder
    policy: Any = MISSING  # config group policy/: flow | autoregressive | diffusion | pi0 | pi05 | smolvla
    # start from this policy instead of a fresh one of the policy group: a bundle, or a LeRobot checkpoint
    # folder (pi0, pi0.5, SmolVLA; in .venv-lerobot). Its state/action statistics are replaced by the
    # dataset's, as LeRobot's fine-tuning does.
    init: Optional[str] = None
    # the state/action normalisation: data (the datasets', as above) | init (keep init's bundle's: continuing
    # a policy on data like its own, without moving what its network sees)
    stats_from: str = "data"
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
    # numerics: fp32, or bf16 (the forward under bfloat16 autocast, frozen weights such as a frozen VLM held in
    # bfloat16, the trained weights float32; the bundle stores float32 tensors: policies/precision.py)
    precision: str = "fp32"
    compile: bool = False  # torch.compile the policy's heavy submodules (eager, with a warning, where it cannot)
    # torch threads (null: torch's default, one per core). The count changes the order of floating-point
    # sums, so a fixed count trains the same policy on machines with other core counts (of one CPU type).
    threads: Optional[int] = None
    # processes training together (DDP: gloo on CPU, NCCL with one GPU each). batch_size is per process, as
    # with accelerate / torchrun: the effective batch is nproc x batch_size (lr is not rescaled). Started
    # by torchrun, leave it at 1: torchrun's --nproc-per-node sets it.
    nproc: int = 1
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


def _say(rank: Rank, message: str) -> None:
    if rank.is_main:
        print(f"embodied-sft: {message}", flush=True)


def _start_policy(cfg: SFTConfig, out: Path, rank: Rank) -> tuple[Any, str, dict[str, Any]]:
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
        _say(rank, f"starting from {cfg.init} (a {policy.family} policy; the policy group is not used)")
        return policy, policy.family, policy.config.to_dict()
    return policies.make(family, **overrides).to(cfg.device), family, overrides


def _sized_to_data(cfg: SFTConfig, policy: Any, family: str, overrides: dict[str, Any], width: int, rank: Rank) -> Any:
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
    _say(rank, f"policy.state_dim={width}, the dataset's state (state_obs={state_obs!r})")
    return policies.make(family, **{**overrides, "state_dim": width}).to(cfg.device)


def _numerics(cfg: SFTConfig, policy: Any, rank: Rank) -> list[str]:
    """``cfg.precision``'s frozen weights (those the model keeps frozen, e.g. LeRobot's ``train_expert_only``)
    and, with ``cfg.compile``, the compiled submodules; their names."""
    cast = lookup_precision(cfg.precision).cast_frozen(policy)
    if cast:
        _say(rank, f"{len(cast)} frozen weights held in {cfg.precision}")
    return compile_policy(policy) if cfg.compile else []


def _sft_step(
    policy: Any,
    loss_fn: Any,
    optimizer: torch.optim.Optimizer,
    demos: Any,
    gen: torch.Generator,
    cfg: SFTConfig,
    step: int,
    rank: Rank,
) -> float:
    """One optimiser step on a random batch of ``cfg.batch_size`` chunks (random image shifts); its loss.
    With several ranks: this rank's slice of the global batch, gradients averaged by ``loss_fn`` (DDP), the
    loss averaged over the ranks."""
    from embodied.data.augment import random_shift

    idx = distributed.rank_indices(len(demos), cfg.batch_size, gen, rank)
    obs, chunks = demos.batch(idx)
    if policy.config.cameras:  # one process: shifts from gen, as before; several: each rank's own seed
        obs["rgb"] = random_shift(obs["rgb"], cfg.augment_shift, gen if rank.world == 1 else None)
    with lookup_precision(cfg.precision).autocast(policy.device):
        loss = loss_fn(obs, chunks)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite SFT loss at step {step}; lower lr=... (now {cfg.lr})")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
    optimizer.step()
    return distributed.mean_over_ranks(loss.item(), rank)


def _log(metrics: Optional[MetricsLog], bar: Any, step: int, losses: list[float], lr: float, t0: float) -> None:
    """One row of ``metrics.csv`` (and the scalars) at ``step``: the mean of ``losses``; rank 0 only."""
    if metrics is None:
        return
    mean = float(np.mean(losses))
    metrics.row({"step": step, "loss": f"{mean:.6f}", "lr": f"{lr:.3e}", "seconds": f"{time.perf_counter() - t0:.1f}"})
    metrics.scalars({"loss": mean, "lr": lr}, step)
    bar.set_postfix(loss=f"{mean:.4f}")


def _fit(
    cfg: SFTConfig, out: Path, policy: Any, optimizer: torch.optim.Optimizer, demos: Any, start_step: int, rank: Rank
) -> tuple[int, list[float], float]:
    """Steps ``start_step..cfg.steps`` with the learning-rate schedule, logging every ``cfg.log_every``
    and checkpointing every ``cfg.save_every`` (rank 0); the step reached, the losses and the seconds."""
    metrics = None
    if rank.is_main:
        metrics = MetricsLog(
            out,
            METRIC_FIELDS,
            "step",
            resume_upto=start_step if cfg.resume else None,
            tb_prefix="sft",
            logger=cfg.logger,
            config=plain_config(cfg),
        )
    loss_fn = distributed.data_parallel(policy, "sft_loss", rank)
    gen = torch.Generator().manual_seed(cfg.seed + start_step)  # alike on every rank: they share each global batch
    t0 = time.perf_counter()
    losses: list[float] = []
    policy.train()
    step = start_step
    try:
        bar_args = dict(desc=f"sft {policy.family}", unit="step", disable=not rank.is_main)
        with tqdm(total=cfg.steps, initial=start_step, **bar_args) as bar:
            for step in range(start_step, cfg.steps):
                lr = _lr_at(step, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                losses.append(_sft_step(policy, loss_fn, optimizer, demos, gen, cfg, step, rank))
                if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                    _log(metrics, bar, step + 1, losses[-cfg.log_every :], lr, t0)
                if rank.is_main and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                    _checkpoint(policy, optimizer, step + 1, out, cfg)
                bar.update(1)
            step = cfg.steps
    finally:
        if metrics is not None:
            metrics.close()
    return step, losses, time.perf_counter() - t0


def _check(cfg: SFTConfig) -> None:
    """Refuse settings that cannot run, saying what to change (before anything is written or started)."""
    check_logger(cfg.logger)
    if cfg.augment_shift < 0:
        raise ValueError(f"augment_shift must be >= 0 pixels, got {cfg.augment_shift}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 (or null for one per core), got {cfg.threads}")
    distributed.check(cfg.nproc, cfg.device)
    if cfg.stats_from not in ("data", "init"):
        raise ValueError(f"stats_from={cfg.stats_from!r}: choose data or init")
    if cfg.stats_from == "init" and cfg.init is None:
        raise ValueError("stats_from=init keeps the statistics of init's bundle: set init=... too")
    if cfg.episodes is not None and cfg.extra_data:
        raise ValueError("episodes= selects from data alone: leave extra_data empty, or episodes unset")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision={cfg.precision!r}: {PRECISIONS.unknown(cfg.precision)}")


def train(cfg: SFTConfig) -> dict[str, Any]:
    """Run SFT as configured: in this process, on ``cfg.nproc`` local processes (DDP), or as one of the ranks
    a launcher such as torchrun started; returns the summary written to ``sft.json``."""
    _check(cfg)
    launched = distributed.launched_rank()
    if launched is not None:
        if cfg.nproc not in (1, launched.local_world):
            raise ValueError(
                f"nproc={cfg.nproc}, but torchrun started {launched.local_world} processes here "
                f"({launched.world} in all): leave nproc at 1 and set torchrun's --nproc-per-node"
            )
        with distributed.process_group(launched, cfg.device) as rank:
            return _train(cfg, rank)
    if cfg.nproc == 1:
        return _train(cfg, Rank(device=cfg.device))
    distributed.spawn(_spawned_rank, cfg.nproc, cfg.device, (dataclasses.asdict(cfg),), threads=cfg.threads)
    return json.loads((Path(cfg.out).expanduser().resolve() / "sft.json").read_text())


def _spawned_rank(rank: Rank, fields: dict[str, Any]) -> None:
    """A rank started by ``nproc=N``: the config comes as plain fields (the policy node's class is made at
    run time and does not pickle)."""
    _train(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SFTConfig), fields)), rank)  # type: ignore[arg-type]


def _train(cfg: SFTConfig, rank: Rank) -> dict[str, Any]:
    """SFT on this rank (rank 0 writes the run folder, the others nothing); the summary."""
    from embodied.data.training import load_demonstrations
    from embodied.train_state import load_train_state

    cfg = dataclasses.replace(cfg, device=rank.device) if rank.world > 1 else cfg
    out = prepare_run_dir(cfg.out) if rank.is_main else Path(cfg.out).expanduser().resolve()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    policy, family, overrides = _start_policy(cfg, out, rank)
    demos = load_demonstrations(
        [cfg.data, *cfg.extra_data] if cfg.extra_data else cfg.data,
        chunk_size=policy.config.chunk_size,
        image_size=policy.config.image_size,
        cameras=policy.config.cameras,
        episodes=cfg.episodes,
        state_obs=policy.config.state_obs,
        only_successes=cfg.only_successes,
    )
    policy = _sized_to_data(cfg, policy, family, overrides, int(demos.state.shape[1]), rank)
    if not cfg.resume and not (cfg.init is not None and cfg.stats_from == "init"):
        policy.processor.set_stats(policy.processor.stats_from_arrays(demos.state.numpy(), demos.actions.numpy()))
    compiled = _numerics(cfg, policy, rank)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_step = int(load_train_state(out / "train_state", optimizer=optimizer)["step"]) if cfg.resume else 0
    if rank.world > 1:  # each rank its own noise and image shifts (a resume restored rank 0's generator on all)
        torch.manual_seed(distributed.rank_seed(cfg.seed + start_step, rank.rank))
    step, losses, seconds = _fit(cfg, out, policy, optimizer, demos, start_step, rank)
    peak = _peak_memory_gb(policy.device)  # of training, before the final save
    summary = {
        "family": policy.family,
        "data": str(cfg.data),
        "extra_data": [str(d) for d in cfg.extra_data],
        "episodes": int(demos.episode.unique().numel()),
        "samples": len(demos),
        "steps": step,
        "final_loss": float(np.mean(losses[-cfg.log_every :])) if losses else None,
        "train_seconds": round(seconds, 1),
        "checkpoint": str(out / "ckpt"),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "precision": cfg.precision,
        "compiled": compiled,  # the submodules torch.compile ran (none where it could not: see the log)
        "peak_memory_gb": peak,
        "machine": machine_info(),
    }
    if rank.is_main:
        _checkpoint(policy, optimizer, step, out, cfg)
        if cfg.eval.suite:
            with lookup_precision(cfg.precision).full_weights(policy):  # float32, as the bundle
                summary["eval_success_rate"] = _evaluate(cfg, policy, demos, out)
        write_json(out / "sft.json", summary)
    return summary


def _peak_memory_gb(device: torch.device) -> dict[str, float]:
    """This process's peak resident memory so far, and on CUDA the peak the caching allocator handed out."""
    import resource

    peak = {"rss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    if device.type == "cuda":
        peak["cuda"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return peak


def _evaluate(cfg: SFTConfig, policy: Any, demos: Any, out: Path) -> float:
    """Evaluate on ``cfg.eval.suite`` into ``eval.json``; the success rate."""
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
    return result["success_rate"]


def _checkpoint(policy: Any, optimizer: torch.optim.Optimizer, step: int, out: Path, cfg: SFTConfig) -> None:
    import policies
    from embodied.train_state import save_train_state

    # weights first, then the state that points at them: a kill in between resumes one save back
    with lookup_precision(cfg.precision).full_weights(policy):
        policies.save(policy, out / "ckpt", extra={"step": step, "data": str(cfg.data), "precision": cfg.precision})
    save_train_state(out / "train_state", optimizer=optimizer, step=step)


@hydra_app("embodied-sft", "sft")
def _main(cfg: Any) -> None:
    config: SFTConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        summary = train(config)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        raise SystemExit(f"embodied-sft: {err}") from None
    launched = distributed.launched_rank()
    if launched is not None and not launched.is_main:
        return
    line = f"trained {summary['family']} for {summary['steps']} steps, final loss {summary['final_loss']:.4f}"
    if "eval_success_rate" in summary:
        line += f", success {summary['eval_success_rate']:.1%} on {config.eval.suite}"
    print(line + f"; bundle: {summary['checkpoint']}")


def main() -> None:
    """The ``embodied-sft`` command. On a torchrun rank other than 0, Hydra runs without its output folder
    and log file: rank 0 alone writes the run folder."""
    launched = distributed.launched_rank()
    if launched is not None and not launched.is_main:
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout", "hydra.run.dir=."]
    _main()


if __name__ == "__main__":
    main()
