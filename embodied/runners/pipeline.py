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
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from embodied.config import hydra_app, register_policy_schemas, store
from embodied.metrics_log import publish_media
from embodied.runners.pipeline_config import (
    CONTROL_STAGES,
    STAGES,
    PipelineConfig,
    PipelineError,
    PipelineEvalConfig,
    PipelineRLConfig,
    PipelineSFTConfig,
    rl_step_limit,
)
from embodied.runners.pipeline_report import plot_pipeline
from embodied.runners.pipeline_runs import (
    CONTROL_COPY_STAGES,
    INIT_STAGES,
    MOVED_RL_KEYS,
    moved_rl_override,
    pipeline_defaults,
    run_identity,
    start_from_run,
    upgrade_config,
)
from embodied.runners.pipeline_stages import (
    PIPELINE_STAGES,
    plan,
    rl_against_control,
    stage_collect,
    stage_eval,
    stage_rl,
    stage_sft,
    task_ids,
    write_report,
)
from embodied.runners.train import runtime_problem
from embodied.runs import machine_info, prepare_run_dir, same_config, write_json

store("pipeline_schema", PipelineConfig)
register_policy_schemas()


def check_config(cfg: PipelineConfig) -> None:
    """Refuse a configuration the pipeline cannot run, before anything is created."""
    import sims
    from embodied.data.collect import check_action_noise

    choices = sims.suites.expert_names()
    if cfg.sim.suite is None or cfg.sim.suite not in choices:
        raise PipelineError(f"unknown suite {cfg.sim.suite!r}; set sim.suite to one of {choices}")
    unknown = [s for s in cfg.stages if s not in STAGES + CONTROL_STAGES]  # held-out twins are not asked for
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
        raise PipelineError(
            f"the pipeline fine-tunes a flow VLA with Flow-SDE/Flow-Noise: use policy=flow "
            f"(got {family}); token VLAs train with embodied-sft + embodied-train algo=ppo|grpo"
        )
    if cfg.continue_rl and not cfg.init_from:
        raise PipelineError("continue_rl=true carries another run's RL on: name that run with init_from=RUN")
    if cfg.eval.attempts < 1:
        raise PipelineError(f"eval.attempts={cfg.eval.attempts}: every initial state needs at least 1 episode")
    if cfg.eval.workers < 1:
        raise PipelineError(f"eval.workers={cfg.eval.workers} must be >= 1 (processes sharing the evaluation)")
    if cfg.eval.heldout_episodes < 0:
        raise PipelineError(
            f"eval.heldout_episodes={cfg.eval.heldout_episodes} must be >= 0 (0: no held-out evaluation)"
        )
    check_rl(cfg)
    task_ids(cfg)


def check_rl(cfg: PipelineConfig) -> None:
    """The RL stage's settings (``rl.*``), as :func:`check_config` refuses them."""
    from embodied.algorithms.batch import TRUNCATION
    from embodied.algorithms.critic import CRITICS
    from embodied.rllib.env_runner import INIT_POOLS

    if cfg.rl.algo.name not in ("flow_sde", "flow_sde_full", "flow_noise"):
        raise PipelineError(
            f"rl.algo.name={cfg.rl.algo.name!r}: the pipeline's flow VLA trains with "
            "algo@rl.algo=flow_sde, flow_sde_full or flow_noise"
        )
    if cfg.rl.truncation not in TRUNCATION:
        raise PipelineError(f"rl.truncation={cfg.rl.truncation!r}: choose {' or '.join(TRUNCATION)}")
    if cfg.rl.init_states not in INIT_POOLS:
        raise PipelineError(f"rl.init_states={cfg.rl.init_states!r}: choose {' or '.join(INIT_POOLS)}")
    if cfg.rl.algo.critic not in CRITICS:
        raise PipelineError(f"rl.algo.critic={cfg.rl.algo.critic!r}: choose one of {', '.join(CRITICS)}")
    runtime = cfg.rl.runtime
    problem = runtime_problem(runtime, "rl.runtime")
    if problem:
        raise PipelineError(problem)
    if runtime.num_env_runners and cfg.rl.num_envs % runtime.num_env_runners:
        raise PipelineError(
            f"rl.num_envs={cfg.rl.num_envs} is split evenly between rl.runtime.num_env_runners="
            f"{runtime.num_env_runners}: choose a runner count that divides it"
        )
    if not 0 <= cfg.rl.algo.critic_warmup < cfg.rl.iterations:
        raise PipelineError(
            f"rl.algo.critic_warmup={cfg.rl.algo.critic_warmup} must lie in 0..rl.iterations-1 "
            f"({cfg.rl.iterations - 1}): the actor learns after the warm-up"
        )


