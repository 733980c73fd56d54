"""``embodied-train``: online RL of a VLA in parallel simulated envs, on Ray RLlib.

    embodied-train init=runs/sft_flow/checkpoint/policy algo=flow_sde suite=spatial out=runs/rl
    embodied-train init=runs/sft_ar/ckpt algo=ppo suite=spatial out=runs/rl_ar
    embodied-train init=... algo=grpo algo.group_size=4 ...            # token VLA, critic-free
    embodied-train init=runs/sft_flow/ckpt algo=flow_grpo ...          # flow VLA, critic-free (Flow-SDE sampler)
    embodied-train init=runs/sft_flow/ckpt algo=flow_fpo ...           # flow VLA, FPO ratio, critic-free (ODE sampler)
    embodied-train init=runs/sft_flow/ckpt algo=flow_dsrl ...          # flow VLA fixed, PPO on its initial noise (DSRL)
    embodied-train ... runtime=cluster runtime.num_env_runners=2       # env runners as Ray actors
    embodied-train ... resume=true          # continue a killed run from its last checkpoint
    embodied-train ... algo.critic=privileged   # a separate critic on the simulator's privileged state

Config groups: ``policy`` (a fresh policy without ``init``), ``algo`` (flow_sde | flow_sde_full |
flow_noise | flow_grpo | flow_fpo | flow_dsrl | flow_dsrl_grpo | ppo | grpo: the algorithm and its hyper-parameters), ``runtime`` (local: one process
with ``num_env_runners=0``; cluster: remote env runners and optional remote learners / GPUs).

Outputs in ``out``: ``checkpoint/`` (``policy/`` bundle + ``train_state/`` with optimizer states,
counters and RNG, + ``critic.safetensors`` with ``algo.critic=privileged``; replaced atomically
every ``save_every`` iterations and at the end),
``metrics.csv`` and TensorBoard events (success rate, return, episode length, entropy, clip
fraction, approx KL, value loss, explained variance, env-steps/s, time split sim / inference /
learning / waiting, env runners restarted), ``train.json``, ``runner_recoveries.jsonl`` (env runners
lost with their process or node and brought back), ``ray/`` (Ray's session files when Ray is started here).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied.algorithms.loss import LossConfig
from embodied.algorithms.registry import ALGORITHMS, GROUP_ALGORITHMS, algorithms_for, trains
from embodied.algorithms.update import UpdateConfig
from embodied.config import hydra_app, policy_overrides, register_policy_schemas, store
from embodied.metrics_log import MetricsLog
from embodied.runs import machine_info, prepare_run_dir, write_json

METRIC_FIELDS = [
    "iteration",
    "env_steps",
    "episodes",
    "success_rate",
    "return",
    "episode_length",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "policy_loss",
    "value_loss",
    "explained_variance",
    "env_steps_per_s",
    "sim_s",
    "inference_s",
    "learn_s",
    "wait_s",
    "iteration_s",
    "groups_kept",
    "actor_updated",
    "advantage_std",
    "minibatches",
    "approx_kl_first",
    "clip_fraction_first",
    "epochs_run",
    "kl_stop",
    "policy_lag",
    "kl_rollback",
    "approx_kl_max",
    "log_ratio_max",
    "grad_cos_first",
    "greedy_success_rate",
    "greedy_episodes",
    "greedy_s",
    "runner_restarts",
    "recovery_s",
]


#: the run folder's record of env runners lost and brought back (one JSON object a line)
RECOVERIES_FILE = "runner_recoveries.jsonl"


@dataclass
class AlgoConfig:
    """Config group ``algo/``: the RL algorithm and its hyper-parameters. The defaults of the loss come from
    :class:`embodied.algorithms.loss.LossConfig`, those of the update schedule from :class:`embodied.algorithms.update.UpdateConfig`
    (pi_RL's where published)."""

    # flow_sde | flow_sde_full | flow_noise | flow_grpo | flow_fpo | flow_dsrl | flow_dsrl_grpo (flow VLA) |
    # ppo | grpo (token VLA)
    name: str = "flow_sde"
    lr: float = UpdateConfig.lr  # actor (pi_RL: 5e-6)
    critic_lr: Optional[float] = UpdateConfig.critic_lr  # value head (null for grpo: no critic)
    gamma: float = 0.99  # per chunk
    lam: float = 0.95  # GAE lambda
    clip: float = LossConfig.clip  # PPO ratio clip
    dual_clip: Optional[float] = LossConfig.dual_clip  # bound on the loss for negative advantages (null: off)
    value_clip: Optional[float] = LossConfig.value_clip  # value clipping (null: off; grpo: must be null)
    vf_coef: float = LossConfig.vf_coef  # value loss weight (grpo: must be 0)
    ent_coef: float = LossConfig.ent_coef  # entropy bonus
    kl_coef: float = LossConfig.kl_coef  # approx-KL penalty (off by default)
    # multiplies negative advantages: 1 the plain objective; 0 pulls up the better-than-average samples only
    # and pushes nothing away (a reward-weighted regression on them; see docs/guide/online-rl.md)
    neg_adv_scale: float = LossConfig.neg_adv_scale
    ratio: str = "chunk"  # chunk: ratio of the whole chunk's probability; per_dim: its geometric mean per
    #                       action dimension / token (GSPO's length normalisation), clipped far less often
    # passes over each iteration's batch, each a fresh shuffle cut into even minibatches
    epochs: int = UpdateConfig.epochs
    # chunks per gradient step (null: the iteration's whole batch, one step per epoch: every step then
    # sees all the kept episodes instead of a few, at the cost of fewer steps per iteration)
    minibatch_size: Optional[int] = UpdateConfig.minibatch_size
    # stop an iteration's remaining minibatches once one's approx KL (measured before its step) exceeds this
    # (null: never); the update stays near the weights that sampled the batch
    target_kl: Optional[float] = UpdateConfig.target_kl
    # with target_kl: the stop also undoes the actor's last two steps (the one beyond the target and the one
    # that crossed it), so the iteration ends on weights measured within the target; false keeps them (the
    # plain early stop, which keeps a step however far beyond the target it went)
    kl_rollback: bool = UpdateConfig.kl_rollback
    max_grad_norm: float = UpdateConfig.max_grad_norm  # global gradient-norm clip
    # RL trains the action expert / decoder and heads, not the observation encoder (vision, language, state,
    # fusion: about half the weights); false trains the whole model
    freeze_prefix: bool = UpdateConfig.freeze_prefix
    # critic warm-up: the first N iterations update only the value head (the actor keeps its SFT weights and
    # keeps sampling), so the first policy updates use a critic fitted to it rather than a random one
    critic_warmup: int = 0
    # policy: the policy's value head (sees what the policy sees) | privileged: a separate MLP critic on the
    # proprioceptive + privileged simulator state, the task and the fraction of the step limit used (training
    # only: deployment runs the policy alone)
    critic: str = "policy"
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256, 256])  # privileged critic's MLP widths
    group_size: int = 4  # grpo / flow_grpo: rollouts per initial state (each runner's envs split into groups)
    # grpo / flow_grpo: chunk (each chunk weighs the same: long failures outweigh short successes and the chunks'
    # mean advantage turns negative) | episode (each kept episode weighs the same, GRPO's 1/|o_i|)
    grpo_weighting: str = "chunk"
    # grpo / flow_grpo dynamic sampling: success (drop all-success / all-failure groups) | return (drop groups
    # whose returns are all equal: with reward_type=shaped, all-failure groups that made different progress
    # keep their signal; with sparse rewards the same as success)
    grpo_keep: str = "success"
    # grpo / flow_grpo: divide each group's centred returns by their std (GRPO) | false: keep their scale (Dr.
    # GRPO), so that with shaped rewards a group whose rollouts barely differ pushes barely
    grpo_std_norm: bool = True
    # token VLA (ppo | grpo): sampling temperature of the rollouts, which the PPO log-probabilities use too
    # (null: the checkpoint's policy.temperature). Below 1 the behaviour policy is nearer the greedy one
    # that evaluation runs; the trained bundle keeps this temperature for mode="explore".
    temperature: Optional[float] = None
    # flow VLA, Flow-SDE (flow_sde / flow_grpo): draw each chunk's stochastic denoising step from the first N
    # steps only (null: the checkpoint's policy.sde_steps, all K by default). The last steps' noise is the
    # smallest and their scores the largest (benchmarks/gradient_signal.py measures what that does to a batch)
    sde_steps: Optional[int] = None


