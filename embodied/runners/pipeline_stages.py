"""The pipeline's stages as objects: what each needs first, how it runs, and its section of the report.

:data:`PIPELINE_STAGES` holds them by name; :func:`plan` says which run for a configuration (the
stages asked for, the frozen-actor control with ``rl.control=true``, each evaluation's held-out twin
where held-out states are scored) and :func:`write_report` assembles ``report.md`` from the sections
of the stages a run finished, in their order. The functions ``stage_*`` do each stage's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.runners import pipeline_report as R
from embodied.runners.pipeline_config import CONTROL_STAGES, PipelineConfig, PipelineError
from embodied.video import VideoWriter, annotate_frame, count_frames
from sims.registry import Registry


def task_ids(cfg: PipelineConfig) -> list[int]:
    """The run's tasks (``cfg.tasks``, default all of the suite's), checked against the suite."""
    import sims

    n = len(sims.suites.tasks(cfg.sim.suite))
    tasks = list(range(n)) if cfg.tasks is None else list(cfg.tasks)
    if not tasks or any(not 0 <= t < n for t in tasks):
        raise PipelineError(f"tasks {cfg.tasks} out of range for suite {cfg.sim.suite!r} (0..{n - 1})")
    return tasks


@dataclass(frozen=True)
class Stage:
    """A stage: its ``name`` (its key in ``results.json`` and its sub-folder), the stages it ``needs``
    finished first, :meth:`run` (returns its results) and :meth:`section` (its lines of ``report.md``)."""

    name: str
    needs: tuple[str, ...] = ()

    def run(self, cfg: PipelineConfig, out: Path, results: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def section(self, results: dict[str, Any]) -> list[str]:
        return []


@dataclass(frozen=True)
class Collect(Stage):
    """Demonstrations from the suite's scripted experts (a LeRobot v3.0 dataset in ``data/``)."""

    def run(self, cfg: PipelineConfig, out: Path, results: dict[str, Any]) -> dict[str, Any]:
        return stage_collect(cfg, out)

    def section(self, results: dict[str, Any]) -> list[str]:
        return R.collect_section(results[self.name])


@dataclass(frozen=True)
class SFT(Stage):
    """Supervised fine-tuning of the flow VLA on the demonstrations (``sft/``)."""

    def run(self, cfg: PipelineConfig, out: Path, results: dict[str, Any]) -> dict[str, Any]:
        return stage_sft(cfg, out)

    def section(self, results: dict[str, Any]) -> list[str]:
        return R.sft_section(results[self.name])


@dataclass(frozen=True)
class RL(Stage):
    """``embodied-train`` from the SFT bundle; ``control``: the frozen-actor control (``algo.lr=0``)."""

    control: bool = False

    def run(self, cfg: PipelineConfig, out: Path, results: dict[str, Any]) -> dict[str, Any]:
        return stage_rl(cfg, out, self.name, control=self.control)

    def section(self, results: dict[str, Any]) -> list[str]:
        return [] if self.control else R.rl_section(results[self.name], results["config"]["sim"]["suite"])


@dataclass(frozen=True)
class Evaluation(Stage):
    """The policy in folder ``policy`` on the protocol's states, compared with the SFT evaluation of the
    same states; ``of``: the protocol evaluation this one repeats on the held-out states."""

    policy: str = ""
    of: str = ""

    def run(self, cfg: PipelineConfig, out: Path, results: dict[str, Any]) -> dict[str, Any]:
        sft = "eval_sft_heldout" if self.of else "eval_sft"
        compare = out / sft if self.name != sft and sft in results["stages_done"] else None
        return stage_eval(cfg, out, self.name, out / self.policy, compare, heldout=bool(self.of))

    def section(self, results: dict[str, Any]) -> list[str]:
        """The evaluations' block (protocol or held-out), written by the first of its kind the run holds."""
        kind = [s for s in PIPELINE_STAGES.values() if isinstance(s, Evaluation) and bool(s.of) == bool(self.of)]
        if next(s.name for s in kind if s.name in results) != self.name:
            return []
        return R.heldout_section(results) if self.of else R.protocol_section(results)


def _evaluation(name: str, policy: str, needs: str) -> tuple[Evaluation, Evaluation]:
    return (Evaluation(name, (needs,), policy=policy), Evaluation(f"{name}_heldout", (needs,), policy=policy, of=name))


