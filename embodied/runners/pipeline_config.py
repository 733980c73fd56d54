"""``embodied-pipeline``'s configuration: one dataclass per part (``sft``, ``rl``, ``eval``) under
:class:`PipelineConfig`, the stage names a run may ask for, and the error a configuration raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf

from embodied.config import SimConfig
from embodied.runners.train import AlgoConfig, RuntimeConfig, TrainConfig

#: the stages a run may name in ``stages=``, in their default order, and those rl.control=true adds
STAGES = ("collect", "sft", "eval_sft", "rl", "eval_rl")
CONTROL_STAGES = ("rl_control", "eval_control")


class PipelineError(ValueError):
    """A configuration the pipeline cannot run; printed as one line."""


@dataclass
class PipelineSFTConfig:
    """Stage ``sft`` (see ``embodied-sft`` for the meaning of each field)."""

    steps: int = 700
    batch_size: int = 32
    lr: float = 3e-4
    warmup_steps: int = 100
    save_every: int = 250
    augment_shift: int = 0  # random image shift in pixels during SFT (0 = off)
    # torch threads of SFT (the stage runs alone): a fixed count, so the job trains the same policy on
    # machines with more cores (of one CPU type)
    threads: int = 2


@dataclass
class PipelineRLConfig:
    """Stage ``rl``: ``embodied-train`` from the SFT bundle. ``algo`` and ``runtime`` are embodied-train's
    config groups, composed from the same YAML (``algo@rl.algo=flow_noise``, ``rl.algo.lr=...``,
    ``runtime@rl.runtime=local``); the other fields are embodied-train's of the same name, except
    ``num_envs`` (here the envs in total) and ``init_states`` (embodied-train's ``init_pool``). The
    main job's values are in ``configs/pipeline.yaml``."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    iterations: int = TrainConfig.iterations
    # envs in total, split evenly between runtime.num_env_runners (renders run one per process, so 2
    # runners use both cores of a laptop while the learner waits)
    num_envs: int = TrainConfig.num_envs
    chunks_per_iter: int = TrainConfig.chunks_per_iter  # chunks per env per iteration
    max_episode_steps: Optional[int] = (
        TrainConfig.max_episode_steps
    )  # training step limit (evaluation keeps the task's)
    truncation: str = TrainConfig.truncation  # an episode ended by that limit: fail | bootstrap (see embodied-train)
    reward_type: str = TrainConfig.reward_type
    save_every: int = TrainConfig.save_every
    # score the greedy policy (what evaluation runs) on greedy_states training states per task every this many
    # iterations, beside the sampled policy's training success (embodied-train's greedy probe; 0: off)
    greedy_every: int = TrainConfig.greedy_every
    greedy_states: int = TrainConfig.greedy_states
    # where training episodes start: random (training states: the evaluation's 50 protocol states stay held out) |
    # protocol (on the 50 protocol states the evaluation scores, the LIBERO RL works' protocol)
    init_states: str = TrainConfig.init_pool
    # the RL stages' seed (sampling noise, env resets, minibatch order; null: the run's seed). With init_from,
    # several RL seeds over one SFT start; the evaluations keep the run's seed, so all see the same episodes
    seed: Optional[int] = None
    # the frozen-actor control: also run the same RL stage with algo.lr=0 and evaluate it (stages rl_control,
    # eval_control); the report compares RL with it
    control: bool = False


def rl_step_limit(suite: str) -> Optional[int]:
    """The main job's default RL step limit (``rl.max_episode_steps``) on ``suite``: 60 steps on our suites
    (the main job's measured setting), None (each task's own limit) on real LIBERO, whose expert episodes
    take 80-130 steps: 60 would end nearly every training episode as a failure."""
    import sims.suites

    return None if sims.suites.is_libero(suite) else 60


# configs/pipeline.yaml: rl.max_episode_steps: ${pipeline_rl_step_limit:${sim.suite}}
OmegaConf.register_new_resolver("pipeline_rl_step_limit", rl_step_limit, replace=True)


@dataclass
class PipelineEvalConfig:
    """Stages ``eval_sft`` and ``eval_rl``: the fixed protocol."""

    episodes: int = 50  # fixed initial states per task (the protocol's 50)
    # with rl.init_states=protocol, also evaluate every policy on this many held-out states per task
    # (states 50.., which neither the demonstrations nor RL saw; 0: off)
    heldout_episodes: int = 50
    # episodes per initial state, each with other sampling noise: attempt 0 is the protocol's (its success
    # rate and Newcombe interval); every attempt counts in pass@k and in the paired RL - SFT comparison over
    # the states (4: 200 episodes per policy on one task, so a gain shows beyond one draw of noise per state)
    attempts: int = 4
    num_envs: int = 25  # per worker
    # processes sharing the evaluation's waves (embodied-eval workers=K): the same episodes, sooner
    workers: int = 2
    videos: str = "all"  # failures | all | none
    video_max: int = 3
    # cut episodes at this many steps (null: the tasks' own limits; another value is not the protocol, for
    # quick checks, and the reports say so)
    max_steps: Optional[int] = None


@dataclass
class PipelineConfig:
    """Schema of ``embodied-pipeline``."""

    sim: SimConfig = field(default_factory=SimConfig)  # suite, envs for collection, cameras, image size
    policy: Any = MISSING  # config group policy/ (the flow VLA trained by SFT, then RL)
    out: str = "runs/pipeline"  # run folder: every output goes here
    tasks: Optional[list[int]] = None  # task subset of the suite (default: all)
    stages: list[str] = field(default_factory=lambda: list(STAGES))  # stages to run, in this order
    seed: int = 0
    episodes_per_task: int = 20  # demonstrations per task
    expert_gain: float = 1.0  # experts command this share of the remaining error per step (<1: smoother chunks)
    action_noise: float = (
        0.0  # DART: std of noise on the experts' executed arm actions (their clean action is recorded)
    )
    video_tasks: int = 3  # first demonstration of this many tasks goes into videos/collect.mp4
    sft: PipelineSFTConfig = field(default_factory=PipelineSFTConfig)
    rl: PipelineRLConfig = field(default_factory=PipelineRLConfig)
    eval: PipelineEvalConfig = field(default_factory=PipelineEvalConfig)
    # start a new run folder from another run's demonstrations, SFT policy and SFT evaluations (its
    # finished stages of INIT_STAGES, copied): that run's configuration must equal this one's except
    # for rl.*, out and stages (RL variants of one SFT start without repeating SFT)
    init_from: Optional[str] = None
    # with init_from: also carry that run's RL on from its last checkpoint (policy, critic, optimizer
    # states, metrics.csv) up to this run's rl.iterations, with this run's rl.* settings
    continue_rl: bool = False
    # where the SFT and RL stages send their scalars besides metrics.csv: tensorboard | wandb | both (W&B offline
    # without a configured key: embodied/metrics_log.py)
    logger: str = "tensorboard"