@dataclass
class RuntimeConfig:
    """Config group ``runtime/``: where sampling and learning run."""

    name: str = "local"  # local: one process; cluster: Ray actors
    num_env_runners: int = 0  # 0: sample in the driver; K: K remote runners with num_envs envs each
    num_learners: int = 0  # 0: learn in the driver; L: L remote learners (data parallel)
    # GPUs per learner (the driver's with num_learners=0); 0 with device=cuda means 1
    num_gpus_per_learner: float = 0.0
    # GPUs per remote env runner: Ray hides the GPUs from actors that ask for none, so GPU simulators
    # (backend=mujoco_gpu, suite=maniskill) in remote runners need a share (0.25: four runners per GPU)
    num_gpus_per_env_runner: float = 0.0
    # sample iteration k+1 while learning on k: every batch is then trained one update after it was sampled
    # (policy_lag 1, importance-corrected by the PPO ratio); false: on-policy (policy_lag 0)
    overlap: bool = False
    address: Optional[str] = None  # join this Ray cluster ("auto" after `ray start`); else start Ray here
    num_cpus: Optional[int] = None  # CPUs of the Ray started here (default: runners + learners + 1)
    # torch threads of the driver (its learner with num_learners=0, and its sampler without env runners);
    # with remote env runners and overlap=false the runners wait while it learns, so their cores are free
    learner_threads: int = 1
    # a remote env runner lost with its process or node is restarted by Ray on a node with a free CPU; an
    # iteration waits this long for it (then re-samples its share with the current weights) before the run stops
    runner_restart_timeout_s: float = 600.0


