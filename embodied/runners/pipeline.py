"""``embodied-pipeline``: the main job on the embedded default (MuJoCo on CPU).

    embodied-pipeline out=runs/pipeline                   # the default: under 20 min on 2 cores
    embodied-pipeline out=runs/p3 tasks=[2,8,9]           # three goal tasks
    embodied-pipeline out=runs/p2 tasks=null sim.suite=spatial sft.steps=4000 rl.iterations=400
    embodied-pipeline out=runs/lr3 init_from=runs/pipeline rl.algo.lr=3e-5  # another RL, the same SFT start
    embodied-pipeline out=runs/long init_from=runs/pipeline continue_rl=true rl.iterations=80  # RL carried on

Stages, each in its own sub-folder of ``out`` (a rerun of the same command skips finished stages
and resumes an interrupted SFT or RL stage from its last checkpoint):

1. ``collect``: the suite's scripted experts write a LeRobot v3.0 dataset (``data/``).
2. ``sft``: a flow VLA is fine-tuned on those few demonstrations (``sft/``).
3. ``eval_sft``: the SFT policy on the fixed protocol (initial states 0..episodes-1 per task),
   ``eval.attempts`` episodes per state (attempt 0 is the protocol's; the others add pass@k).
4. ``rl``: Flow-SDE PPO on Ray RLlib in parallel envs, from the SFT bundle (``rl/``).
5. ``eval_rl``: the RL policy on the same protocol, compared with the SFT one (Newcombe intervals
   on the protocol's episodes; paired over the states with every attempt counted).
6. with ``rl.control=true``, ``rl_control`` and ``eval_control``: the frozen-actor control, the same
   RL run (seeds, envs, sampling, critic) with ``algo.lr=0``, and its evaluation; the report then
   shows RL against it (paired over the states), which separates what the updates did from what
   the evaluation's sampling noise and the critic-only updates do.

Outputs in ``out``: ``results.json`` (every stage), ``report.md`` (tables with 95% intervals, the
plot ``plots/pipeline.png`` of success before/after RL and the RL learning curve, links to the
videos), ``videos/collect.mp4`` and each evaluation's failure/success videos.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import MISSING, OmegaConf

from embodied.config import SimConfig, hydra_app, register_policy_schemas, store
from embodied.runners.train import AlgoConfig, RuntimeConfig, TrainConfig, runtime_problem
from embodied.runs import (config_differences, cpu_summary, machine_info, prepare_run_dir, same_config,
                          without_added_defaults, write_json)
from embodied.video import VideoWriter, annotate_frame, count_frames

STAGES = ("collect", "sft", "eval_sft", "rl", "eval_rl")
CONTROL_STAGES = ("rl_control", "eval_control")  # added by rl.control=true
#: with rl.init_states=protocol every evaluation is repeated on held-out states (first_state 50), the
#: RL ones compared with the SFT one there too
HELDOUT_STAGES = {"eval_sft": "eval_sft_heldout", "eval_rl": "eval_rl_heldout", "eval_control": "eval_control_heldout"}
#: the folder whose policy each evaluation stage scores, and the stage it needs first
EVAL_STAGES = {"eval_sft": ("sft/ckpt", "sft"), "eval_rl": ("rl/checkpoint/policy", "rl"),
               "eval_control": ("rl_control/checkpoint/policy", "rl_control")}
#: the stages ``init_from=`` copies (everything before RL), and the folders each wrote in the run folder
INIT_STAGES = {"collect": ("data", "videos/collect.mp4"), "sft": ("sft",), "eval_sft": ("eval_sft",),
               "eval_sft_heldout": ("eval_sft_heldout",)}
#: what ``continue_rl=true`` copies besides: the frozen-actor control (its policy and metrics, not its Ray
#: session) and its evaluations. Its actor never moves (``algo.lr=0``): its policy is the same at any count
CONTROL_COPY_STAGES = {"rl_control": ("rl_control/checkpoint/policy", "rl_control/metrics.csv", "rl_control/train.json"),
                       "eval_control": ("eval_control",), "eval_control_heldout": ("eval_control_heldout",)}


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
    max_episode_steps: Optional[int] = TrainConfig.max_episode_steps  # training step limit (evaluation keeps the task's)
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


#: ``rl.*`` keys of the layout before ``rl.algo`` / ``rl.runtime`` were embodied-train's groups, and where
#: each went; the old keys still work for one release, with a deprecation message
MOVED_RL_KEYS = {"rl.lr": "rl.algo.lr", "rl.critic_warmup": "rl.algo.critic_warmup", "rl.critic": "rl.algo.critic",
                 "rl.overlap": "rl.runtime.overlap", "rl.env_runners": "rl.runtime.num_env_runners",
                 "rl.algo": "algo@rl.algo"}


def moved_rl_override(key: str, value: str) -> list[str]:
    """The overrides that replace ``key=value`` of the old ``rl`` layout (:data:`MOVED_RL_KEYS`):
    ``rl.env_runners=0`` also selects ``runtime@rl.runtime=local``, as the old key meant."""
    new = [f"{MOVED_RL_KEYS[key]}={value}"]
    if key == "rl.env_runners":
        new.insert(0, f"runtime@rl.runtime={'local' if value.strip() == '0' else 'cluster'}")
    return new


def upgrade_config(c: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` config of the old ``rl`` layout (``rl.lr``, ``rl.algo`` a name, ...) in the
    current one, so that run folders made before still resume: the old pipeline built the algorithm
    from :class:`AlgoConfig`'s defaults plus those keys and the runtime from ``rl.env_runners``."""
    rl = c.get("rl")
    if not isinstance(rl, dict) or isinstance(rl.get("algo"), dict):
        return c
    rl = dict(rl)
    algo = AlgoConfig(name=rl.pop("algo", AlgoConfig.name), lr=rl.pop("lr", AlgoConfig.lr),
                      critic_warmup=rl.pop("critic_warmup", AlgoConfig.critic_warmup),
                      critic=rl.pop("critic", AlgoConfig.critic))
    runners = rl.pop("env_runners", 0)
    runtime = RuntimeConfig(name="cluster" if runners else "local", num_env_runners=runners,
                            overlap=rl.pop("overlap", False))
    return {**c, "rl": {"algo": asdict(algo), "runtime": asdict(runtime), **rl}}


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
    action_noise: float = 0.0  # DART: std of noise on the experts' executed arm actions (their clean action is recorded)
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