_SFT_EVAL, _RL_EVAL, _CONTROL_EVAL = (
    _evaluation("eval_sft", "sft/ckpt", "sft"),
    _evaluation("eval_rl", "rl/checkpoint/policy", "rl"),
    _evaluation("eval_control", "rl_control/checkpoint/policy", "rl_control"),
)
#: every stage by name, in report order
PIPELINE_STAGES: Registry[Stage] = Registry(
    "pipeline stage",
    {
        s.name: s
        for s in (
            Collect("collect"),
            SFT("sft", ("collect",)),
            RL("rl", ("sft",)),
            RL("rl_control", ("sft",), control=True),
            _SFT_EVAL[0],
            _RL_EVAL[0],
            _CONTROL_EVAL[0],
            _SFT_EVAL[1],
            _RL_EVAL[1],
            _CONTROL_EVAL[1],
        )
    },
)


def plan(cfg: PipelineConfig) -> list[str]:
    """The stages a run of ``cfg`` goes through, in order: ``cfg.stages``, the control's with
    ``rl.control=true``, and after each evaluation its held-out twin where held-out states are scored
    (ours: the 50 states after the protocol's, worth it when RL trains on the protocol's; real LIBERO:
    the 50 its placement initializer sampled, 50..99, which neither init pool trains on)."""
    import sims

    stages = list(cfg.stages) + [s for s in CONTROL_STAGES if cfg.rl.control and s not in cfg.stages]
    if cfg.eval.heldout_episodes and (sims.suites.is_libero(cfg.sim.suite) or cfg.rl.init_states == "protocol"):
        twins = {s.of: s.name for s in PIPELINE_STAGES.values() if isinstance(s, Evaluation) and s.of}
        stages = [x for s in stages for x in ((s, twins[s]) if s in twins else (s,))]
    return stages