@dataclass
class TrainConfig:
    """Schema of ``embodied-train``."""

    out: str = MISSING  # run folder
    init: Optional[str] = None  # SFT checkpoint bundle to start from (else a fresh policy=...)
    policy: Any = None  # config group policy/ (used without init)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    suite: str = "spatial"  # task suite (sims.suites.env_names(): ours, maniskill, real LIBERO's libero_*)
    backend: Optional[str] = None  # simulation backend of the env runners (mujoco | mujoco_gpu); default: the suite's
    tasks: Optional[list[int]] = None  # subset of the suite's tasks (default: all)
    num_envs: int = 10  # envs per env runner (runtime=local: the envs)
    image_size: int = 64  # rendered size (match the policy's input size to skip resizing)
    iterations: int = 50
    chunks_per_iter: int = 16  # RL steps (chunks) per env per iteration
    max_episode_steps: Optional[int] = None  # training step limit (truncation); default: the task's
    # an episode ended by a step limit: bootstrap (from its final value: it could have gone on) | fail (it ends
    # there: no success means no return; with a short limit and sparse rewards, bootstrapping gives failed and
    # successful episodes nearly the same value targets)
    truncation: str = "bootstrap"
    # grpo / flow_grpo: draw the groups' initial states from the first N training states of each task, in
    # turn (the LIBERO RL works train on a fixed set of initial states); null: a new state for every group.
    # Evaluation keeps its 50 held-out protocol states either way.
    init_states: Optional[int] = None
    # where training episodes start: random (training states; evaluation's 50 protocol states stay held out) |
    # protocol (the protocol's 50 fixed initial states per task, which evaluation scores: the LIBERO RL works'
    # protocol, e.g. RLinf's use_fixed_reset_state_ids)
    init_pool: str = "random"
    reward_type: str = "sparse"  # sparse: success (as pi_RL on LIBERO) | shaped: progress made + success | dense
    # latency-aware RL (ARLI): each chunk acts d control steps after its observation, d drawn per episode
    # from this list (each < the chunk size); the policy's state gains the committed actions and d
    latency_delays: Optional[list[int]] = None
    save_every: int = 10  # iterations between checkpoints (and one at the end)
    # every this many iterations (and after the last) score the policy as evaluation runs it (greedy: the ODE
    # from the initial noise, nothing injected) on greedy_states training states per task (init_pool's: the
    # protocol's from 0, else the training states), with the tasks' own step limits: greedy_success_rate
    # beside the sampled policy's success_rate in metrics.csv, episodes in greedy_episodes.jsonl; 0: off
    greedy_every: int = 0
    greedy_states: int = 5
    seed: int = 0
    device: str = "cpu"  # where the update runs: cpu | cuda (each learner takes runtime.num_gpus_per_learner GPUs)
    resume: bool = False  # continue out/checkpoint (after a crash or kill)


store("train_schema", TrainConfig)
store("algo_schema", AlgoConfig)
store("runtime_schema", RuntimeConfig)
register_policy_schemas()


def runtime_problem(r: RuntimeConfig, group: str = "runtime") -> Optional[str]:
    """What is wrong with a ``runtime`` config (None: nothing), its keys named under ``group`` (the
    pipeline's is ``rl.runtime``)."""
    if r.name not in ("local", "cluster"):
        return f"unknown runtime {r.name!r}; choose {group}=local or {group}=cluster"
    if r.name == "local" and (r.num_env_runners or r.num_learners):
        return (
            f"{group}=local runs in one process: use {group}=cluster for {group}.num_env_runners/"
            f"{group}.num_learners > 0"
        )
    if r.name == "cluster" and r.num_env_runners < 1:
        return f"{group}=cluster needs {group}.num_env_runners >= 1"
    if r.learner_threads < 1:
        return f"{group}.learner_threads must be >= 1, got {r.learner_threads}"
    if not r.runner_restart_timeout_s > 0:
        return (
            f"{group}.runner_restart_timeout_s must be > 0 (seconds to wait for a lost env runner), got "
            f"{r.runner_restart_timeout_s}"
        )
    return None


class TrainError(ValueError):
    """A configuration that cannot work; printed as one line at start-up."""