def run(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the stages :func:`plan` names (skipping the ones a previous run of this folder finished), then
    the comparison with the control, the plot and the report."""
    check_config(cfg)
    out = prepare_run_dir(cfg.out)
    results = open_run(cfg, out)
    for name in plan(cfg):
        if name in results["stages_done"]:
            print(f"[pipeline] {name}: done in a previous run, skipped")
            continue
        stage = PIPELINE_STAGES.lookup(name)
        for need in stage.needs:
            if need not in results["stages_done"]:
                raise PipelineError(f"stage {name} needs stage {need} first (add it to stages=...)")
        print(f"[pipeline] {name} ...", flush=True)
        t0 = time.perf_counter()
        results[name] = stage.run(cfg, out, results)
        results["stage_seconds"][name] = round(time.perf_counter() - t0, 1)
        results["stages_done"].append(name)
        results["machine"] = machine_info()
        write_json(out / "results.json", results)
    results["machine"] = machine_info()
    for key, heldout in (("rl_vs_control", False), ("rl_vs_control_heldout", True)):
        vs_control = rl_against_control(out, cfg.sim.suite, heldout)
        if vs_control is not None:
            results[key] = vs_control
    plot_pipeline(results, out)
    write_json(out / "results.json", results)
    write_report(results, out)
    videos = sorted([*out.glob("videos/*.mp4"), *out.glob("*/videos/*.mp4")])  # collect's, each evaluation's
    publish_media(out, cfg.logger, sorted((out / "plots").glob("*.png")), videos, results["config"])
    return results


def open_run(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    """The results so far of the run folder ``out``: those of an earlier run of the same configuration
    (another configuration is refused), the stages ``init_from=`` copies, or nothing yet."""
    import json

    path = out / "results.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    config = json.loads(json.dumps(asdict(cfg)))
    if cfg.init_from and not results.get("stages_done"):
        source = Path(cfg.init_from).expanduser().resolve()
        if source == out:
            raise PipelineError(f"init_from={cfg.init_from} is this run's own folder: name another run")
        results = {"config": config, **start_from_run(source, out, config, cfg.continue_rl)}
        rl_from = results["init_from"].get("rl_from_iteration")
        print(
            f"[pipeline] {', '.join(results['stages_done'])}: copied from {source}"
            + (f"; RL carried on from its iteration {rl_from}" if rl_from is not None else ""),
            flush=True,
        )
        write_json(path, results)  # a run killed from here on resumes instead of copying again
    done = results.get("stages_done", [])
    stored = results.get("config")
    if done and not same_config(
        run_identity(upgrade_config(stored)) if stored else None,
        run_identity(config),
        PipelineConfig,
        pipeline_defaults(config),
    ):
        raise PipelineError(
            f"{out} holds a pipeline run with another configuration: choose a new out=..., or "
            "repeat the original command to resume it"
        )
    results.update(config=config, tasks=task_ids(cfg), stages_done=done)
    results.setdefault("stage_seconds", {})
    return results


@hydra_app("embodied-pipeline", "pipeline", moved=(MOVED_RL_KEYS, moved_rl_override))
def main(cfg: Any) -> None:
    import torch

    from embodied.runners.eval import EvalError
    from embodied.runners.train import TrainError
    from policies import CheckpointError, SpecMismatchError

    # one torch thread unless told otherwise: the thread count changes the order of floating-point sums,
    # so the same job on a machine with another number of cores would train another SFT policy
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    config: PipelineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        results = run(config)
    except (PipelineError, TrainError, EvalError, CheckpointError, SpecMismatchError, FileNotFoundError) as err:
        raise SystemExit(f"embodied-pipeline: {err}") from None
    except KeyboardInterrupt:
        print(
            f"embodied-pipeline: interrupted; finished stages and episodes are kept in {config.out}: "
            "run the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    parts = [f"expert success {results['collect']['expert_success_rate']:.1%}" if "collect" in results else ""]
    for key, label in (("eval_sft", "SFT"), ("eval_rl", "SFT+RL")):
        if key in results:
            r = results[key]
            parts.append(f"{label} {r['success_rate']:.1%} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
    paired = (results.get("eval_rl", {}).get("comparison") or {}).get("paired")
    if paired:
        parts.append(
            f"RL - SFT {paired['difference']:+.1%} [{paired['ci95'][0]:+.3f}, {paired['ci95'][1]:+.3f}] "
            f"paired over {paired['states']} states"
        )
    print(
        f"{'; '.join(p for p in parts if p)} on {config.sim.suite} {results['tasks']}; "
        f"report: {Path(config.out) / 'report.md'}"
    )


if __name__ == "__main__":
    main()


#: the pipeline's public names, several defined in the modules the stages, the report and the run folders live in
__all__ = [
    "CONTROL_COPY_STAGES",
    "CONTROL_STAGES",
    "INIT_STAGES",
    "MOVED_RL_KEYS",
    "PIPELINE_STAGES",
    "STAGES",
    "PipelineConfig",
    "PipelineError",
    "PipelineEvalConfig",
    "PipelineRLConfig",
    "PipelineSFTConfig",
    "rl_step_limit",
    "check_config",
    "main",
    "moved_rl_override",
    "open_run",
    "plan",
    "run",
    "run_identity",
    "stage_collect",
    "stage_eval",
    "stage_rl",
    "stage_sft",
    "upgrade_config",
    "write_report",
]