def write_report(results: dict[str, Any], out: Path) -> Path:
    """``report.md``: the origin of copied stages, each finished stage's section in stage order, the
    evaluations' videos, the time per stage and the machine."""
    lines = R.origin_section(results)
    for stage in PIPELINE_STAGES.values():
        if stage.name in results:
            lines += stage.section(results)
    lines += R.videos_section(results) + R.time_section(results)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


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
            video.write(
                annotate_frame(
                    list(views),
                    [
                        instruction,
                        f"task {ep['task']}  init {ep['init_id']}  step {step + 1}/{ep['length']}  "
                        f"success {ep['success'] and step + 1 == ep['length']}",
                    ],
                )
            )

    if (out / "data").exists():  # an interrupted collection: start it again
        import shutil

        shutil.rmtree(out / "data")
    try:
        result = collect_suite(
            cfg.sim.suite,
            out / "data",
            episodes_per_task=cfg.episodes_per_task,
            task_ids=task_ids(cfg),
            num_envs=cfg.sim.num_envs,
            cameras=cfg.sim.cameras,
            image_size=cfg.sim.image_size,
            seed=cfg.seed,
            num_threads=cfg.sim.num_threads or None,
            on_episode=film,
            expert_gain=cfg.expert_gain,
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
    summary = sft_train(
        SFTConfig(
            data=str(out / "data"),
            out=str(out / "sft"),
            policy=cfg.policy,
            steps=s.steps,
            batch_size=s.batch_size,
            lr=s.lr,
            warmup_steps=s.warmup_steps,
            save_every=s.save_every,
            augment_shift=s.augment_shift,
            seed=cfg.seed,
            threads=s.threads,
            logger=cfg.logger,
            resume=resume,
        )
    )
    return {
        k: summary[k] for k in ("family", "episodes", "samples", "steps", "final_loss", "train_seconds", "parameters")
    } | {"checkpoint": "sft/ckpt"}


def stage_eval(
    cfg: PipelineConfig, out: Path, name: str, checkpoint: Path, compare: Path | None, heldout: bool = False
) -> dict[str, Any]:
    """An evaluation stage in ``out/name``: the protocol's states, or with ``heldout`` the suite's held-out
    states (:func:`sims.suites.heldout_states`: from state 50, real LIBERO's the sampled ones), at most
    ``eval.heldout_episodes`` per task."""
    import sims
    from embodied.runners.eval import EvalConfig, run

    e = cfg.eval
    first, count = sims.suites.heldout_states(cfg.sim.suite) if heldout else (0, e.episodes)
    res = run(
        EvalConfig(
            out=str(out / name),
            checkpoint=str(checkpoint),
            suite=cfg.sim.suite,
            tasks=task_ids(cfg),
            episodes=min(e.heldout_episodes, count) if heldout else e.episodes,
            first_state=first,
            num_envs=e.num_envs,
            image_size=cfg.sim.image_size,
            seed=cfg.seed,
            attempts=e.attempts,
            workers=e.workers,
            videos=e.videos,
            video_max=e.video_max,
            max_steps=e.max_steps,
            compare=str(compare) if compare is not None else None,
        )
    )
    if res["interrupted"]:  # not a finished stage: its episodes are kept and the next run resumes it
        raise KeyboardInterrupt
    suite = res["suites"][cfg.sim.suite]
    pooled_k = sum(t["successes"] for t in suite["tasks"])
    return {
        "success_rate": suite["success_rate"],
        "episodes": suite["episodes"],
        "successes": pooled_k,
        "ci95": suite["ci95"],
        "tasks": suite["tasks"],
        "wall_s": res["wall_s"],
        "env_steps": res["env_steps"],
        "videos": [f"{name}/{v}" for v in res["videos"]],
        "report": f"{name}/report.md",
        "comparison": res.get("comparison", {}).get(cfg.sim.suite),
        "pass_at_k": suite.get("pass_at_k"),
    }


def stage_rl(cfg: PipelineConfig, out: Path, name: str = "rl", control: bool = False) -> dict[str, Any]:
    """The RL stage in ``out/name``; ``control``: the frozen-actor control (``algo.lr=0``, all else equal)."""
    from dataclasses import replace

    from embodied.runners.train import TrainConfig
    from embodied.runners.train import train as rl_train
    from embodied.train_state import resolve_folder

    r = cfg.rl
    resume = resolve_folder(out / name / "checkpoint") is not None
    algo = replace(r.algo, lr=0.0) if control else r.algo
    summary = rl_train(
        TrainConfig(
            out=str(out / name),
            init=str(out / "sft" / "ckpt"),
            algo=algo,
            runtime=r.runtime,
            suite=cfg.sim.suite,
            tasks=task_ids(cfg),
            num_envs=r.num_envs // max(r.runtime.num_env_runners, 1),
            image_size=cfg.sim.image_size,
            iterations=r.iterations,
            chunks_per_iter=r.chunks_per_iter,
            max_episode_steps=r.max_episode_steps,
            truncation=r.truncation,
            reward_type=r.reward_type,
            save_every=r.save_every,
            greedy_every=r.greedy_every,
            greedy_states=r.greedy_states,
            seed=cfg.seed if r.seed is None else r.seed,
            resume=resume,
            init_pool=r.init_states,
            logger=cfg.logger,
        )
    )
    return {k: summary[k] for k in ("algo", "iterations", "env_steps", "wall_s", "env_steps_per_s", "time_split_s")} | {
        "checkpoint": f"{name}/checkpoint/policy",
        "metrics": f"{name}/metrics.csv",
        "control": control,
        "init_states": r.init_states,
        "updates": update_diagnostics(out / name / "metrics.csv"),
    }


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

    med = {
        k: round(float(np.median(col(k))), 4)
        for k in (
            "approx_kl_first",
            "clip_fraction_first",
            "approx_kl",
            "clip_fraction",
            "explained_variance",
            "advantage_std",
            "grad_cos_first",
        )
        if col(k)
    }
    return med | {
        "policy_lag_max": max(col("policy_lag"), default=0.0),
        "kl_stops": int(sum(col("kl_stop"))),
        "actor_iterations": len(rows),
    }


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


__all__ = [
    "PIPELINE_STAGES",
    "Collect",
    "Evaluation",
    "PipelineError",
    "RL",
    "SFT",
    "Stage",
    "plan",
    "rl_against_control",
    "stage_collect",
    "stage_eval",
    "stage_rl",
    "stage_sft",
    "task_ids",
    "update_diagnostics",
    "write_report",
]