def check_config(cfg: TrainConfig) -> None:
    """Stop impossible combinations before anything starts."""
    import sims
    from embodied.algorithms.batch import TRUNCATION
    from embodied.algorithms.critic import CRITICS
    from embodied.algorithms.grpo import GRPO_KEEP, GRPO_WEIGHTING

    a, r = cfg.algo, cfg.runtime
    if a.name not in ALGORITHMS:
        raise TrainError(ALGORITHMS.unknown(a.name))
    if not a.lr >= 0 or (a.critic_lr is not None and not a.critic_lr >= 0):
        raise TrainError(
            f"algo.lr ({a.lr}) and algo.critic_lr ({a.critic_lr}) must be >= 0 "
            "(algo.lr=0 keeps the actor frozen: a control run)"
        )
    if a.epochs < 1 or (a.minibatch_size is not None and a.minibatch_size < 1):
        raise TrainError(
            f"algo.epochs ({a.epochs}) and algo.minibatch_size ({a.minibatch_size}) must be >= 1 "
            "(algo.minibatch_size=null: the whole batch per step)"
        )
    if a.target_kl is not None and not a.target_kl > 0:
        raise TrainError(f"algo.target_kl={a.target_kl} must be > 0 (null: no early stop)")
    if not 0.0 <= a.neg_adv_scale <= 1.0:
        raise TrainError(
            f"algo.neg_adv_scale={a.neg_adv_scale} must lie in [0, 1] (1: plain objective, 0: only positive advantages)"
        )
    if ALGORITHMS[a.name].sampler == "fpo" and a.ent_coef:
        raise TrainError(f"algo={a.name} has no closed-form entropy to reward: set algo.ent_coef=0 (got {a.ent_coef})")
    if a.temperature is not None:
        if ALGORITHMS[a.name].family != "autoregressive":
            raise TrainError(
                f"algo.temperature is the token VLA's sampling temperature (algo=ppo or grpo); "
                f"algo={a.name} samples a flow policy: leave it unset"
            )
        if not a.temperature > 0:
            raise TrainError(f"algo.temperature must be > 0, got {a.temperature}")
    if a.sde_steps is not None:
        if ALGORITHMS[a.name].sampler != "sde":
            raise TrainError(
                f"algo.sde_steps picks Flow-SDE's stochastic step (algo=flow_sde or flow_grpo); "
                f"algo={a.name} samples otherwise: leave it unset"
            )
        if a.sde_steps < 1:
            raise TrainError(f"algo.sde_steps must be >= 1 (at most the policy's num_steps), got {a.sde_steps}")
    if a.name in GROUP_ALGORITHMS:
        critic_only = {
            "algo.critic_lr": a.critic_lr,
            "algo.value_clip": a.value_clip,
            "algo.vf_coef": a.vf_coef or None,
        }
        bad = [k for k, v in critic_only.items() if v is not None]
        if bad:
            raise TrainError(
                f"algo={a.name} has no critic, but {bad} are set: they apply to PPO only "
                "(use a PPO algorithm, or set them to null / 0)"
            )
        if a.critic_warmup:
            raise TrainError(
                f"algo={a.name} has no critic to warm up: set algo.critic_warmup=0 (got {a.critic_warmup})"
            )
        if a.critic != "policy":
            raise TrainError(f"algo={a.name} has no critic: algo.critic={a.critic} applies to PPO only")
        if a.group_size < 2 or cfg.num_envs % a.group_size:
            raise TrainError(
                f"{a.name} needs num_envs ({cfg.num_envs}) to be a multiple of algo.group_size ({a.group_size} >= 2)"
            )
    if a.grpo_weighting not in GRPO_WEIGHTING:
        raise TrainError(f"algo.grpo_weighting={a.grpo_weighting!r}: choose {' or '.join(GRPO_WEIGHTING)}")
    if a.grpo_keep not in GRPO_KEEP:
        raise TrainError(f"algo.grpo_keep={a.grpo_keep!r}: choose {' or '.join(GRPO_KEEP)}")
    if cfg.init_states is not None:
        if a.name not in GROUP_ALGORITHMS:
            raise TrainError(
                f"init_states={cfg.init_states} sets GRPO's group initial states; algo={a.name} "
                f"continues episodes across iterations: use one of {list(GROUP_ALGORITHMS)}, or leave it unset"
            )
        if cfg.init_states < 1:
            raise TrainError(f"init_states must be >= 1 (states per task), got {cfg.init_states}")
    from embodied.rllib.env_runner import INIT_POOLS

    if cfg.init_pool not in INIT_POOLS:
        raise TrainError(f"init_pool={cfg.init_pool!r}: choose {' or '.join(INIT_POOLS)}")
    if cfg.greedy_every < 0 or cfg.greedy_states < 1:
        raise TrainError(
            f"greedy_every ({cfg.greedy_every}) must be >= 0 (0: no greedy probe) and greedy_states "
            f"({cfg.greedy_states}) >= 1"
        )
    pool = sims.suites.num_training_states(cfg.suite) if cfg.init_pool == "random" else sims.suites.NUM_INIT_STATES
    if cfg.greedy_every and pool is not None and cfg.greedy_states > pool:
        raise TrainError(
            f"greedy_states={cfg.greedy_states}: {cfg.suite}'s {cfg.init_pool} pool has {pool} states per task"
        )
    if a.critic not in CRITICS:
        raise TrainError(f"algo.critic={a.critic!r}: choose one of {', '.join(CRITICS)}")
    if a.critic == "privileged" and (not a.critic_hidden or min(a.critic_hidden) < 1):
        raise TrainError(f"algo.critic_hidden={list(a.critic_hidden)} must list layer widths >= 1")
    if cfg.truncation not in TRUNCATION:
        raise TrainError(f"truncation={cfg.truncation!r}: choose {' or '.join(TRUNCATION)}")
    if a.ratio not in ("chunk", "per_dim"):
        raise TrainError(f"algo.ratio={a.ratio!r}: choose chunk or per_dim")
    problem = runtime_problem(r)
    if problem:
        raise TrainError(problem)
    if cfg.suite not in sims.suites.env_names():
        raise TrainError(f"unknown suite {cfg.suite!r}; choose from {sims.suites.env_names()}")
    if a.critic == "privileged" and sims.suites.is_libero(cfg.suite):
        raise TrainError(
            f"algo.critic=privileged reads obs['privileged'], which {cfg.suite} has not (its tasks share "
            "no privileged vector): use algo.critic=policy"
        )
    n_tasks = len(sims.suites.tasks(cfg.suite))
    if cfg.tasks is not None and any(not 0 <= t < n_tasks for t in cfg.tasks):
        raise TrainError(f"tasks {cfg.tasks} out of range for suite {cfg.suite!r} (0..{n_tasks - 1})")
    if cfg.backend is not None and cfg.backend not in sims.backends():
        raise TrainError(f"unknown backend {cfg.backend!r}; choose from {sims.backends()}")
    if cfg.backend is not None and (cfg.backend == "maniskill") != (cfg.suite == "maniskill"):
        raise TrainError(f"backend={cfg.backend} cannot simulate suite {cfg.suite!r}")
    if cfg.iterations < 1 or cfg.chunks_per_iter < 1 or cfg.num_envs < 1:
        raise TrainError("iterations, chunks_per_iter and num_envs must be >= 1")
    if cfg.device not in ("cpu", "cuda"):
        raise TrainError(f"device={cfg.device!r}: choose cpu or cuda")
    if cfg.device == "cpu" and r.num_gpus_per_learner:
        raise TrainError(
            f"runtime.num_gpus_per_learner={r.num_gpus_per_learner} gives the learners GPUs: "
            "set device=cuda (or num_gpus_per_learner=0)"
        )
    if r.num_gpus_per_learner < 0 or r.num_gpus_per_env_runner < 0:
        raise TrainError("runtime.num_gpus_per_learner and runtime.num_gpus_per_env_runner must be >= 0")
    if r.name == "local" and r.num_gpus_per_env_runner:
        raise TrainError(
            "runtime.num_gpus_per_env_runner applies to remote env runners (runtime=cluster); "
            "runtime=local samples in the driver, which sees the GPUs"
        )
    if cfg.device == "cuda" and r.name == "local" and not r.address:
        import torch

        if not torch.cuda.is_available():
            raise TrainError(
                "device=cuda but torch sees no CUDA device here: use device=cpu, or "
                "runtime=cluster runtime.address=... to learn on a cluster's GPUs"
            )
    if not 0 <= a.critic_warmup < cfg.iterations:
        raise TrainError(
            f"algo.critic_warmup={a.critic_warmup} must lie in 0..iterations-1 ({cfg.iterations - 1}): "
            "the warm-up iterations update the critic only, the actor learns after them"
        )