store("pipeline_schema", PipelineConfig)
register_policy_schemas()


class PipelineError(ValueError):
    """A configuration the pipeline cannot run; printed as one line."""


def _tasks(cfg: PipelineConfig) -> list[int]:
    import sims

    n = len(sims.suites.tasks(cfg.sim.suite))
    tasks = list(range(n)) if cfg.tasks is None else list(cfg.tasks)
    if not tasks or any(not 0 <= t < n for t in tasks):
        raise PipelineError(f"tasks {cfg.tasks} out of range for suite {cfg.sim.suite!r} (0..{n - 1})")
    return tasks


def check_config(cfg: PipelineConfig) -> None:
    import sims
    from embodied.data.collect import check_action_noise
    from embodied.algorithms.batch import TRUNCATION
    from embodied.algorithms.critic import CRITICS

    choices = sims.suites.names() + sims.suites.libero_names()
    if cfg.sim.suite is None or cfg.sim.suite not in choices:
        raise PipelineError(f"unknown suite {cfg.sim.suite!r}; set sim.suite to one of {choices}")
    unknown = [s for s in cfg.stages if s not in STAGES + CONTROL_STAGES]
    if unknown:
        raise PipelineError(f"unknown stage(s) {unknown}; stages are {list(STAGES + CONTROL_STAGES)}")
    try:
        check_action_noise(cfg.action_noise)
    except ValueError as err:
        raise PipelineError(str(err)) from None
    if cfg.video_tasks > 0 and not cfg.sim.cameras:
        raise PipelineError("video_tasks > 0 needs cameras: set sim.cameras=[agentview,wrist] or video_tasks=0")
    family = cfg.policy.get("family") if isinstance(cfg.policy, dict) else getattr(cfg.policy, "family", None)
    if any(s in cfg.stages for s in ("sft", "rl")) and family != "flow":
        raise PipelineError(f"the pipeline fine-tunes a flow VLA with Flow-SDE/Flow-Noise: use policy=flow "
                            f"(got {family}); token VLAs train with embodied-sft + embodied-train algo=ppo|grpo")
    if cfg.rl.algo.name not in ("flow_sde", "flow_sde_full", "flow_noise"):
        raise PipelineError(f"rl.algo.name={cfg.rl.algo.name!r}: the pipeline's flow VLA trains with "
                            "algo@rl.algo=flow_sde, flow_sde_full or flow_noise")
    if cfg.continue_rl and not cfg.init_from:
        raise PipelineError("continue_rl=true carries another run's RL on: name that run with init_from=RUN")
    if cfg.eval.attempts < 1:
        raise PipelineError(f"eval.attempts={cfg.eval.attempts}: every initial state needs at least 1 episode")
    if cfg.rl.truncation not in TRUNCATION:
        raise PipelineError(f"rl.truncation={cfg.rl.truncation!r}: choose {' or '.join(TRUNCATION)}")
    from embodied.rllib.env_runner import INIT_POOLS

    if cfg.rl.init_states not in INIT_POOLS:
        raise PipelineError(f"rl.init_states={cfg.rl.init_states!r}: choose {' or '.join(INIT_POOLS)}")
    if cfg.rl.algo.critic not in CRITICS:
        raise PipelineError(f"rl.algo.critic={cfg.rl.algo.critic!r}: choose one of {', '.join(CRITICS)}")
    if cfg.eval.workers < 1:
        raise PipelineError(f"eval.workers={cfg.eval.workers} must be >= 1 (processes sharing the evaluation)")
    if cfg.eval.heldout_episodes < 0:
        raise PipelineError(f"eval.heldout_episodes={cfg.eval.heldout_episodes} must be >= 0 (0: no held-out "
                            "evaluation)")
    runtime = cfg.rl.runtime
    problem = runtime_problem(runtime, "rl.runtime")
    if problem:
        raise PipelineError(problem)
    if runtime.num_env_runners and cfg.rl.num_envs % runtime.num_env_runners:
        raise PipelineError(f"rl.num_envs={cfg.rl.num_envs} is split evenly between rl.runtime.num_env_runners="
                            f"{runtime.num_env_runners}: choose a runner count that divides it")
    if not 0 <= cfg.rl.algo.critic_warmup < cfg.rl.iterations:
        raise PipelineError(f"rl.algo.critic_warmup={cfg.rl.algo.critic_warmup} must lie in 0..rl.iterations-1 "
                            f"({cfg.rl.iterations - 1}): the actor learns after the warm-up")
    _tasks(cfg)


