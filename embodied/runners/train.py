"""``embodied-train``: online RL of a VLA in parallel simulated envs, on Ray RLlib.

    embodied-train init=runs/sft_flow/checkpoint/policy algo=flow_sde suite=spatial out=runs/rl
    embodied-train init=runs/sft_ar/ckpt algo=ppo suite=spatial out=runs/rl_ar
    embodied-train init=... algo=grpo algo.group_size=4 ...            # token VLA, critic-free
    embodied-train init=runs/sft_flow/ckpt algo=flow_grpo ...          # flow VLA, critic-free (Flow-SDE sampler)
    embodied-train init=runs/sft_flow/ckpt algo=flow_fpo ...           # flow VLA, FPO ratio, critic-free (ODE sampler)
    embodied-train init=runs/sft_flow/ckpt algo=flow_dsrl ...          # flow VLA fixed, PPO on its initial noise (DSRL)
    embodied-train ... runtime=cluster runtime.num_env_runners=2       # env runners as Ray actors
    embodied-train ... algo.precision=bf16 algo.compile=true           # the learner in bf16 autocast, compiled
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

Each part of a run receives one typed, frozen config that checks itself when made, built from the YAML
keys of the same names (:func:`check_config`): the env runners an
:class:`~embodied.algorithms.sampling.EnvRunnerSettings` (with its
:class:`~embodied.algorithms.batch.AdvantageConfig`), the update an
:class:`~embodied.algorithms.update.UpdateConfig`, the loss a :class:`~embodied.algorithms.loss.LossConfig`, the
critic a :class:`~embodied.algorithms.critic.CriticConfig`. Their defaults live there; :class:`AlgoConfig` and
:class:`TrainConfig` refer to them. :func:`check_config` itself checks only what spans parts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

import numpy as np
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied.algorithms.batch import AdvantageConfig
from embodied.algorithms.critic import CriticConfig
from embodied.algorithms.loss import LossConfig
from embodied.algorithms.registry import (
    ALGORITHMS,
    FLOW_MATCHING_FAMILIES,
    GROUP_ALGORITHMS,
    AlgoSpec,
    algorithms_for,
    trains,
)
from embodied.algorithms.sampling import EnvRunnerSettings
from embodied.algorithms.update import UpdateConfig
from embodied.config import hydra_app, policy_overrides, register_policy_schemas, store
from embodied.metrics_log import LOGGERS, MetricsLog
from embodied.runs import machine_info, plain_config, prepare_run_dir, write_json
from policies.errors import ConfigOverrideError
from sims.registry import closest_key

METRIC_FIELDS = [
    "iteration",
    "env_steps",
    "episodes",
    "success_rate",
    "fresh_episodes",
    "fresh_success_rate",
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
    """Config group ``algo/``: the RL algorithm and its hyper-parameters, the YAML face of the typed configs
    the run's parts receive. Every field but the last two is the field of the same name of one of them,
    whose default it takes and whose docstring says what it does: :class:`~embodied.algorithms.batch.AdvantageConfig`
    (``name``, ``gamma``, ``lam``, ``group_size``, ``grpo_*``), :class:`~embodied.algorithms.update.UpdateConfig`
    (pi_RL's values where published), :class:`~embodied.algorithms.loss.LossConfig`,
    :class:`~embodied.algorithms.critic.CriticConfig`. ``temperature`` and ``sde_steps`` set the policy's
    sampling for the rollouts. ``configs/algo/<name>.yaml`` holds only what an algorithm sets otherwise."""

    # flow_sde | flow_sde_full | flow_noise | flow_grpo | flow_fpo | flow_dsrl | flow_dsrl_grpo (flow VLA) |
    # ppo | grpo (token VLA)
    name: str = "flow_sde"
    lr: float = UpdateConfig.lr  # actor (pi_RL: 5e-6; 0: a frozen-actor control)
    critic_lr: Optional[float] = UpdateConfig.critic_lr  # value head (null for grpo: no critic)
    gamma: float = AdvantageConfig.gamma  # per chunk
    lam: float = AdvantageConfig.lam  # GAE lambda
    clip: float = LossConfig.clip  # PPO ratio clip
    dual_clip: Optional[float] = LossConfig.dual_clip  # bound on the loss for negative advantages (null: off)
    value_clip: Optional[float] = LossConfig.value_clip  # value clipping (null: off; grpo: must be null)
    vf_coef: float = LossConfig.vf_coef  # value loss weight (grpo: must be 0)
    ent_coef: float = LossConfig.ent_coef  # entropy bonus
    kl_coef: float = LossConfig.kl_coef  # approx-KL penalty (off by default)
    neg_adv_scale: float = LossConfig.neg_adv_scale  # multiplies negative advantages (0: pull up the better only)
    ratio: str = LossConfig.ratio  # chunk | per_dim (the ratio's per-dimension geometric mean, GSPO's)
    epochs: int = UpdateConfig.epochs  # passes over each iteration's batch
    minibatch_size: Optional[int] = UpdateConfig.minibatch_size  # chunks per step (null: the whole batch)
    target_kl: Optional[float] = UpdateConfig.target_kl  # early stop of an iteration's update (null: never)
    kl_rollback: bool = UpdateConfig.kl_rollback  # the stop also undoes the actor's last two steps
    max_grad_norm: float = UpdateConfig.max_grad_norm  # global gradient-norm clip
    freeze_prefix: bool = UpdateConfig.freeze_prefix  # false: train the observation encoder too
    critic_warmup: int = UpdateConfig.critic_warmup  # first iterations that update only the value head
    critic: str = CriticConfig.critic  # policy (the policy's value head) | privileged (simulator-state MLP)
    critic_hidden: list[int] = field(default_factory=lambda: list(CriticConfig.critic_hidden))  # its widths
    group_size: int = AdvantageConfig.group_size  # grpo / flow_grpo: rollouts per initial state
    grpo_weighting: str = AdvantageConfig.grpo_weighting  # chunk | episode (each kept episode weighs the same)
    grpo_keep: str = AdvantageConfig.grpo_keep  # success | return (dynamic sampling)
    grpo_std_norm: bool = AdvantageConfig.grpo_std_norm  # false: Dr. GRPO (keep the returns' scale)
    precision: str = UpdateConfig.precision  # the learners' numerics: fp32 | bf16 (autocast, frozen weights in bf16)
    compile: bool = UpdateConfig.compile  # torch.compile the learners' policy (eager, with a warning, where it cannot)
    # token VLA (ppo | grpo): sampling temperature of the rollouts, which the PPO log-probabilities use too
    # (null: the checkpoint's policy.temperature). Below 1 the behaviour policy is nearer the greedy one
    # that evaluation runs; the trained bundle keeps this temperature for mode="explore".
    temperature: Optional[float] = None
    # flow VLA, Flow-SDE (flow_sde / flow_grpo): draw each chunk's stochastic denoising step from the first N
    # steps only (null: the checkpoint's policy.sde_steps, all K by default). The last steps' noise is the
    # smallest and their scores the largest (benchmarks/gradient_signal.py measures what that does to a batch)
    sde_steps: Optional[int] = None
    # flow VLA: the rollouts' sampler, any stochastic one registered in policies.flow.samplers (null: the
    # algorithm's, sde for flow_sde). A new sampler trains under an existing algorithm: algo.sampler=NAME
    sampler: Optional[str] = None


def algorithm_spec(a: AlgoConfig) -> AlgoSpec:
    """The spec of ``algo.name`` with its rollouts' sampler replaced by ``algo.sampler`` where set."""
    spec = ALGORITHMS[a.name]
    return spec if a.sampler is None else spec._replace(sampler=a.sampler)


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
    """Schema of ``embodied-train``. The env runners' fields (``suite`` .. ``latency_delays``) are the fields
    of the same name of :class:`~embodied.algorithms.sampling.EnvRunnerSettings`, whose defaults and
    documentation they take; the others are the command's own, checked here when it is made."""

    out: str = MISSING  # run folder
    init: Optional[str] = None  # SFT checkpoint bundle to start from (else a fresh policy=...)
    policy: Any = None  # config group policy/ (used without init)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    suite: str = "spatial"  # task suite (sims.suites.env_names(): ours, maniskill, real LIBERO's libero_*)
    backend: Optional[str] = EnvRunnerSettings.backend  # simulation backend of the env runners; default: the suite's
    tasks: Optional[list[int]] = EnvRunnerSettings.tasks  # subset of the suite's tasks (default: all)
    num_envs: int = 10  # envs per env runner (runtime=local: the envs)
    image_size: int = 64  # rendered size (match the policy's input size to skip resizing)
    iterations: int = 50
    chunks_per_iter: int = 16  # RL steps (chunks) per env per iteration
    max_episode_steps: Optional[int] = EnvRunnerSettings.max_episode_steps  # training step limit; default: the task's
    truncation: str = EnvRunnerSettings.truncation  # bootstrap | fail (a step limit ends an episode as a failure)
    # grpo / flow_grpo: draw the groups' initial states from the first N training states of each task, in
    # turn (the LIBERO RL works train on a fixed set of initial states); null: a new state for every group.
    # Evaluation keeps its 50 held-out protocol states either way.
    init_states: Optional[int] = EnvRunnerSettings.init_states
    # where training episodes start: random (training states; evaluation's 50 protocol states stay held out) |
    # protocol (the protocol's 50 fixed initial states per task, which evaluation scores: the LIBERO RL works'
    # protocol, e.g. RLinf's use_fixed_reset_state_ids)
    init_pool: str = EnvRunnerSettings.init_pool
    reward_type: str = EnvRunnerSettings.reward_type  # sparse: success (as pi_RL on LIBERO) | shaped | dense
    # latency-aware RL (ARLI): each chunk acts d control steps after its observation, d drawn per episode
    # from this list (each < the chunk size); the policy's state gains the committed actions and d
    latency_delays: Optional[list[int]] = EnvRunnerSettings.latency_delays
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
    logger: str = "tensorboard"  # where the scalars go besides metrics.csv: tensorboard | wandb | both

    def __post_init__(self) -> None:
        if self.logger not in LOGGERS:
            raise TrainError(f"logger={self.logger!r}: choose one of {', '.join(LOGGERS)}")
        for key in ("iterations", "save_every", "greedy_states"):
            if getattr(self, key) < 1:
                raise TrainError(f"{key}={getattr(self, key)} must be >= 1")
        if self.greedy_every < 0:
            raise TrainError(f"greedy_every={self.greedy_every} must be >= 0 (0: no greedy probe)")
        if self.device not in ("cpu", "cuda"):
            raise TrainError(f"device={self.device!r}: choose cpu or cuda")


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


C = TypeVar("C")


@dataclass(frozen=True)
class RunParts:
    """The typed configs a run's parts receive (:func:`check_config` makes them from a :class:`TrainConfig`)."""

    env_runner: EnvRunnerSettings
    update: UpdateConfig
    loss: LossConfig
    critic: CriticConfig


def part_config(cls: type[C], source: Any, group: str = "", **derived: Any) -> C:
    """The typed config ``cls`` of a part: each field from ``source``'s field of the same name (the YAML
    keys under ``group``: ``algo.`` or the top level), unless ``derived`` gives it; a field ``source``
    lacks keeps its default. Its own checks (its ``__post_init__``) raise as a :class:`TrainError`
    naming the key."""
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in derived]  # type: ignore[arg-type]
    values = {name: getattr(source, name) for name in names if hasattr(source, name)}
    try:
        return cls(**values, **derived)
    except ValueError as err:
        raise TrainError(f"{group}{err}") from None