def _load_policy(cfg: TrainConfig, out: Path) -> tuple[Any, Optional[Path]]:
    """The policy to train and, on resume, the checkpoint folder it came from."""
    import policies
    from embodied.rllib.checkpoint import holds_checkpoint, load_init_policy, load_resumed_policy, resumable

    family, sampler, _ = ALGORITHMS[cfg.algo.name]
    resumed = None
    if cfg.resume:
        resumed = resumable(out)
        if resumed is None:
            raise TrainError(f"resume=true but {out / 'checkpoint'} holds no checkpoint")
        policy = load_resumed_policy(resumed)
    elif cfg.init is not None:
        if holds_checkpoint(out):
            raise TrainError(f"{out} already holds a run: pass resume=true to continue it, or a new out=...")
        policy = load_init_policy(cfg.init)
    else:
        if cfg.policy is None:
            raise TrainError("give init=CKPT (an SFT bundle) or policy=flow|autoregressive")
        fam, overrides = policy_overrides(cfg.policy)
        policy = policies.make(fam, **overrides)
        width = _env_state_width(cfg, policy.config.state_obs)
        if policy.config.state_dim != width:  # a fresh policy is sized by its config, not by the env
            raise TrainError(
                f"the new {fam} policy reads a {policy.config.state_dim}-D state (policy.state_dim), "
                f"but suite {cfg.suite!r} gives a {width}-D state with "
                f"state_obs={policy.config.state_obs!r}: set policy.state_dim={width}"
            )
    if cfg.latency_delays:
        policy = _latency_aware(cfg, policy)
    if not trains(ALGORITHMS[cfg.algo.name], policy.family):
        fits = ", ".join(algorithms_for(policy.family))
        raise TrainError(
            f"algo={cfg.algo.name} trains a {family} policy, but the policy is {policy.family}: use one of algo={fits}"
        )
    if sampler == "steer":
        policy.add_steer()  # DSRL: a fresh steering module over the fixed flow (a steered init keeps its own)
    elif sampler is not None:
        policy.config.sampler = sampler
    if cfg.algo.temperature is not None:
        policy.config.temperature = float(cfg.algo.temperature)
    if cfg.algo.sde_steps is not None:
        if not hasattr(policy.config, "sde_steps"):
            raise TrainError(
                f"algo.sde_steps: the {policy.family} family's Flow-SDE draws its stochastic step from "
                "every denoising step; leave it unset"
            )
        steps = int(policy.config.num_steps)
        if not cfg.algo.sde_steps <= steps:
            raise TrainError(f"algo.sde_steps={cfg.algo.sde_steps} is more than the policy's {steps} denoising steps")
        policy.config.sde_steps = int(cfg.algo.sde_steps)
    return policy, resumed