def stage_collect(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    """Collect demonstrations on ``cfg.sim.suite``; returns the stage's results."""
    import sims
    from embodied.data.collect import collect_suite

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

    if (out / "data").exists():  # an interrupted collection: start it again
        import shutil

        shutil.rmtree(out / "data")
    try:
        result = collect_suite(
            cfg.sim.suite, out / "data", episodes_per_task=cfg.episodes_per_task, task_ids=_tasks(cfg),
            num_envs=cfg.sim.num_envs, cameras=cfg.sim.cameras, image_size=cfg.sim.image_size, seed=cfg.seed,
            num_threads=cfg.sim.num_threads or None, on_episode=film, expert_gain=cfg.expert_gain,
            action_noise=cfg.action_noise,
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


def stage_sft(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    from embodied.runners.sft import SFTConfig
    from embodied.runners.sft import train as sft_train

    s = cfg.sft
    resume = (out / "sft" / "ckpt" / "config.json").is_file() and (out / "sft" / "train_state").is_dir()
    summary = sft_train(SFTConfig(data=str(out / "data"), out=str(out / "sft"), policy=cfg.policy, steps=s.steps,
                                  batch_size=s.batch_size, lr=s.lr, warmup_steps=s.warmup_steps,
                                  save_every=s.save_every, augment_shift=s.augment_shift, seed=cfg.seed,
                                  threads=s.threads, resume=resume))
    return {k: summary[k] for k in ("family", "episodes", "samples", "steps", "final_loss", "train_seconds",
                                    "parameters")} | {"checkpoint": "sft/ckpt"}


def stage_eval(cfg: PipelineConfig, out: Path, name: str, checkpoint: Path, compare: Path | None,
               heldout: bool = False) -> dict[str, Any]:
    """An evaluation stage in ``out/name``: the protocol's states, or with ``heldout`` the suite's held-out
    states (:func:`sims.suites.heldout_states`: from state 50, real LIBERO's the sampled ones), at most
    ``eval.heldout_episodes`` per task."""
    import sims
    from embodied.runners.eval import EvalConfig, run

    e = cfg.eval
    first, count = sims.suites.heldout_states(cfg.sim.suite) if heldout else (0, e.episodes)
    res = run(EvalConfig(out=str(out / name), checkpoint=str(checkpoint), suite=cfg.sim.suite, tasks=_tasks(cfg),
                         episodes=min(e.heldout_episodes, count) if heldout else e.episodes,
                         first_state=first,
                         num_envs=e.num_envs, image_size=cfg.sim.image_size, seed=cfg.seed,
                         attempts=e.attempts, workers=e.workers,
                         videos=e.videos, video_max=e.video_max, max_steps=e.max_steps,
                         compare=str(compare) if compare is not None else None))
    suite = res["suites"][cfg.sim.suite]
    pooled_k = sum(t["successes"] for t in suite["tasks"])
    return {"success_rate": suite["success_rate"], "episodes": suite["episodes"], "successes": pooled_k,
            "ci95": suite["ci95"], "tasks": suite["tasks"], "wall_s": res["wall_s"], "env_steps": res["env_steps"],
            "videos": [f"{name}/{v}" for v in res["videos"]], "report": f"{name}/report.md",
            "comparison": res.get("comparison", {}).get(cfg.sim.suite), "pass_at_k": suite.get("pass_at_k")}


def stage_rl(cfg: PipelineConfig, out: Path, name: str = "rl", control: bool = False) -> dict[str, Any]:
    """The RL stage in ``out/name``; ``control``: the frozen-actor control (``algo.lr=0``, all else equal)."""
    from dataclasses import replace

    from embodied.runners.train import train as rl_train
    from embodied.train_state import resolve_folder

    r = cfg.rl
    resume = resolve_folder(out / name / "checkpoint") is not None
    algo = replace(r.algo, lr=0.0) if control else r.algo
    summary = rl_train(TrainConfig(
        out=str(out / name), init=str(out / "sft" / "ckpt"), algo=algo, runtime=r.runtime,
        suite=cfg.sim.suite, tasks=_tasks(cfg), num_envs=r.num_envs // max(r.runtime.num_env_runners, 1),
        image_size=cfg.sim.image_size,
        iterations=r.iterations, chunks_per_iter=r.chunks_per_iter, max_episode_steps=r.max_episode_steps,
        truncation=r.truncation, reward_type=r.reward_type, save_every=r.save_every,
        greedy_every=r.greedy_every, greedy_states=r.greedy_states,
        seed=cfg.seed if r.seed is None else r.seed, resume=resume,
        init_pool=r.init_states))
    return {k: summary[k] for k in ("algo", "iterations", "env_steps", "wall_s", "env_steps_per_s", "time_split_s")} \
        | {"checkpoint": f"{name}/checkpoint/policy", "metrics": f"{name}/metrics.csv", "control": control,
           "init_states": r.init_states,
           "updates": update_diagnostics(out / name / "metrics.csv")}


def update_diagnostics(metrics: Path) -> dict[str, float]:
    """Medians over the iterations that updated the actor of what says whether the updates stayed near
    the sampling policy (first-minibatch approx KL and clip fraction, the largest policy lag, early
    stops) and whether the critic, advantages and gradients carried signal (explained variance, advantage
    std, the cosine between the first two minibatches' actor gradients)."""
    from embodied.runs import read_complete_rows

    _, rows = read_complete_rows(metrics, "iteration")
    rows = [r for r in rows if r.get("actor_updated") == "1"]
    if not rows:
        return {}

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]

    med = {k: round(float(np.median(col(k))), 4) for k in ("approx_kl_first", "clip_fraction_first", "approx_kl",
                                                           "clip_fraction", "explained_variance", "advantage_std",
                                                           "grad_cos_first")
           if col(k)}
    return med | {"policy_lag_max": max(col("policy_lag"), default=0.0), "kl_stops": int(sum(col("kl_stop"))),
                  "actor_iterations": len(rows)}


def rl_against_control(out: Path, suite: str, heldout: bool = False) -> dict[str, Any] | None:
    """RL - frozen control per task and paired over the states, from the two evaluations' results
    (``heldout``: of the held-out evaluations)."""
    import json

    from embodied.eval.report import compare

    tail = "_heldout" if heldout else ""
    rl, control = out / f"eval_rl{tail}" / "results.json", out / f"eval_control{tail}" / "results.json"
    if not (rl.is_file() and control.is_file()):
        return None
    return compare(json.loads(rl.read_text())["suites"], json.loads(control.read_text())).get(suite)


def plot_pipeline(results: dict[str, Any], out: Path) -> Path | None:
    """Success before/after RL per task (95% intervals) and the RL training curve."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = results.get("eval_sft"), results.get("eval_rl")
    if before is None and after is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    width = 0.38
    for shift, res, label, color in ((-width / 2, before, "SFT", "#9ecae9"), (width / 2, after, "SFT + RL", "#4c78a8")):
        if res is None:
            continue
        rows = res["tasks"]
        rates = np.array([t["success_rate"] for t in rows])
        err = [rates - np.array([t["ci95"][0] for t in rows]), np.array([t["ci95"][1] for t in rows]) - rates]
        ax.bar(np.arange(len(rows)) + shift, rates, width, yerr=err, capsize=3, color=color,
               label=f"{label}: {res['success_rate']:.0%}")
        ax.set_xticks(np.arange(len(rows)))
        ax.set_xticklabels([t["name"].replace("_", " ")[:22] for t in rows], rotation=15, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson interval)")
    ax.set_title("fixed protocol: before and after RL")
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    metrics = out / "rl" / "metrics.csv"
    if metrics.exists():
        rows = [r for r in csv.DictReader(open(metrics)) if r["success_rate"] not in ("", "nan")]
        if rows:
            steps = np.array([float(r["env_steps"]) for r in rows])
            succ = np.array([float(r["success_rate"]) for r in rows])
            k = min(10, len(succ))
            smooth = np.convolve(succ, np.ones(k) / k, mode="valid")
            ax.plot(steps, succ, color="#c6dbef", label="per iteration")
            ax.plot(steps[k - 1:], smooth, color="#08519c", label=f"mean of {k}")
            ax.set_xlabel("env steps")
            ax.set_ylabel("training success (exploring)")
            ax.set_ylim(0, 1.05)
            ax.legend(loc="lower right")
            ax.grid(alpha=0.3)
    ax.set_title("RL: episodes ending in success during training")
    fig.tight_layout()
    path = out / "plots" / "pipeline.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def heldout_section(results: dict[str, Any]) -> list[str]:
    """Report lines on the held-out states (states neither the demonstrations nor RL started from)."""
    from embodied.eval.report import paired_text

    rows = [(label, results.get(key)) for label, key in (("SFT", "eval_sft_heldout"), ("SFT + RL", "eval_rl_heldout"),
                                                         ("frozen control", "eval_control_heldout"))]
    rows = [(label, res) for label, res in rows if res]
    if not rows:
        return []
    lines = ["### Held-out initial states", "",
             "The same policies on initial states neither the demonstrations nor RL started from "
             "(`sims.suites.heldout_states`):", "",
             "| policy | success | episodes | 95% CI | pass@1..K |", "|---|---|---|---|---|"]
    for label, res in rows:
        passk = ", ".join(f"{p:.0%}" for p in res["pass_at_k"]) if res.get("pass_at_k") else "-"
        lines.append(f"| {label} | **{res['success_rate']:.1%}** | {res['episodes']} | "
                     f"[{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}] | {passk} |")
    lines.append("")
    paired = ((results.get("eval_rl_heldout") or {}).get("comparison") or {}).get("paired")
    if paired:
        lines += [f"Paired over the {paired['states']} held-out states, RL - SFT: "
                  f"{paired_text(paired, 'SFT ', 'SFT + RL ')}.", ""]
    vs = (results.get("rl_vs_control_heldout") or {}).get("paired")
    if vs:
        lines += [f"Paired over the {vs['states']} held-out states, RL - control: "
                  f"{paired_text(vs, 'control ', 'SFT + RL ')}.", ""]
    return lines


def write_report(results: dict[str, Any], out: Path) -> Path:
    """``report.md``: what the run did, stage by stage."""
    cfg = results["config"]
    lines = [f"# Pipeline run: suite `{cfg['sim']['suite']}`, tasks {results.get('tasks')}", ""]
    start = results.get("init_from")
    if start:
        lines += [f"Stages {', '.join(start['stages'])} were copied from the run `{start['run']}` "
                  "(`init_from=`: the same configuration except `rl.*`); their figures and times are that run's."]
        if start.get("rl_from_iteration") is not None:
            lines += [f"RL carried that run's RL on from its iteration {start['rl_from_iteration']} "
                      "(`continue_rl=true`: its checkpoint and metrics, then this run's `rl.*` settings)."]
        lines += [""]
    c = results.get("collect")
    if c:
        lines += ["## 1. Demonstrations from the scripted experts", "",
                  f"{c['episodes']} episodes, {c['frames']} frames in {c['wall_s']:.1f} s "
                  f"({c['frames_per_s']:.0f} frames/s with rendering), dataset `{c['dataset']}` (LeRobot v3.0 layout). "
                  f"Mean expert success: **{c['expert_success_rate']:.1%}**.", "",
                  "| task | instruction | success | attempts | kept |", "|---|---|---|---|---|"]
        for t in c["tasks"]:
            lines.append(f"| {t['task']} {t['name']} | {t['instruction']} | {t['success_rate']:.0%} | "
                         f"{t['attempts']} | {t['episodes']} |")
        lines.append("")
        if c["video"]:
            lines += [f"Video: [{c['video']}]({c['video']}) ({c['video_frames']} frames)", ""]
    s = results.get("sft")
    if s:
        lines += ["## 2. Supervised fine-tuning", "",
                  f"{s['family']} VLA ({s['parameters']:,} parameters), {s['steps']} steps on {s['episodes']} "
                  f"demonstrations ({s['samples']} chunks) in {s['train_seconds']:.0f} s, final loss "
                  f"{s['final_loss']:.4f}; bundle `{s['checkpoint']}`.", ""]
    rl = results.get("rl")
    if rl:
        split = rl.get("time_split_s") or {}
        lines += ["## 3. Online RL", "",
                  f"{rl['algo']} for {rl['iterations']} iterations: {rl['env_steps']:,} env steps in {rl['wall_s']:.0f} s "
                  f"({rl['env_steps_per_s']} env-steps/s in the training loop)."
                  + (f" Time split: the sampler spent {split['sim_s']:.0f} s simulating and {split['inference_s']:.0f} s "
                     f"in inference, the learner {split['learn_s']:.0f} s; the driver waited {split['wait_s']:.0f} s "
                     "for samples (the sampling that learning did not hide)." if split else "")
                  + f" Metrics `{rl['metrics']}`, bundle `{rl['checkpoint']}`."
                  + (" Trained on the evaluation's own 50 initial states per task (rl.init_states=protocol): "
                     "the evaluation below scores states RL has seen." if rl.get("init_states") == "protocol" else
                     (" Trained on LIBERO's states 25..49 (rl.init_states=random): the protocol's evaluation below "
                      "includes them, the held-out one (states 50..99, sampled by LIBERO's placement initializer) "
                      "does not." if str(results.get("config", {}).get("sim", {}).get("suite", "")).startswith("libero_") else
                      " Trained on other initial states than the evaluation's (rl.init_states=random): the "
                      "evaluation below is held out.")), ""]
        u = rl.get("updates") or {}
        if u:
            lines += [f"Updates (medians over the {u['actor_iterations']} iterations that trained the actor): approx KL "
                      f"at the first minibatch {u.get('approx_kl_first', 0):.4f} (mean over all "
                      f"{u.get('approx_kl', 0):.4f}), clip fraction {u.get('clip_fraction_first', 0):.2f} first / "
                      f"{u.get('clip_fraction', 0):.2f} all, explained variance {u.get('explained_variance', 0):.2f}, "
                      f"advantage std {u.get('advantage_std', 0):.3f}; largest policy lag {u['policy_lag_max']:.0f}, "
                      f"{u['kl_stops']} early stops at the KL target.", ""]
    before, after = results.get("eval_sft"), results.get("eval_rl")
    attempts = cfg["eval"].get("attempts", 1)
    if before or after:
        lines += ["## 4. Evaluation on the fixed protocol", "",
                  f"{cfg['eval']['episodes']} fixed initial states per task"
                  + (f", {attempts} episodes each with other sampling noise (the first is the protocol's)"
                     if attempts > 1 else "")
                  + ", greedy policy, the task's own step limit.",
                  "", "![pipeline](plots/pipeline.png)", "",
                  "| policy | success | episodes | 95% CI |", "|---|---|---|---|"]
        for label, res in (("SFT", before), ("SFT + RL", after)):
            if res:
                lines.append(f"| {label} | **{res['success_rate']:.1%}** | {res['episodes']} | "
                             f"[{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}] |")
        lines.append("")
        curves = [(label, res["pass_at_k"]) for label, res in (("SFT", before), ("SFT + RL", after))
                  if res and res.get("pass_at_k")]
        if curves:
            lines += ["The table is each state's first episode (the protocol's). Over every attempt, pass@1..K "
                      "(the chance that one of k attempts at a state succeeds): "
                      + "; ".join(f"{label} " + ", ".join(f"{p:.0%}" for p in c) for label, c in curves) + ".", ""]
        if before and after:
            from embodied.eval.report import paired_text
            from embodied.eval.stats import difference_interval

            d, lo, hi = difference_interval(after["successes"], after["episodes"], before["successes"],
                                            before["episodes"])
            lines += [f"RL - SFT: **{d:+.1%}**, 95% interval [{lo:+.3f}, {hi:+.3f}] (Newcombe)"
                      + (" - the interval excludes 0." if lo > 0 or hi < 0 else "."), ""]
            cmp = after.get("comparison") or {}
            paired = cmp.get("paired")
            if paired:
                lines += [f"Paired over the {paired['states']} initial states ({attempts} episode"
                          f"{'s' if attempts > 1 else ''} per state and policy, every attempt counted), RL - SFT: "
                          f"{paired_text(paired, 'SFT ', 'SFT + RL ')}.", ""]
            if cmp.get("tasks"):
                lines += ["| task | SFT | SFT + RL | difference | 95% CI | paired difference | 95% CI |",
                          "|---|---|---|---|---|---|---|"]
                for r in cmp["tasks"]:
                    pr = r.get("paired")
                    cells = (f"{pr['difference']:+.1%} | [{pr['ci95'][0]:+.2f}, {pr['ci95'][1]:+.2f}]" if pr
                             else "- | -")
                    lines.append(f"| {r['name']} | {r['before']:.0%} | {r['now']:.0%} | {r['difference']:+.0%} | "
                                 f"[{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | {cells} |")
                lines.append("")
        control, vs = results.get("eval_control"), results.get("rl_vs_control") or {}
        if control:
            ran = (results.get("rl_control") or {}).get("iterations")
            if ran is not None and ran != (results.get("rl") or {}).get("iterations"):
                lines += [f"The control ran {ran} iterations (its actor frozen, the same policy at any count; "
                          "copied with `continue_rl=true`)."]
            lines += [f"Frozen-actor control (the same RL run with algo.lr=0): **{control['success_rate']:.1%}** "
                      f"[{control['ci95'][0]:.2f}, {control['ci95'][1]:.2f}]"
                      + (", pass@1..K " + ", ".join(f"{p:.0%}" for p in control["pass_at_k"])
                         if control.get("pass_at_k") else "") + ".", ""]
            if vs.get("paired"):
                from embodied.eval.report import paired_text

                lines += [f"Paired over the {vs['paired']['states']} initial states, RL - control: "
                          f"{paired_text(vs['paired'], 'control ', 'SFT + RL ')}.", ""]
        lines += heldout_section(results)
        vids = (before or {}).get("videos", []) + (after or {}).get("videos", [])
        if vids:
            lines += ["Videos:", ""] + [f"- [{v}]({v})" for v in vids] + [""]
    lines += ["## Time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in results.get("stage_seconds", {}).items()]
    m = results["machine"]
    lines += ["", f"Machine: {m['platform']}, {cpu_summary(m)}, torch {m['torch']}, numpy {m.get('numpy')}, "
              f"mujoco {m['mujoco']}, GL {m['mujoco_gl']}", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _identity(c: dict[str, Any]) -> dict[str, Any]:
    """What makes two pipeline configs the same run: stages and rl.control only choose what runs (a run
    may go on with more stages), eval.workers and rl.runtime.learner_threads change the wall time (the
    learner's threads also the rounding of its sums) and init_from / continue_rl where the first stages
    came from, not the episodes."""
    kept = {k: v for k, v in c.items() if k not in ("stages", "init_from", "continue_rl")}
    rl = {k: v for k, v in c.get("rl", {}).items() if k != "control"}
    if isinstance(rl.get("runtime"), dict):
        rl["runtime"] = {k: v for k, v in rl["runtime"].items() if k != "learner_threads"}
    return {**kept, "rl": rl, "eval": {k: v for k, v in c.get("eval", {}).items() if k != "workers"}}


def pipeline_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults of the fields :func:`~embodied.runs.config_defaults` cannot see in :class:`PipelineConfig`:
    the policy group's, from its family's config class."""
    import policies

    family = (config.get("policy") or {}).get("family")
    try:
        return {"policy": {**asdict(policies.config_class(family)()), "family": family}} if family else {}
    except (ImportError, KeyError, TypeError, ValueError):  # an unknown family: no defaults to add
        return {}


def start_from_run(source: Path, out: Path, config: dict[str, Any], continue_rl: bool = False) -> dict[str, Any]:
    """The results of a new run folder ``out`` that starts from the run folder ``source``: its finished
    stages of :data:`INIT_STAGES` with their folders copied into ``out``. ``source``'s configuration must
    equal ``config`` except for ``rl``, ``out`` (and what :func:`_identity` ignores). ``continue_rl``:
    also its RL checkpoint and metrics, so that this run's RL stage resumes from there, and its finished
    stages of :data:`CONTROL_COPY_STAGES`."""
    import json
    import shutil

    path = source / "results.json"
    if not path.is_file():
        raise PipelineError(f"init_from={source}: no pipeline run there ({path} is missing)")
    theirs = json.loads(path.read_text())

    def before_rl(c: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in _identity(c).items() if k not in ("rl", "out")}

    stored = before_rl(upgrade_config(theirs.get("config") or {}))
    # a field added after that run was made matches while it keeps its default (as in same_config)
    mine = without_added_defaults(stored, before_rl(config), pipeline_defaults(config))
    diff = config_differences(stored, mine)
    if diff:
        raise PipelineError(f"init_from={source}: that run's configuration differs from this one in "
                            f"{', '.join(diff)}; only rl.*, out and stages may differ")
    copied = [s for s in INIT_STAGES if s in theirs.get("stages_done", [])]
    if not copied:
        raise PipelineError(f"init_from={source}: that run finished none of {list(INIT_STAGES)}")
    rl_from = _rl_to_continue(source, config["rl"]["iterations"]) if continue_rl else None
    if continue_rl:
        copied += [s for s in CONTROL_COPY_STAGES if s in theirs.get("stages_done", [])]
    folders = {**INIT_STAGES, **CONTROL_COPY_STAGES}
    for stage in copied:
        for rel in folders[stage]:
            src, dst = source / rel, out / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            elif src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    start: dict[str, Any] = {"run": str(source), "stages": list(copied)}
    if rl_from is not None:
        checkpoint, start["rl_from_iteration"] = rl_from
        shutil.copytree(checkpoint, out / "rl" / "checkpoint")
        shutil.copy2(source / "rl" / "metrics.csv", out / "rl" / "metrics.csv")
    seconds = theirs.get("stage_seconds", {})
    return {**{s: theirs[s] for s in copied if s in theirs}, "stages_done": copied,
            "stage_seconds": {s: seconds[s] for s in copied if s in seconds}, "init_from": start}


def _rl_to_continue(source: Path, iterations: int) -> tuple[Path, int]:
    """``source``'s last RL checkpoint folder and its iteration, which must lie below ``iterations``."""
    from embodied.rllib.checkpoint import resumable
    from embodied.train_state import saved_step

    checkpoint = resumable(source / "rl")
    if checkpoint is None or not (source / "rl" / "metrics.csv").is_file():
        raise PipelineError(f"init_from={source} continue_rl=true: that run holds no RL checkpoint to carry on "
                            f"({source / 'rl' / 'checkpoint'})")
    step = saved_step(checkpoint / "train_state")
    if step >= iterations:
        raise PipelineError(f"init_from={source} continue_rl=true: its RL is at iteration {step} already; "
                            f"set rl.iterations above {step}")
    return checkpoint, step


def run(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the configured stages (skipping ones a previous run of this folder finished)."""
    import json

    check_config(cfg)
    out = prepare_run_dir(cfg.out)
    path = out / "results.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    config = json.loads(json.dumps(asdict(cfg)))
    if cfg.init_from and not results.get("stages_done"):
        source = Path(cfg.init_from).expanduser().resolve()
        if source == out:
            raise PipelineError(f"init_from={cfg.init_from} is this run's own folder: name another run")
        results = {"config": config, **start_from_run(source, out, config, cfg.continue_rl)}
        rl_from = results["init_from"].get("rl_from_iteration")
        print(f"[pipeline] {', '.join(results['stages_done'])}: copied from {source}"
              + (f"; RL carried on from its iteration {rl_from}" if rl_from is not None else ""), flush=True)
        write_json(path, results)  # a run killed from here on resumes instead of copying again
    done = results.get("stages_done", [])
    stored = results.get("config")
    if done and not same_config(_identity(upgrade_config(stored)) if stored else None, _identity(config),
                                PipelineConfig, pipeline_defaults(config)):
        raise PipelineError(f"{out} holds a pipeline run with another configuration: choose a new out=..., or "
                            "repeat the original command to resume it")
    results.update(config=config, tasks=_tasks(cfg), stages_done=done)
    results.setdefault("stage_seconds", {})
    stages = list(cfg.stages) + [s for s in CONTROL_STAGES if cfg.rl.control and s not in cfg.stages]
    import sims

    # held out: ours, the 50 states after the protocol's (worth scoring when RL trains on the protocol's);
    # real LIBERO, the 50 its placement initializer sampled (50..99), which neither init pool trains on
    if cfg.eval.heldout_episodes and (sims.suites.is_libero(cfg.sim.suite) or cfg.rl.init_states == "protocol"):
        stages = [x for s in stages for x in ((s, HELDOUT_STAGES[s]) if s in HELDOUT_STAGES else (s,))]
    for stage in stages:
        if stage in done:
            print(f"[pipeline] {stage}: done in a previous run, skipped")
            continue
        base = next((k for k, v in HELDOUT_STAGES.items() if v == stage), stage)
        needs = {"sft": ["collect"], "rl": ["sft"], "rl_control": ["sft"]}.get(stage, [])
        if base in EVAL_STAGES:
            needs = [EVAL_STAGES[base][1]]
        for need in needs:
            if need not in results["stages_done"]:
                raise PipelineError(f"stage {stage} needs stage {need} first (add it to stages=...)")
        print(f"[pipeline] {stage} ...", flush=True)
        t0 = time.perf_counter()
        if stage == "collect":
            results[stage] = stage_collect(cfg, out)
        elif stage == "sft":
            results[stage] = stage_sft(cfg, out)
        elif stage == "rl":
            results[stage] = stage_rl(cfg, out)
        elif stage == "rl_control":
            results[stage] = stage_rl(cfg, out, "rl_control", control=True)
        else:  # an evaluation: the RL ones are compared with the SFT one on the same states
            heldout = stage != base
            before = HELDOUT_STAGES["eval_sft"] if heldout else "eval_sft"
            compare = out / before if base != "eval_sft" and before in results["stages_done"] else None
            results[stage] = stage_eval(cfg, out, stage, out / EVAL_STAGES[base][0], compare, heldout=heldout)
        results["stage_seconds"][stage] = round(time.perf_counter() - t0, 1)
        results["stages_done"].append(stage)
        results["machine"] = machine_info()
        write_json(path, results)
    results["machine"] = machine_info()
    for key, heldout in (("rl_vs_control", False), ("rl_vs_control_heldout", True)):
        vs_control = rl_against_control(out, cfg.sim.suite, heldout)
        if vs_control is not None:
            results[key] = vs_control
    plot_pipeline(results, out)
    write_json(path, results)
    write_report(results, out)
    return results


@hydra_app("embodied-pipeline", "pipeline", moved=(MOVED_RL_KEYS, moved_rl_override))
def main(cfg: Any) -> None:
    from policies import CheckpointError, SpecMismatchError

    from embodied.runners.eval import EvalError
    from embodied.runners.train import TrainError

    import torch

    # one torch thread unless told otherwise: the thread count changes the order of floating-point sums,
    # so the same job on a machine with another number of cores would train another SFT policy
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    config: PipelineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        results = run(config)
    except (PipelineError, TrainError, EvalError, CheckpointError, SpecMismatchError, FileNotFoundError) as err:
        raise SystemExit(f"embodied-pipeline: {err}") from None
    parts = [f"expert success {results['collect']['expert_success_rate']:.1%}" if "collect" in results else ""]
    for key, label in (("eval_sft", "SFT"), ("eval_rl", "SFT+RL")):
        if key in results:
            r = results[key]
            parts.append(f"{label} {r['success_rate']:.1%} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
    paired = (results.get("eval_rl", {}).get("comparison") or {}).get("paired")
    if paired:
        parts.append(f"RL - SFT {paired['difference']:+.1%} [{paired['ci95'][0]:+.3f}, {paired['ci95'][1]:+.3f}] "
                     f"paired over {paired['states']} states")
    print(f"{'; '.join(p for p in parts if p)} on {config.sim.suite} {results['tasks']}; "
          f"report: {Path(config.out) / 'report.md'}")


if __name__ == "__main__":
    main()