def check_config(cfg: TrainConfig) -> RunParts:
    """Stop impossible settings before anything starts, and return the parts' typed configs: each checks
    its own fields when made (:func:`part_config`); here only what spans parts: the algorithm's
    requirements on the other settings, where the run's parts are placed, what the suite offers."""
    a = cfg.algo
    advantages = part_config(AdvantageConfig, a, "algo.")  # the algorithm's name first: the checks read its spec
    _check_algorithm(cfg)
    parts = RunParts(
        update=part_config(UpdateConfig, a, "algo."),
        loss=part_config(LossConfig, a, "algo.", use_critic=ALGORITHMS[a.name].critic),
        critic=part_config(CriticConfig, a, "algo."),
        env_runner=part_config(EnvRunnerSettings, cfg, advantages=advantages, inference_device=_inference_device(cfg)),
    )
    _check_placement(cfg)
    _check_suite(cfg, parts)
    return parts


def _inference_device(cfg: TrainConfig) -> str:
    """Where the env runners sample: on the GPU where they see one (the driver with runtime=local, or
    remote runners given a GPU share) when the run uses CUDA."""
    r = cfg.runtime
    return "cuda" if cfg.device == "cuda" and (r.name == "local" or r.num_gpus_per_env_runner > 0) else "cpu"