def _env_state_width(cfg: TrainConfig, state_obs: str) -> int:
    """Width of ``obs["state"]`` of the suite's env with ``state_obs``."""
    import sims

    with sims.make(sims.suites.backend(cfg.suite), suite=cfg.suite, num_envs=1, cameras=(), state_obs=state_obs) as env:
        return int(env.observation_spec["state"].shape[0])


def _latency_aware(cfg: TrainConfig, policy: Any) -> Any:
    """The policy with the latency-aware state (committed actions + d): a policy that reads the
    env's plain state is widened (new inputs zero-initialised); one already widened for the same
    largest delay is kept."""
    import sims
    from embodied.latency import augmented_state_dim, widen_state_input

    delays = list(cfg.latency_delays or [])
    if min(delays) < 0 or max(delays) >= policy.chunk_size:
        raise TrainError(
            f"latency_delays {delays} must lie in 0..{policy.chunk_size - 1} (below the policy's "
            f"chunk size {policy.chunk_size}): train a policy with longer chunks for longer delays"
        )
    with sims.make(
        sims.suites.backend(cfg.suite), suite=cfg.suite, num_envs=1, cameras=(), state_obs=policy.config.state_obs
    ) as env:
        s, a = int(env.observation_spec["state"].shape[0]), int(env.action_spec.shape[0])
    wide = augmented_state_dim(s, a, max(delays))
    if policy.config.state_dim == wide:
        return policy
    if policy.config.state_dim != s:
        raise TrainError(
            f"latency_delays={delays} needs a policy reading the env's {s}-D state (it is widened to "
            f"{wide}) or one already widened to {wide}; this one reads {policy.config.state_dim}"
        )
    return widen_state_input(policy, wide - s)


def _check_env_spec(cfg: TrainConfig, policy: Any, tasks: list[int]) -> int:
    """Fail before Ray starts if the policy cannot drive the env (action space, cameras, ...) or if
    GRPO's episodes cannot finish inside one iteration; returns the width of a privileged critic's
    input (:func:`embodied.algorithms.critic.critic_input_dim`) for this env."""
    import sims
    from embodied.algorithms.critic import critic_input_dim

    with sims.make(
        sims.suites.backend(cfg.suite),
        suite=cfg.suite,
        num_envs=1,
        cameras=tuple(policy.config.cameras),
        image_size=cfg.image_size,
        state_obs=policy.config.state_obs,
    ) as env:
        if cfg.latency_delays:
            from embodied.latency.delay_env import DelayedChunkEnv

            env = DelayedChunkEnv(env, policy.chunk_size, cfg.latency_delays)
        policy.check_env(env)
        spec = env.observation_spec
        if "privileged" not in spec and cfg.algo.critic == "privileged":
            raise TrainError(
                f"algo.critic=privileged needs the env's 'privileged' observation; suite "
                f"{cfg.suite!r} has none: use algo.critic=policy"
            )
        critic_dim = critic_input_dim(
            int(spec["state"].shape[0]), int(spec["privileged"].shape[0]) if "privileged" in spec else 0, len(env.tasks)
        )
    if cfg.algo.name in GROUP_ALGORITHMS:
        longest = cfg.max_episode_steps or max(sims.suites.tasks(cfg.suite)[t].max_steps for t in tasks)
        if cfg.chunks_per_iter * policy.chunk_size < longest:
            raise TrainError(
                f"{cfg.algo.name} scores whole episodes: chunks_per_iter * chunk size "
                f"({cfg.chunks_per_iter} * {policy.chunk_size}) must cover the step limit ({longest})"
            )
    return critic_dim


