"""``embodied-train``: online RL of a VLA in parallel simulated envs (chunk-level PPO).

    embodied-train init=runs/sft_flow/ckpt algo=flow_sde suite=spatial out=runs/rl
    embodied-train init=runs/sft_ar/ckpt algo=ppo suite=spatial out=runs/rl_ar
    embodied-train ... resume=true          # continue a killed run from its last checkpoint

Runtime ``local``: one process, the sequential loop collect -> update (the building blocks in
:mod:`embodied.rl`). The Ray RLlib runtimes (remote env runners and learners, overlap of sampling
and learning) wrap the same blocks and are not built yet: ``runtime=cluster`` stops with a clear
message.

Outputs in ``out``: ``ckpt/`` (bundle, every ``save_every`` iterations and at the end),
``train_state/`` (optimizer, iteration, env-step counter, RNG), ``metrics.csv`` and TensorBoard
events (success rate, return, episode length, entropy, clip fraction, approx KL, value loss,
explained variance, env-steps/s, time split sim / inference / learning), ``train.json``.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from typing import Any, Optional

import hydra
import numpy as np
import torch
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied.config import policy_overrides, register_policy_schemas, store
from embodied.data.collect import TRAIN_INIT_OFFSET
from embodied.runs import machine_info, prepare_run_dir, write_json

#: algorithm -> (policy family it needs, the flow sampler it uses or None)
ALGOS = {
    "flow_sde": ("flow", "sde"),
    "flow_sde_full": ("flow", "sde_full"),
    "flow_noise": ("flow", "noise"),
    "ppo": ("autoregressive", None),
    "grpo": ("autoregressive", None),
}


@dataclass
class TrainConfig:
    """Schema of ``embodied-train``."""

    out: str = MISSING  # run folder
    init: Optional[str] = None  # SFT checkpoint bundle to start from (else a fresh policy=...)
    policy: Any = None  # config group policy/ (used without init)
    algo: str = "flow_sde"  # flow_sde | flow_sde_full | flow_noise (flow VLA) | ppo | grpo (token VLA)
    group_size: int = 4  # grpo: rollouts per initial state (envs are split into groups)
    runtime: str = "local"  # local (one process); cluster (Ray RLlib) is not built yet
    suite: str = "spatial"
    tasks: Optional[list[int]] = None  # subset of the suite's tasks (default: all)
    num_envs: int = 10
    image_size: int = 64  # rendered size (match the policy's input size to skip resizing)
    iterations: int = 50
    chunks_per_iter: int = 16  # RL steps (chunks) per env per iteration
    lr: float = 5e-6  # actor (pi_RL: 5e-6; at 3e-5 with 2 epochs approx KL reached 0.1-2.5 here)
    critic_lr: float = 1e-4  # value head
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    dual_clip: Optional[float] = 3.0
    value_clip: Optional[float] = 0.2
    ent_coef: float = 0.0
    epochs: int = 1
    minibatch_size: int = 32
    reward_type: str = "sparse"  # sparse success (as pi_RL on LIBERO) | dense shaped terms
    save_every: int = 10
    seed: int = 0
    device: str = "cpu"
    resume: bool = False


store("train_schema", TrainConfig)
register_policy_schemas()


class TrainError(ValueError):
    """A configuration that cannot work; printed as one line at start-up."""


def _load_policy(cfg: TrainConfig, out: Any) -> Any:
    import policies

    family, sampler = ALGOS.get(cfg.algo, (None, None))
    if family is None:
        raise TrainError(f"unknown algo {cfg.algo!r}; choose one of {sorted(ALGOS)}")
    if cfg.resume:
        if not (out / "ckpt" / "config.json").is_file():
            raise TrainError(f"resume=true but {out / 'ckpt'} holds no checkpoint")
        policy = policies.load(out / "ckpt", device=cfg.device)
    elif cfg.init is not None:
        if (out / "ckpt" / "config.json").is_file():
            raise TrainError(f"{out} already holds a run: pass resume=true to continue it, or a new out=...")
        policy = policies.load(cfg.init, device=cfg.device)
    else:
        if cfg.policy is None:
            raise TrainError("give init=CKPT (an SFT bundle) or policy=flow|autoregressive")
        fam, overrides = policy_overrides(cfg.policy)
        policy = policies.make(fam, **overrides).to(cfg.device)
    if policy.family != family:
        raise TrainError(f"algo={cfg.algo} trains a {family} policy, but the policy is {policy.family}: "
                         f"use {'algo=ppo' if policy.family == 'autoregressive' else 'algo=flow_sde'}")
    if sampler is not None:
        policy.config.sampler = sampler
    return policy


def train(cfg: TrainConfig) -> dict[str, Any]:
    import sims
    from embodied.rl.grpo_update import GRPOConfig, grpo_update
    from embodied.rl.ppo_update import PPOConfig, ppo_update
    from embodied.rl.rollout import collect_chunks
    from embodied.train_state import load_train_state, save_train_state
    import policies

    if cfg.runtime != "local":
        raise TrainError(f"runtime={cfg.runtime!r}: only runtime=local is built; the Ray RLlib runtime "
                         "(remote env runners and learners) is not available yet")
    if cfg.suite not in sims.suites.names():
        raise TrainError(f"unknown suite {cfg.suite!r}; choose from {sims.suites.names()}")
    out = prepare_run_dir(cfg.out)
    policy = _load_policy(cfg, out)
    specs = sims.suites.tasks(cfg.suite)
    tasks = list(range(len(specs))) if cfg.tasks is None else list(cfg.tasks)
    if any(not 0 <= t < len(specs) for t in tasks):
        raise TrainError(f"tasks {tasks} out of range for suite {cfg.suite!r} (0..{len(specs) - 1})")
    env = sims.make("mujoco", suite=cfg.suite, num_envs=cfg.num_envs, seed=cfg.seed,
                    cameras=tuple(policy.config.cameras), image_size=cfg.image_size, reward_type=cfg.reward_type)
    policy.check_env(env)
    if cfg.algo == "grpo":
        longest = max(specs[t].max_steps for t in tasks)
        if cfg.num_envs % cfg.group_size or cfg.group_size < 2:
            raise TrainError(f"grpo needs num_envs ({cfg.num_envs}) to be a multiple of group_size ({cfg.group_size} >= 2)")
        if cfg.chunks_per_iter * policy.config.chunk_size < longest:
            raise TrainError(f"grpo scores whole episodes: chunks_per_iter * chunk size "
                             f"({cfg.chunks_per_iter} * {policy.config.chunk_size}) must cover the step limit ({longest})")
    critic = [p for n, p in policy.named_parameters() if n.startswith("value_mlp")]
    actor = [p for n, p in policy.named_parameters() if not n.startswith("value_mlp")]
    optimizer = torch.optim.AdamW([{"params": actor, "lr": cfg.lr}, {"params": critic, "lr": cfg.critic_lr}],
                                  weight_decay=0.0)
    start_iter, env_steps = 0, 0
    if cfg.resume:
        meta = load_train_state(out / "train_state", optimizer=optimizer)
        start_iter, env_steps = int(meta["step"]), int(meta["extra"].get("env_steps", 0))
    else:
        torch.manual_seed(cfg.seed)
    ppo = PPOConfig(gamma=cfg.gamma, lam=cfg.lam, clip=cfg.clip, dual_clip=cfg.dual_clip, value_clip=cfg.value_clip,
                    ent_coef=cfg.ent_coef, epochs=cfg.epochs, minibatch_size=cfg.minibatch_size)
    grpo = GRPOConfig(group_size=cfg.group_size, clip=cfg.clip, epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                      ent_coef=cfg.ent_coef)
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + start_iter)
    task_ids = [tasks[i % len(tasks)] for i in range(cfg.num_envs)]
    obs = env.reset(seed=cfg.seed + start_iter, task_ids=task_ids)
    fields = ["iteration", "env_steps", "episodes", "success_rate", "return", "episode_length", "entropy",
              "clip_fraction", "approx_kl", "policy_loss", "value_loss", "explained_variance", "env_steps_per_s",
              "sim_s", "inference_s", "learn_s"]
    new = not (cfg.resume and (out / "metrics.csv").exists())
    metrics_file = open(out / "metrics.csv", "w" if new else "a", newline="")
    writer = csv.DictWriter(metrics_file, fieldnames=fields)
    if new:
        writer.writeheader()
    try:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(out / "tb"))
    except ImportError:
        tb = None
    history: list[dict[str, float]] = []
    t_start = time.perf_counter()
    try:
        with tqdm(total=cfg.iterations, initial=start_iter, desc=f"rl {cfg.algo}", unit="it") as bar:
            for it in range(start_iter, cfg.iterations):
                t0 = time.perf_counter()
                if cfg.algo == "grpo":  # groups of envs start from the same (training) initial state
                    groups = cfg.num_envs // cfg.group_size
                    g_tasks = [tasks[(it * groups + g) % len(tasks)] for g in range(groups)]
                    obs = env.reset(task_ids=np.repeat(g_tasks, cfg.group_size).tolist(),
                                    init_ids=np.repeat([TRAIN_INIT_OFFSET + it * groups + g for g in range(groups)],
                                                       cfg.group_size).tolist())
                    rollout, obs = collect_chunks(env, policy, obs, cfg.chunks_per_iter, generator=gen)
                    stats = grpo_update(policy, optimizer, rollout, grpo, generator=gen)
                else:
                    rollout, obs = collect_chunks(env, policy, obs, cfg.chunks_per_iter, generator=gen)
                    stats = ppo_update(policy, optimizer, rollout, ppo, generator=gen)
                wall = time.perf_counter() - t0
                env_steps += rollout.env_steps
                eps = len(rollout.episode_success)
                row = {
                    "iteration": it + 1, "env_steps": env_steps, "episodes": eps,
                    "success_rate": float(np.mean(rollout.episode_success)) if eps else float("nan"),
                    "return": float(np.mean(rollout.episode_returns)) if eps else float("nan"),
                    "episode_length": float(np.mean(rollout.episode_lengths)) if eps else float("nan"),
                    **{k: stats[k] for k in ("entropy", "clip_fraction", "approx_kl", "policy_loss", "value_loss",
                                             "explained_variance", "learn_s")},
                    "env_steps_per_s": rollout.env_steps / wall, "sim_s": rollout.timing["sim_s"],
                    "inference_s": rollout.timing["inference_s"],
                }
                writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
                metrics_file.flush()
                if tb is not None:
                    for k, v in row.items():
                        if k != "iteration" and np.isfinite(v):
                            tb.add_scalar(f"rl/{k}", v, it + 1)
                history.append(row)
                bar.set_postfix(succ=f"{row['success_rate']:.2f}", kl=f"{row['approx_kl']:.3f}",
                                sps=f"{row['env_steps_per_s']:.0f}")
                bar.update(1)
                if (it + 1) % cfg.save_every == 0 or it + 1 == cfg.iterations:
                    policies.save(policy, out / "ckpt", extra={"iteration": it + 1, "env_steps": env_steps,
                                                               "algo": cfg.algo})
                    save_train_state(out / "train_state", optimizer=optimizer, step=it + 1,
                                     extra={"env_steps": env_steps})
    finally:
        metrics_file.close()
        if tb is not None:
            tb.close()
        env.close()
    summary = {"algo": cfg.algo, "suite": cfg.suite, "iterations": cfg.iterations, "env_steps": env_steps,
               "wall_s": round(time.perf_counter() - t_start, 1), "checkpoint": str(out / "ckpt"),
               "machine": machine_info(),
               "last": history[-1] if history else None}
    write_json(out / "train.json", summary)
    return summary


@hydra.main(config_path="pkg://configs", config_name="train", version_base="1.3")
def main(cfg: Any) -> None:
    from policies import CheckpointError, SpecMismatchError

    config: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        summary = train(config)
    except (TrainError, CheckpointError, SpecMismatchError, FileNotFoundError) as err:
        raise SystemExit(f"embodied-train: {err}") from None
    print(f"{summary['algo']}: {summary['iterations']} iterations, {summary['env_steps']} env steps in "
          f"{summary['wall_s']} s; bundle {summary['checkpoint']}")


if __name__ == "__main__":
    main()