def _check_algorithm(cfg: TrainConfig) -> None:
    """What the algorithm (``algo.name``) requires of the other settings."""
    a = cfg.algo
    _check_sampler(a)
    spec = algorithm_spec(a)
    if not spec.critic:
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
    if spec.sampler == "fpo" and a.ent_coef:
        raise TrainError(f"algo={a.name} has no closed-form entropy to reward: set algo.ent_coef=0 (got {a.ent_coef})")
    if a.temperature is not None:
        if spec.family != "autoregressive":
            raise TrainError(
                f"algo.temperature is the token VLA's sampling temperature (algo=ppo or grpo); "
                f"algo={a.name} samples a flow policy: leave it unset"
            )
        if not a.temperature > 0:
            raise TrainError(f"algo.temperature must be > 0, got {a.temperature}")
    if a.sde_steps is not None:
        if spec.sampler != "sde":
            raise TrainError(
                f"algo.sde_steps picks Flow-SDE's stochastic step (algo=flow_sde or flow_grpo); "
                f"algo={a.name} samples otherwise: leave it unset"
            )
        if a.sde_steps < 1:
            raise TrainError(f"algo.sde_steps must be >= 1 (at most the policy's num_steps), got {a.sde_steps}")
    if not 0 <= a.critic_warmup < cfg.iterations:
        raise TrainError(
            f"algo.critic_warmup={a.critic_warmup} must lie in 0..iterations-1 ({cfg.iterations - 1}): "
            "the warm-up iterations update the critic only, the actor learns after them"
        )