def train(cfg: TrainConfig) -> dict[str, Any]:
    import torch

    import sims
    from embodied.rllib import build_algorithm, make_env_config
    from embodied.rllib.checkpoint import holds_critic, load_progress, restore_checkpoint, save_checkpoint
    from embodied.rllib.startup import GPUShortageError, check_gpus, describe_placement, start_ray

    check_config(cfg)
    out = prepare_run_dir(cfg.out)
    policy, resumed = _load_policy(cfg, out)
    specs = sims.suites.tasks(cfg.suite)
    tasks = list(range(len(specs))) if cfg.tasks is None else list(cfg.tasks)
    critic_dim = _check_env_spec(cfg, policy, tasks)
    a, r = cfg.algo, cfg.runtime
    critic = (
        {"kind": "privileged", "input_dim": critic_dim, "hidden": list(a.critic_hidden)}
        if a.critic == "privileged"
        else None
    )
    if resumed is not None and holds_critic(resumed) != (critic is not None):
        raise TrainError(
            f"{resumed} was trained with algo.critic="
            f"{'privileged' if critic is None else 'policy'}: resume with the same algo.critic"
        )
    torch.set_num_threads(r.learner_threads)
    start_iter, env_steps = 0, 0
    meta: dict[str, Any] = {}
    if resumed is not None:
        meta = load_progress(resumed)
        start_iter, env_steps = int(meta["step"]), int(meta["extra"].get("env_steps", 0))
    else:
        torch.manual_seed(cfg.seed)
    env_config = make_env_config(
        suite=cfg.suite,
        tasks=tasks,
        num_envs=cfg.num_envs,
        image_size=cfg.image_size,
        chunks_per_iter=cfg.chunks_per_iter,
        reward_type=cfg.reward_type,
        max_steps=cfg.max_episode_steps,
        algo="grpo" if a.name in GROUP_ALGORITHMS else "ppo",
        group_size=a.group_size,
        gamma=a.gamma,
        lam=a.lam,
        latency_delays=cfg.latency_delays,
        backend=cfg.backend,
        truncation=cfg.truncation,
        init_states=cfg.init_states,
        grpo_weighting=a.grpo_weighting,
        grpo_keep=a.grpo_keep,
        grpo_std_norm=a.grpo_std_norm,
        init_pool=cfg.init_pool,
        # sampling on the GPU where the runners see one: the driver (local), or
        # remote runners given a GPU share
        inference_device="cuda"
        if cfg.device == "cuda" and (r.name == "local" or r.num_gpus_per_env_runner > 0)
        else "cpu",
    )
    loss = LossConfig(
        clip=a.clip,
        dual_clip=a.dual_clip,
        value_clip=a.value_clip,
        vf_coef=a.vf_coef,
        ent_coef=a.ent_coef,
        kl_coef=a.kl_coef,
        use_critic=ALGORITHMS[a.name].critic,
        logprob_scale=1.0 if a.ratio == "chunk" else 1.0 / (policy.chunk_size * policy.action_dim),
        neg_adv_scale=a.neg_adv_scale,
    )
    rl = dict(
        lr=a.lr,
        critic_lr=a.critic_lr or 0.0,
        loss=loss,
        num_epochs=a.epochs,
        minibatch_size=a.minibatch_size,
        target_kl=a.target_kl,
        kl_rollback=a.kl_rollback,
        freeze_prefix=a.freeze_prefix,
        critic_warmup=a.critic_warmup,
        grad_clip=a.max_grad_norm,
        overlap=r.overlap,
    )
    started_ray = start_ray(r, out)
    gpus_per_learner = r.num_gpus_per_learner or (1.0 if cfg.device == "cuda" else 0.0)
    try:
        check_gpus(r, gpus_per_learner)
    except GPUShortageError as err:
        if started_ray:
            import ray

            ray.shutdown()
        raise TrainError(str(err)) from None
    algo = None
    placement: dict[str, Any] = {}
    metrics = MetricsLog(
        out, METRIC_FIELDS, "iteration", resume_upto=start_iter if resumed is not None else None, tb_prefix="rl"
    )
    history: list[dict[str, float]] = []
    recoveries: list[Any] = []
    t_start = time.perf_counter()
    try:
        algo = build_algorithm(
            policy,
            instructions=[t.instruction for t in specs],
            env_config=env_config,
            rl=rl,
            num_env_runners=r.num_env_runners,
            num_learners=r.num_learners,
            num_gpus_per_learner=gpus_per_learner,
            num_gpus_per_env_runner=r.num_gpus_per_env_runner,
            seed=cfg.seed,
            critic=critic,
            runner_restart_timeout_s=r.runner_restart_timeout_s,
        )
        if resumed is not None:
            restore_checkpoint(algo, resumed, meta)
        algo.stop_iteration = cfg.iterations
        placement = algo.placement()
        print(describe_placement(placement), file=sys.stderr, flush=True)
        with tqdm(total=cfg.iterations, initial=start_iter, desc=f"rl {a.name}", unit="it") as bar:
            for it in range(start_iter, cfg.iterations):
                row = algo.run_iteration(it)
                _log_recoveries(out, algo.recoveries[len(recoveries) :])
                recoveries = list(algo.recoveries)
                row["iteration_env_steps"] = row["env_steps"]
                env_steps += int(row["env_steps"])
                row.update(
                    iteration=it + 1,
                    env_steps=env_steps,
                    env_steps_per_s=row["iteration_env_steps"] / max(row["iteration_s"], 1e-9),
                )
                if cfg.greedy_every and ((it + 1) % cfg.greedy_every == 0 or it + 1 == cfg.iterations):
                    row.update(_greedy_probe(cfg, out, algo, policy, tasks, it + 1))
                metrics.row({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
                metrics.scalars({k: row[k] for k in METRIC_FIELDS[1:] if k in row and np.isfinite(row[k])}, it + 1)
                history.append(row)
                bar.set_postfix(
                    succ=f"{row['success_rate']:.2f}", kl=f"{row['approx_kl']:.3f}", sps=f"{row['env_steps_per_s']:.0f}"
                )
                bar.update(1)
                if (it + 1) % cfg.save_every == 0 or it + 1 == cfg.iterations:
                    save_checkpoint(out, algo, policy, iteration=it + 1, env_steps=env_steps, algo_name=a.name)
    finally:
        metrics.close()
        if algo is not None:
            algo.stop()
        if started_ray:
            import ray

            ray.shutdown()
    wall = time.perf_counter() - t_start
    steps_run = sum(h["iteration_env_steps"] for h in history)
    loop_s = sum(h["iteration_s"] for h in history)
    summary = {
        "algo": a.name,
        "suite": cfg.suite,
        "tasks": tasks,
        "iterations": cfg.iterations,
        "env_steps": env_steps,
        "wall_s": round(wall, 1),
        "env_steps_per_s": round(steps_run / loop_s, 1) if history else None,
        "runtime": OmegaConf.to_container(OmegaConf.structured(r)),
        "placement": placement,
        "checkpoint": str(out / "checkpoint" / "policy"),
        "time_split_s": {k: round(sum(h[k] for h in history), 2) for k in ("sim_s", "inference_s", "learn_s", "wait_s")}
        if history
        else None,
        "machine": machine_info(),
        "last": history[-1] if history else None,
        "runner_recoveries": [rec.to_dict() for rec in recoveries],
    }
    write_json(out / "train.json", summary)
    return summary


def _log_recoveries(out: Path, new: list[Any]) -> None:
    """Env runners brought back during the last iteration: a line each on stderr and in
    ``out/runner_recoveries.jsonl`` (kept across resumes)."""
    import json

    from embodied.rllib.recovery import describe_recovery

    if not new:
        return
    with open(out / RECOVERIES_FILE, "a") as fh:
        for rec in new:
            print(describe_recovery(rec), file=sys.stderr, flush=True)
            fh.write(json.dumps(rec.to_dict()) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _greedy_probe(
    cfg: TrainConfig, out: Path, algo: Any, policy: Any, tasks: list[int], iteration: int
) -> dict[str, float]:
    """Score the current weights greedily on the run's training states (:mod:`embodied.eval.greedy_probe`),
    in as many processes as the env runners, which wait meanwhile."""
    import policies
    from embodied.eval.greedy_probe import PROBE_POLICY, log_probe, probe_first_state, score_greedy

    start = time.perf_counter()
    policy.load_state_dict(algo.policy_state())
    policies.save(policy, out / PROBE_POLICY, extra={"iteration": iteration})
    records = score_greedy(
        out / PROBE_POLICY,
        suite=cfg.suite,
        tasks=tasks,
        states=cfg.greedy_states,
        first_state=probe_first_state(cfg.suite, cfg.init_pool),
        num_envs=cfg.num_envs,
        image_size=cfg.image_size,
        seed=cfg.seed,
        workers=max(1, cfg.runtime.num_env_runners),
    )
    return log_probe(out, iteration, records) | {"greedy_s": time.perf_counter() - start}


@hydra_app("embodied-train", "train")
def main(cfg: Any) -> None:
    from embodied.rllib.recovery import RunnerLostError
    from policies import CheckpointError, SpecMismatchError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        summary = train(config)
    except (TrainError, CheckpointError, SpecMismatchError, FileNotFoundError, RunnerLostError) as err:
        raise SystemExit(f"embodied-train: {err}") from None
    print(
        f"{summary['algo']}: {summary['iterations']} iterations, {summary['env_steps']} env steps in "
        f"{summary['wall_s']} s; bundle {summary['checkpoint']}"
    )


if __name__ == "__main__":
    main()
