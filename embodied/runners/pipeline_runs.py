"""What makes a pipeline run folder one run: the old config layout upgraded, the fields that identify
a run (:func:`run_identity`), and a new run started from another's stages (``init_from=``, with
``continue_rl=true`` its RL carried on)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from embodied.runners.pipeline_config import PipelineError
from embodied.runners.train import AlgoConfig, RuntimeConfig
from embodied.runs import config_differences, without_added_defaults

#: the stages ``init_from=`` copies (everything before RL), and the folders each wrote in the run folder
INIT_STAGES = {
    "collect": ("data", "videos/collect.mp4"),
    "sft": ("sft",),
    "eval_sft": ("eval_sft",),
    "eval_sft_heldout": ("eval_sft_heldout",),
}
#: what ``continue_rl=true`` copies besides: the frozen-actor control (its policy and metrics, not its Ray
#: session) and its evaluations. Its actor never moves (``algo.lr=0``): its policy is the same at any count
CONTROL_COPY_STAGES = {
    "rl_control": ("rl_control/checkpoint/policy", "rl_control/metrics.csv", "rl_control/train.json"),
    "eval_control": ("eval_control",),
    "eval_control_heldout": ("eval_control_heldout",),
}


#: ``rl.*`` keys of the layout before ``rl.algo`` / ``rl.runtime`` were embodied-train's groups, and where
#: each went; the old keys still work for one release, with a deprecation message
MOVED_RL_KEYS = {
    "rl.lr": "rl.algo.lr",
    "rl.critic_warmup": "rl.algo.critic_warmup",
    "rl.critic": "rl.algo.critic",
    "rl.overlap": "rl.runtime.overlap",
    "rl.env_runners": "rl.runtime.num_env_runners",
    "rl.algo": "algo@rl.algo",
}


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
    algo = AlgoConfig(
        name=rl.pop("algo", AlgoConfig.name),
        lr=rl.pop("lr", AlgoConfig.lr),
        critic_warmup=rl.pop("critic_warmup", AlgoConfig.critic_warmup),
        critic=rl.pop("critic", AlgoConfig.critic),
    )
    runners = rl.pop("env_runners", 0)
    runtime = RuntimeConfig(
        name="cluster" if runners else "local", num_env_runners=runners, overlap=rl.pop("overlap", False)
    )
    return {**c, "rl": {"algo": asdict(algo), "runtime": asdict(runtime), **rl}}


def run_identity(c: dict[str, Any]) -> dict[str, Any]:
    """What makes two pipeline configs the same run: stages and rl.control only choose what runs (a run
    may go on with more stages), eval.workers and rl.runtime.learner_threads change the wall time (the
    learner's threads also the rounding of its sums), init_from / continue_rl where the first stages
    came from and logger where the scalars go, not the episodes."""
    kept = {k: v for k, v in c.items() if k not in ("stages", "init_from", "continue_rl", "logger")}
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
    equal ``config`` except for ``rl``, ``out`` (and what :func:`run_identity` ignores). ``continue_rl``:
    also its RL checkpoint and metrics, so that this run's RL stage resumes from there, and its finished
    stages of :data:`CONTROL_COPY_STAGES`."""
    import json
    import shutil

    path = source / "results.json"
    if not path.is_file():
        raise PipelineError(f"init_from={source}: no pipeline run there ({path} is missing)")
    theirs = json.loads(path.read_text())

    def before_rl(c: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in run_identity(c).items() if k not in ("rl", "out")}

    stored = before_rl(upgrade_config(theirs.get("config") or {}))
    # a field added after that run was made matches while it keeps its default (as in same_config)
    mine = without_added_defaults(stored, before_rl(config), pipeline_defaults(config))
    diff = config_differences(stored, mine)
    if diff:
        raise PipelineError(
            f"init_from={source}: that run's configuration differs from this one in "
            f"{', '.join(diff)}; only rl.*, out and stages may differ"
        )
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
    return {
        **{s: theirs[s] for s in copied if s in theirs},
        "stages_done": copied,
        "stage_seconds": {s: seconds[s] for s in copied if s in seconds},
        "init_from": start,
    }


def _rl_to_continue(source: Path, iterations: int) -> tuple[Path, int]:
    """``source``'s last RL checkpoint folder and its iteration, which must lie below ``iterations``."""
    from embodied.rllib.checkpoint import resumable
    from embodied.train_state import saved_step

    checkpoint = resumable(source / "rl")
    if checkpoint is None or not (source / "rl" / "metrics.csv").is_file():
        raise PipelineError(
            f"init_from={source} continue_rl=true: that run holds no RL checkpoint to carry on "
            f"({source / 'rl' / 'checkpoint'})"
        )
    step = saved_step(checkpoint / "train_state")
    if step >= iterations:
        raise PipelineError(
            f"init_from={source} continue_rl=true: its RL is at iteration {step} already; "
            f"set rl.iterations above {step}"
        )
    return checkpoint, step