def _check_sampler(a: AlgoConfig) -> None:
    """``algo.sampler``: a flow algorithm's, a registered sampler, one that explores."""
    if a.sampler is None:
        return
    from policies.flow.samplers import SAMPLERS

    family = ALGORITHMS[a.name].family
    if family != "flow":
        raise TrainError(
            f"algo.sampler picks a flow VLA's rollouts; algo={a.name} trains a {family} policy: leave it unset"
        )
    if a.sampler not in SAMPLERS.names():
        guess = closest_key(a.sampler, SAMPLERS.names())
        raise TrainError(
            f"algo.sampler={a.sampler!r} is not a flow sampler"
            + (f" (did you mean {guess!r}?)" if guess else "")
            + f": one of {', '.join(SAMPLERS.names())}, or register yours in policies/flow/samplers.py"
        )
    if not SAMPLERS[a.sampler].explores:
        raise TrainError(
            f"algo.sampler={a.sampler} draws chunks without a log-probability to train on: pick a stochastic "
            f"one ({', '.join(n for n in SAMPLERS.names() if SAMPLERS[n].explores)})"
        )


def _check_placement(cfg: TrainConfig) -> None:
    """The runtime (:func:`runtime_problem`) and the GPUs it asks for against ``device``."""
    r = cfg.runtime
    problem = runtime_problem(r)
    if problem:
        raise TrainError(problem)
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


def _check_suite(cfg: TrainConfig, parts: RunParts) -> None:
    """What the suite offers: enough initial states for the greedy probe, a privileged vector for the
    privileged critic."""
    import sims

    s = parts.env_runner
    pool = sims.suites.num_training_states(s.suite) if s.init_pool == "random" else sims.suites.NUM_INIT_STATES
    if cfg.greedy_every and pool is not None and cfg.greedy_states > pool:
        raise TrainError(
            f"greedy_states={cfg.greedy_states}: {s.suite}'s {s.init_pool} pool has {pool} states per task"
        )
    if parts.critic.critic == "privileged" and sims.suites.is_libero(s.suite):
        raise TrainError(
            f"algo.critic=privileged reads obs['privileged'], which {s.suite} has not (its tasks share "
            "no privileged vector): use algo.critic=policy"
        )


def _load_policy(cfg: TrainConfig, out: Path) -> tuple[Any, Optional[Path]]:
    """The policy to train, built sampling as the algorithm does (:func:`_sampling`), and, on resume, the
    checkpoint folder it came from."""
    from embodied.rllib.checkpoint import holds_checkpoint, resumable

    resumed = None
    if cfg.resume:
        resumed = resumable(out)
        if resumed is None:
            raise TrainError(f"resume=true but {out / 'checkpoint'} holds no checkpoint")
    elif cfg.init is not None and holds_checkpoint(out):
        raise TrainError(f"{out} already holds a run: pass resume=true to continue it, or a new out=...")
    elif cfg.init is None and cfg.policy is None:
        raise TrainError("give init=CKPT (an SFT bundle) or policy=flow|autoregressive")
    sampling = _sampling(cfg.algo)
    try:
        policy = _build_policy(cfg, resumed, sampling)
    except ConfigOverrideError as err:
        _check_family(cfg, _build_policy(cfg, resumed, {}))  # a policy of another family: say that first
        raise TrainError(f"algo={cfg.algo.name} samples with {sampling}, which the policy refuses: {err}") from None
    if cfg.latency_delays:
        policy = _latency_aware(cfg, policy)
    _check_family(cfg, policy)
    if algorithm_spec(cfg.algo).sampler == "steer":
        policy.add_steer()  # DSRL: a steering module over the fixed flow (a steered policy keeps its own)
    return policy, resumed


def _check_family(cfg: TrainConfig, policy: Any) -> None:
    if trains(algorithm_spec(cfg.algo), policy.family):
        return
    if cfg.algo.sampler is not None and trains(ALGORITHMS[cfg.algo.name], policy.family):
        raise TrainError(
            f"algo.sampler={cfg.algo.sampler}: a {policy.family} policy samples with "
            f"{', '.join(FLOW_MATCHING_FAMILIES.get(policy.family, ()))} only (or leave algo.sampler unset)"
        )
    fits = ", ".join(algorithms_for(policy.family))
    raise TrainError(
        f"algo={cfg.algo.name} trains a {ALGORITHMS[cfg.algo.name].family} policy, but the policy is "
        f"{policy.family}: use one of algo={fits}"
    )


def _build_policy(cfg: TrainConfig, resumed: Optional[Path], sampling: dict[str, Any]) -> Any:
    """The resumed checkpoint's policy, the ``init`` bundle's, or a fresh ``policy`` family's, each built
    with the config fields ``sampling``."""
    import policies
    from embodied.rllib.checkpoint import load_init_policy, load_resumed_policy

    if resumed is not None:
        return load_resumed_policy(resumed, sampling)
    if cfg.init is not None:
        return load_init_policy(cfg.init, sampling)
    fam, overrides = policy_overrides(cfg.policy)
    policy = policies.make(fam, **{**overrides, **sampling})
    width = _env_state_width(cfg, policy.config.state_obs)
    if policy.config.state_dim != width:  # a fresh policy is sized by its config, not by the env
        raise TrainError(
            f"the new {fam} policy reads a {policy.config.state_dim}-D state (policy.state_dim), "
            f"but suite {cfg.suite!r} gives a {width}-D state with "
            f"state_obs={policy.config.state_obs!r}: set policy.state_dim={width}"
        )
    return policy


def _sampling(a: AlgoConfig) -> dict[str, Any]:
    """The policy config fields the rollouts sample with, set when the policy is built: the algorithm's
    sampler (DSRL's steering module is attached after, see :func:`_load_policy`), ``algo.temperature``,
    ``algo.sde_steps`` (the policy's config validates them)."""
    sampler = algorithm_spec(a).sampler
    fields: dict[str, Any] = {"sampler": sampler} if sampler not in (None, "steer") else {}
    if a.temperature is not None:
        fields["temperature"] = float(a.temperature)
    if a.sde_steps is not None:
        fields["sde_steps"] = int(a.sde_steps)
    return fields


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
    """Run ``embodied-train``'s RL (see the module docstring); returns the summary also written to
    ``out/train.json``."""
    import torch

    import sims
    from embodied.rllib import build_algorithm
    from embodied.rllib.checkpoint import holds_critic, restore_checkpoint
    from embodied.rllib.startup import describe_placement

    parts = check_config(cfg)
    out = prepare_run_dir(cfg.out)
    policy, resumed = _load_policy(cfg, out)
    tasks = list(parts.env_runner.tasks)
    critic = parts.critic.module_entry(_check_env_spec(cfg, policy, tasks))
    if resumed is not None and holds_critic(resumed) != (critic is not None):
        raise TrainError(
            f"{resumed} was trained with algo.critic="
            f"{'privileged' if critic is None else 'policy'}: resume with the same algo.critic"
        )
    torch.set_num_threads(cfg.runtime.learner_threads)
    start_iter, env_steps, meta = _progress(cfg, resumed)
    started_ray, gpus_per_learner = _start_ray(cfg, out)
    algo = None
    placement: dict[str, Any] = {}
    metrics = _metrics_log(cfg, out, start_iter if resumed is not None else None)
    history: list[dict[str, float]] = []
    t_start = time.perf_counter()
    try:
        algo = build_algorithm(
            policy,
            instructions=[t.instruction for t in sims.suites.tasks(cfg.suite)],
            env_runner=parts.env_runner,
            update=parts.update,
            loss=parts.loss,
            overlap=cfg.runtime.overlap,
            num_env_runners=cfg.runtime.num_env_runners,
            num_learners=cfg.runtime.num_learners,
            num_gpus_per_learner=gpus_per_learner,
            num_gpus_per_env_runner=cfg.runtime.num_gpus_per_env_runner,
            seed=cfg.seed,
            critic=critic,
            runner_restart_timeout_s=cfg.runtime.runner_restart_timeout_s,
        )
        if resumed is not None:
            restore_checkpoint(algo, resumed, meta)
        algo.stop_iteration = cfg.iterations
        placement = algo.placement()
        print(describe_placement(placement), file=sys.stderr, flush=True)
        env_steps = _iterate(cfg, out, algo, policy, tasks, start_iter, env_steps, metrics, history)
    finally:
        _stop(metrics, algo, started_ray)
    summary = _summary(cfg, tasks, env_steps, history, placement, time.perf_counter() - t_start, out, algo)
    write_json(out / "train.json", summary)
    return summary


def _metrics_log(cfg: TrainConfig, out: Path, resume_upto: Optional[int]) -> MetricsLog:
    """``metrics.csv`` (kept up to ``resume_upto`` on a resume) and the scalars' logger, the config with it."""
    return MetricsLog(
        out,
        METRIC_FIELDS,
        "iteration",
        resume_upto=resume_upto,
        tb_prefix="rl",
        logger=cfg.logger,
        config=plain_config(cfg),
    )


def _progress(cfg: TrainConfig, resumed: Optional[Path]) -> tuple[int, int, dict[str, Any]]:
    """``(first iteration, env steps so far, the checkpoint's training state)`` of a resumed run; a new
    one starts at 0 with torch's global RNG seeded by ``seed``."""
    import torch

    from embodied.rllib.checkpoint import load_progress

    if resumed is None:
        torch.manual_seed(cfg.seed)
        return 0, 0, {}
    meta = load_progress(resumed)
    return int(meta["step"]), int(meta["extra"].get("env_steps", 0)), meta


def _start_ray(cfg: TrainConfig, out: Path) -> tuple[bool, float]:
    """Start Ray (or join ``runtime.address``) and check the GPUs asked for are there: ``(whether Ray was
    started here, GPUs per learner)``."""
    from embodied.rllib.startup import GPUShortageError, check_gpus, start_ray

    r = cfg.runtime
    started_ray = start_ray(r, out)
    gpus_per_learner = r.num_gpus_per_learner or (1.0 if cfg.device == "cuda" else 0.0)
    try:
        check_gpus(r, gpus_per_learner)
    except GPUShortageError as err:
        if started_ray:
            import ray

            ray.shutdown()
        raise TrainError(str(err)) from None
    return started_ray, gpus_per_learner


def _iterate(
    cfg: TrainConfig,
    out: Path,
    algo: Any,
    policy: Any,
    tasks: list[int],
    start_iter: int,
    env_steps: int,
    metrics: MetricsLog,
    history: list[dict[str, float]],
) -> int:
    """Iterations ``start_iter .. iterations - 1``: each row into ``metrics`` (and ``history``), the env
    runners brought back logged, the greedy probe and the checkpoints on their schedules. Returns the
    run's env steps."""
    from embodied.rllib.checkpoint import save_checkpoint

    logged = 0  # env runner recoveries logged so far
    with tqdm(total=cfg.iterations, initial=start_iter, desc=f"rl {cfg.algo.name}", unit="it") as bar:
        for it in range(start_iter, cfg.iterations):
            row = algo.run_iteration(it)
            _log_recoveries(out, algo.recoveries[logged:])
            logged = len(algo.recoveries)
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
                save_checkpoint(out, algo, policy, iteration=it + 1, env_steps=env_steps, algo_name=cfg.algo.name)
    return env_steps


def _stop(metrics: MetricsLog, algo: Any, started_ray: bool) -> None:
    """Close the metrics, stop the algorithm (its env runners and learners) and the Ray started here."""
    metrics.close()
    if algo is not None:
        algo.stop()
    if started_ray:
        import ray

        ray.shutdown()


def _summary(
    cfg: TrainConfig,
    tasks: list[int],
    env_steps: int,
    history: list[dict[str, float]],
    placement: dict[str, Any],
    wall: float,
    out: Path,
    algo: Any,
) -> dict[str, Any]:
    """The run's ``train.json``."""
    steps_run = sum(h["iteration_env_steps"] for h in history)
    loop_s = sum(h["iteration_s"] for h in history)
    return {
        "algo": cfg.algo.name,
        "suite": cfg.suite,
        "tasks": tasks,
        "iterations": cfg.iterations,
        "env_steps": env_steps,
        "wall_s": round(wall, 1),
        "env_steps_per_s": round(steps_run / loop_s, 1) if history else None,
        "runtime": OmegaConf.to_container(OmegaConf.structured(cfg.runtime)),
        # the learners' numerics (the env runners sample in float32); the bundle's weights are float32 either way
        "precision": cfg.algo.precision,
        "compile": cfg.algo.compile,
        "placement": placement,
        "checkpoint": str(out / "checkpoint" / "policy"),
        "time_split_s": {k: round(sum(h[k] for h in history), 2) for k in ("sim_s", "inference_s", "learn_s", "wait_s")}
        if history
        else None,
        "machine": machine_info(),
        "last": history[-1] if history else None,
        "runner_recoveries": [rec.to_dict() for rec in algo.recoveries],
    }


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
    """Score the current weights greedily on the run's training states (:mod:`embodied.eval.greedy_probe`):
    in the env runners' own envs where they can stand in for the evaluation's, else in as many new
    processes as the env runners, which wait meanwhile."""
    import policies
    from embodied.eval.greedy_probe import PROBE_POLICY, log_probe, probe_first_state, score_greedy

    start = time.perf_counter()
    first = probe_first_state(cfg.suite, cfg.init_pool)
    records = algo.greedy_episodes(tasks=tasks, states=cfg.greedy_states, first_state=first, seed=cfg.seed)
    where = "runners"
    if records is None:
        where = "own envs"
        policy.load_state_dict(algo.policy_state())
        policies.save(policy, out / PROBE_POLICY, extra={"iteration": iteration})
        records = score_greedy(
            out / PROBE_POLICY,
            suite=cfg.suite,
            tasks=tasks,
            states=cfg.greedy_states,
            first_state=first,
            num_envs=cfg.num_envs,
            image_size=cfg.image_size,
            seed=cfg.seed,
            workers=max(1, cfg.runtime.num_env_runners),
        )
    tqdm.write(f"greedy probe at iteration {iteration}: {len(records)} episodes in the {where}")
    return log_probe(out, iteration, records) | {"greedy_s": time.perf_counter() - start}


@hydra_app("embodied-train", "train")
def main(cfg: Any) -> None:
    from embodied.rllib.recovery import RunnerLostError
    from policies import CheckpointError, SpecMismatchError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        config: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # checks TrainConfig's own fields
        summary = train(config)
    except (TrainError, CheckpointError, SpecMismatchError, FileNotFoundError, RunnerLostError) as err:
        raise SystemExit(f"embodied-train: {err}") from None
    print(
        f"{summary['algo']}: {summary['iterations']} iterations, {summary['env_steps']} env steps in "
        f"{summary['wall_s']} s; bundle {summary['checkpoint']}"
    )


if __name__ == "__main__":
    main()
