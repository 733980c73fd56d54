"""``embodied-eval``: the benchmark harness on the LIBERO-style suites.

    embodied-eval checkpoint=CKPT suite=spatial out=DIR [tasks=[0,3]] [episodes=5] [videos=failures]
    embodied-eval policy=expert suites=[spatial,goal] out=DIR
    embodied-eval checkpoint=CKPT suite=spatial out=DIR compare=runs/previous_eval
    embodied-eval checkpoint=CKPT suite=libero_spatial simulator=robosuite out=DIR [max_steps=M]

``simulator=robosuite`` plays real LIBERO's official protocol in its own env (the reference venv
``.venv-libero``) against the policy behind ``embodied-serve``: :mod:`embodied.eval.reference`.

Protocol: every task's fixed initial states (50 by default), one episode each, in parallel envs,
each env stopping at success or at its task's step limit; the policy acts greedily unless
``mode=explore``. ``attempts=K`` runs every state K times with other sampling noise and adds
pass@1..K (the best of k attempts: how much a policy that picked its noise per state could gain).
``workers=K`` shares the waves out to K processes (the same episodes, sooner).
Outputs in ``out``: ``results.json`` (per suite and task: success rate, 95%
Wilson interval, episode lengths, failures by initial-state id), ``results.csv``, ``report.md``,
``plots/<suite>.png``, ``videos/`` (both camera views side by side with the instruction and step),
``episodes.jsonl`` (one line per finished episode) and ``eval_config.json``. Ctrl-C keeps the
finished episodes; the same command resumes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from embodied.config import hydra_app, store
from embodied.runs import machine_info, prepare_run_dir, same_config, write_json
from policies.files import sha256_file

VIDEO_CHOICES = ("failures", "all", "none")
SIMULATORS = ("mujoco", "robosuite")
MESHES = ("decimated", "full")


@dataclass
class EvalConfig:
    """Schema of ``embodied-eval``."""

    out: str = MISSING  # run folder
    checkpoint: Optional[str] = None  # a policy bundle (policies.save), or null with policy=expert
    policy: Any = None  # config group policy/: policy=expert runs the suites' scripted experts
    suite: Optional[str] = None  # one suite ...
    suites: list[str] = field(default_factory=list)  # ... or several
    tasks: Optional[list[int]] = None  # task indices (default: all tasks of each suite)
    episodes: int = 50  # fixed initial states per task (the protocol's 50)
    # the first of them: 0 the protocol's states 0..49; 50 the states 50..99, held out from an RL run that
    # trained on the protocol's states (rl.init_states=protocol); training data never uses either
    first_state: int = 0
    num_envs: int = 25  # parallel envs (per worker)
    # processes that share out the waves, each with num_envs envs and its own copy of the policy; the
    # episodes are the same for any number (each wave is seeded on its own), only the wall time changes
    workers: int = 1
    image_size: int = 128  # rendered camera size (the policy resizes to its own)
    mode: str = "greedy"  # greedy | explore
    seed: int = 0  # seeds the policy's sampling (per wave)
    # episodes per initial state, each with its own sampling noise: >1 adds pass@k (k = 1..attempts) to the
    # results, the success of the best of k attempts (the headroom RL can turn into pass@1); the success
    # rate, intervals, comparison and videos stay the protocol's (attempt 0)
    attempts: int = 1
    device: str = "cpu"
    execution: str = "sync"  # sync | async | rtc | aware (embodied/latency/executor.py)
    delay: int = 0  # inference delay in control steps (simulated; sync waits it out, holding still)
    delay_source: str = "steps"  # steps (the delay above, deterministic) | wallclock (measured inference time)
    threshold: Optional[int] = None  # async/rtc: ask for a chunk at <= this many queued actions (default max(d, H/2))
    merge: str = "replace"  # async: new chunk vs queued actions: replace | keep | blend
    rtc_beta: float = 5.0  # rtc: bound on the guidance weight
    action_steps: Optional[int] = None  # sync: execute the first k actions of each chunk, then replan (default: all)
    action_offset: int = (
        0  # sync: skip the first j actions of each chunk (diagnostic: naive async's skip without delay)
    )
    videos: str = "failures"  # failures | all | none
    video_max: int = 10  # videos per suite at most
    compare: Optional[str] = None  # a previous run folder or results.json to compare with
    # mujoco: our batched simulator (our suites); robosuite: real LIBERO's reference env in .venv-libero
    # (suite=libero_spatial|libero_object|libero_goal|libero_10|libero_90 or a LIBERO-PRO variant)
    simulator: str = "mujoco"
    server: Optional[str] = None  # robosuite: HOST:PORT of a running openpi-compatible server instead of checkpoint
    # policy steps per episode (default: the suite's official limit; another one is not the protocol: quick checks)
    max_steps: Optional[int] = None
    # LIBERO suites in our simulator: the visual meshes drawn decimated (the env's default, its
    # render_faces) | full (as the scenes have them and the reference draws them; ~4x slower on a CPU renderer)
    meshes: str = "decimated"
    hard_reset: bool = False  # robosuite: rebuild the model at every reset (robosuite's default; slow)


store("eval_schema", EvalConfig)


class EvalError(ValueError):
    """A configuration the harness cannot run; printed as one line."""


def _resolve(cfg: EvalConfig) -> tuple[list[str], dict[str, list[int]], dict[str, list[str]]]:
    import sims
    import sims.libero

    suites = ([cfg.suite] if cfg.suite else []) + [s for s in cfg.suites if s != cfg.suite]
    if not suites:
        raise EvalError("no suite given: add suite=spatial (or suites=[spatial,goal])")
    unknown = [s for s in suites if s not in sims.suites.env_names()]
    libero = [s for s in unknown if s in sims.libero.suite_names()]
    if libero:
        raise EvalError(
            f"{libero[0]} is a LIBERO-PRO variant: add simulator=robosuite (LIBERO's own env in "
            ".venv-libero); our batched simulator runs " + str(sims.suites.env_names())
        )
    if unknown:
        raise EvalError(f"unknown suite(s) {unknown}; choose from {sims.suites.env_names()}")
    if not 1 <= cfg.episodes <= sims.suites.NUM_INIT_STATES:
        raise EvalError(f"episodes must be in 1..{sims.suites.NUM_INIT_STATES} (fixed initial states per task)")
    if cfg.first_state < 0:
        raise EvalError(f"first_state must be >= 0 (the first initial state of each task), got {cfg.first_state}")
    real = [s for s in suites if sims.suites.is_libero(s)]
    if real and cfg.first_state + cfg.episodes > sims.libero.NUM_STATES:
        raise EvalError(
            f"first_state + episodes must stay within real LIBERO's {sims.libero.NUM_STATES} init "
            f"states per task ({sims.libero.INIT_IDS}), got {cfg.first_state} + {cfg.episodes}"
        )
    if cfg.attempts < 1:
        raise EvalError(f"attempts must be >= 1 (episodes per initial state), got {cfg.attempts}")
    if cfg.workers < 1:
        raise EvalError(f"workers must be >= 1 (processes sharing the waves), got {cfg.workers}")
    if cfg.videos not in VIDEO_CHOICES:
        raise EvalError(f"videos must be one of {VIDEO_CHOICES}, got {cfg.videos!r}")
    from embodied.latency import EXECUTION_MODES

    if cfg.execution not in EXECUTION_MODES:
        raise EvalError(f"execution must be one of {EXECUTION_MODES}, got {cfg.execution!r}")
    if cfg.execution in ("rtc", "aware") and (cfg.checkpoint is None):
        raise EvalError(f"execution={cfg.execution} needs a policy checkpoint (checkpoint=...)")
    tasks_of, names = {}, {}
    for s in suites:
        specs = sims.suites.tasks(s)
        names[s] = [t.name for t in specs]
        tasks = list(range(len(specs))) if cfg.tasks is None else list(cfg.tasks)
        bad = [t for t in tasks if not 0 <= t < len(specs)]
        if bad:
            raise EvalError(f"task index(es) {bad} out of range for suite {s!r} (0..{len(specs) - 1})")
        tasks_of[s] = tasks
    return suites, tasks_of, names


def _latency_config(cfg: EvalConfig) -> Any:
    """A fresh :class:`~embodied.latency.LatencyConfig` from the eval keys (``aware`` fills in its
    ``max_delay``, so every suite gets its own)."""
    from embodied.latency import LatencyConfig

    return LatencyConfig(
        mode=cfg.execution,
        delay=cfg.delay,
        delay_source=cfg.delay_source,
        threshold=cfg.threshold,
        merge=cfg.merge,
        rtc_beta=cfg.rtc_beta,
        action_steps=cfg.action_steps,
        action_offset=cfg.action_offset,
    )


def _check_latency(cfg: EvalConfig, policy: Any, suite: str) -> None:
    """The execution mode and delay must suit the policy (chunk length, family, augmented state)."""
    import sims
    from embodied.eval.harness import aware_view

    lat = _latency_config(cfg)
    try:
        lat.check(policy.chunk_size if policy is not None else 1)
        if cfg.execution == "rtc" and policy.family != "flow":
            raise ValueError(f"execution=rtc inpaints flow chunks; this is a {policy.family} policy (use async)")
        if cfg.execution == "aware":
            with sims.make(
                sims.suites.backend(suite), suite=suite, num_envs=1, cameras=(), state_obs=policy.config.state_obs
            ) as env:
                aware_view(env, policy.config.state_dim, policy.chunk_size, lat)
    except ValueError as err:
        raise EvalError(str(err)) from None


class _StopOnInterrupt:
    """Ctrl-C (SIGINT) asks the harness to stop at its next control step instead of raising
    ``KeyboardInterrupt`` wherever the main thread happens to be (inside MuJoCo, the renderer or a
    library, which may turn it into another error); a second Ctrl-C interrupts at once. Installed
    only from the main thread; :meth:`restore` puts the previous handler back."""

    def __init__(self) -> None:
        import signal
        import threading

        self.requested = False
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous = signal.signal(signal.SIGINT, self._handle) if self._installed else None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __call__(self) -> bool:
        return self.requested

    def restore(self) -> None:
        import signal

        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False


def _check_identity(out: Path, identity: dict[str, Any]) -> None:
    """Store the run's identity, or refuse an ``out`` that holds another evaluation."""
    cfg_path = out / "eval_config.json"
    if cfg_path.is_file():
        stored = json.loads(cfg_path.read_text())
        current = json.loads(json.dumps(identity))
        if not same_config(stored, current, EvalConfig):
            diff = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
            raise EvalError(
                f"{out} holds an evaluation with a different configuration ({', '.join(diff)}): "
                "choose a new out=..., or repeat the original command to resume it"
            )
    else:
        write_json(cfg_path, identity)


def _write_outputs(out: Path, results: dict[str, Any], previous: dict[str, Any] | None) -> None:
    from embodied.eval.report import compare, markdown, plot_suite, write_csv

    results["videos"] = sorted(str(p.relative_to(out)) for p in (out / "videos").rglob("*.mp4"))
    results["machine"] = machine_info()
    if previous is not None:
        results["comparison"] = compare(results["suites"], previous)
        results["compare_with"] = str(results["config"]["compare"])
    write_json(out / "results.json", results)
    write_csv(out / "results.csv", results["suites"])
    for suite, res in results["suites"].items():
        plot_suite(out / "plots" / f"{suite}.png", suite, res, results["agent"]["label"])
    (out / "report.md").write_text(markdown(results))


def _run_reference(cfg: EvalConfig) -> dict[str, Any]:
    """``simulator=robosuite``: real LIBERO's own env against the policy server (embodied/eval/reference.py)."""
    import policies
    from embodied.eval.reference import ReferenceEvalError, check_config, run_reference
    from embodied.eval.report import load_previous

    try:
        check_config(cfg)
    except ReferenceEvalError as err:
        raise EvalError(str(err)) from None
    previous = load_previous(cfg.compare) if cfg.compare else None
    if cfg.checkpoint is not None:
        ckpt = Path(cfg.checkpoint)
        policy = policies.load(ckpt, device="cpu")
        c = policy.config
        if c.state_dim != 8 or c.action_dim != 7:
            raise EvalError(
                f"{ckpt} reads a {c.state_dim}-D state and acts in {c.action_dim} dimensions; LIBERO's "
                "protocol gives the 8-D state (eef position, axis-angle, gripper) and takes 7-D OSC_POSE "
                "actions: evaluate a policy made for LIBERO"
            )
        agent_info = {
            "label": f"{policy.family} policy {ckpt}",
            "family": policy.family,
            "checkpoint": str(ckpt),
            "sha256": sha256_file(ckpt / "model.safetensors"),
            "config": c.to_dict(),
        }
        del policy
    else:
        agent_info = {"label": f"policy server {cfg.server}", "family": "server", "server": cfg.server}
    out = prepare_run_dir(cfg.out)
    identity = {k: v for k, v in asdict(cfg).items() if k not in ("out", "videos", "video_max", "compare", "workers")}
    identity["sha256"] = agent_info.get("sha256")
    episodes = len(cfg.tasks) if cfg.tasks is not None else None
    with tqdm(total=None if episodes is None else episodes * cfg.episodes, desc="eval (robosuite)", unit="ep") as bar:
        try:
            results = run_reference(cfg, out, agent_info, lambda: _check_identity(out, identity), bar)
        except ReferenceEvalError as err:
            raise EvalError(str(err)) from None
    results["config"] = {**asdict(cfg), "suites": [cfg.suite or cfg.suites[0]]}
    _write_outputs(out, results, previous)
    return results


def _check_config(cfg: EvalConfig, suites: list[str]) -> dict[str, Any]:
    """Refuse what this simulator cannot run; the env options the configuration asks for."""
    if cfg.server is not None or cfg.hard_reset:
        raise EvalError("server= and hard_reset= belong to simulator=robosuite (real LIBERO's reference env)")
    if cfg.meshes not in MESHES:
        raise EvalError(f"meshes must be one of {MESHES}, got {cfg.meshes!r}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise EvalError(f"max_steps must be >= 1 (null: the tasks' own limits), got {cfg.max_steps}")
    env_options: dict[str, Any] = {}
    if cfg.meshes == "full":
        import sims

        ours = [s for s in suites if not sims.suites.is_libero(s)]
        if ours:
            raise EvalError(f"meshes=full applies to real LIBERO's suites only, not {ours}")
        env_options["render_faces"] = None  # the env's decimation off
    family = (
        None
        if cfg.policy is None
        else (cfg.policy.get("family") if isinstance(cfg.policy, dict) else getattr(cfg.policy, "family", None))
    )
    if (cfg.checkpoint is None) == (family is None):
        raise EvalError("give exactly one of checkpoint=PATH (a policy bundle) or policy=expert")
    if family is not None and family != "expert":
        raise EvalError(
            f"policy={family}: a model is evaluated from its bundle, checkpoint=PATH; "
            "policy=expert runs the scripted experts"
        )
    return env_options


def _load_agent(cfg: EvalConfig, suite: str) -> tuple[Any, dict[str, Any]]:
    """The policy of ``cfg.checkpoint`` (None: the scripted experts) and what the results say of it."""
    import policies

    if cfg.checkpoint is None:
        policy, info = None, {"label": "scripted experts", "family": "expert"}
    else:
        ckpt = Path(cfg.checkpoint)
        policy = policies.load(ckpt, device=cfg.device)
        info = {
            "label": f"{policy.family} policy {ckpt}",
            "family": policy.family,
            "checkpoint": str(ckpt),
            "sha256": sha256_file(ckpt / "model.safetensors"),
            "config": policy.config.to_dict(),
        }
    _check_latency(cfg, policy, suite)
    if cfg.attempts > 1 and (policy is None or (policy.family == "autoregressive" and cfg.mode == "greedy")):
        what = "the scripted experts are" if policy is None else "a token policy's greedy decoding is"
        raise EvalError(
            f"attempts={cfg.attempts}: {what} deterministic, so every attempt repeats the first"
            + ("" if policy is None else "; use mode=explore to sample")
        )
    return policy, info


class _EpisodeLog:
    """The run's finished episodes (``episodes.jsonl``, appended as each ends: a resumed run skips them)
    and its videos (``cfg.videos`` of each suite, at most ``cfg.video_max``)."""

    def __init__(self, cfg: EvalConfig, out: Path, names: dict[str, list[str]]):
        from embodied.eval.harness import load_records

        self.cfg, self.out, self.names = cfg, out, names
        self.records = load_records(out / "episodes.jsonl")
        self._file = open(out / "episodes.jsonl", "a")
        self.videos: list[str] = []
        self._counts: dict[str, int] = {}

    def record(self, rec: Any) -> None:
        self.records.append(rec)
        self._file.write(rec.to_json() + "\n")
        self._file.flush()

    def film(self, suite: str, task: int, init_id: int, frames: list, success: bool, length: int) -> bool:
        """Write this episode's video if the run wants it; whether the suite wants more videos."""
        import sims
        from embodied.video import VideoWriter, annotate_frame

        cfg, count = self.cfg, self._counts.get(suite, 0)
        if cfg.videos == "none" or (cfg.videos == "failures" and success) or count >= cfg.video_max:
            return count < cfg.video_max
        self._counts[suite] = count + 1
        instruction = sims.suites.tasks(suite)[task].instruction
        rel = f"videos/{suite}/{task:02d}_{self.names[suite][task]}_init{init_id:02d}_{'ok' if success else 'fail'}.mp4"
        with VideoWriter(self.out / rel, fps=20.0) as writer:
            for step, views in enumerate(frames):
                writer.write(
                    annotate_frame(
                        list(views),
                        [
                            instruction,
                            f"{suite} task {task} init {init_id} step {step}/{length} {'success' if success else ''}",
                        ],
                    )
                )
        self.videos.append(rel)
        return self._counts[suite] < cfg.video_max

    def close(self) -> None:
        self._file.close()


#: the worker processes' settings that are the run's own of the same name
WORKER_FIELDS = (
    "episodes",
    "num_envs",
    "image_size",
    "seed",
    "attempts",
    "first_state",
    "checkpoint",
    "device",
    "mode",
    "rtc_beta",
    "videos",
    "video_max",
    "max_steps",
)


def _worker_fields(cfg: EvalConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in WORKER_FIELDS}


def _evaluate_suite(
    cfg: EvalConfig,
    suite: str,
    tasks: list[int],
    policy: Any,
    env_options: dict[str, Any],
    log: _EpisodeLog,
    bar: Any,
    stop: _StopOnInterrupt,
) -> dict[str, Any]:
    """One suite's episodes not in the log yet, in this process or shared out to ``cfg.workers`` processes;
    the harness's stats (env steps, seconds, latency)."""
    from embodied.eval.harness import ExpertAgent, PolicyAgent, plan_waves, run_suite
    from embodied.eval.parallel import WorkerSpec, default_threads, run_suite_parallel

    latency = _latency_config(cfg)
    remaining = len(plan_waves(suite, tasks, cfg.episodes, cfg.num_envs, cfg.first_state, cfg.attempts, log.records)[3])
    workers = min(cfg.workers, remaining)
    if workers > 1:
        spec = WorkerSpec(
            **_worker_fields(cfg),
            suite=suite,
            tasks=tasks,
            latency=latency,
            threads=default_threads(workers),
            env_options=env_options,
            done=[r.__dict__ for r in log.records if r.suite == suite],
        )
        return run_suite_parallel(
            spec, workers, on_episode=log.record, on_frames=log.film, progress=bar, should_stop=stop
        )
    agent = PolicyAgent(policy, cfg.mode, rtc_beta=cfg.rtc_beta) if policy is not None else ExpertAgent(suite)
    return run_suite(
        agent,
        suite,
        tasks=tasks,
        episodes=cfg.episodes,
        num_envs=cfg.num_envs,
        image_size=cfg.image_size,
        seed=cfg.seed,
        latency=latency,
        done=log.records[:],
        on_episode=log.record,
        record_frames=cfg.videos != "none",
        on_frames=log.film,
        progress=bar,
        check=policy.check_env if policy is not None else None,
        should_stop=stop,
        attempts=cfg.attempts,
        first_state=cfg.first_state,
        max_steps=cfg.max_steps,
        env_options=env_options,
    )


def run(cfg: EvalConfig) -> dict[str, Any]:
    """Evaluate as configured (resuming an interrupted run in the same ``out``)."""
    if cfg.simulator not in SIMULATORS:
        raise EvalError(f"simulator must be one of {SIMULATORS}, got {cfg.simulator!r}")
    if cfg.simulator == "robosuite":
        return _run_reference(cfg)
    from embodied.eval.report import aggregate, load_previous

    suites, tasks_of, names = _resolve(cfg)
    env_options = _check_config(cfg, suites)
    previous = load_previous(cfg.compare) if cfg.compare else None
    policy, agent_info = _load_agent(cfg, suites[0])
    out = prepare_run_dir(cfg.out)
    identity = {k: v for k, v in asdict(cfg).items() if k not in ("out", "videos", "video_max", "compare", "workers")}
    identity.update(suites=suites, tasks_of=tasks_of, sha256=agent_info.get("sha256"))
    _check_identity(out, identity)
    log = _EpisodeLog(cfg, out, names)
    env_steps, seconds, interrupted, latency_stats = 0, 0.0, False, {}
    stop = _StopOnInterrupt()
    total = sum(len(tasks_of[s]) * cfg.episodes for s in suites) * cfg.attempts
    start = time.perf_counter()
    try:
        with tqdm(total=total, initial=len(log.records), desc="eval", unit="ep") as bar:
            for suite in suites:
                stats = _evaluate_suite(cfg, suite, tasks_of[suite], policy, env_options, log, bar, stop)
                env_steps += stats["env_steps"]
                seconds += stats["seconds"]
                if stats["latency"]:
                    latency_stats[suite] = stats["latency"]
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stop.restore()
        log.close()
    results: dict[str, Any] = {
        "suites": aggregate(log.records, suites, tasks_of, names),
        "agent": agent_info,
        "config": {**asdict(cfg), "suites": suites},
        "device": cfg.device,
        "wall_s": round(time.perf_counter() - start, 1),
        "env_steps": env_steps,
        "latency": latency_stats,
        "env_steps_per_s": round(env_steps / seconds, 1) if seconds > 0 else 0.0,
        "interrupted": interrupted,
    }
    _write_outputs(out, results, previous)
    return results


@hydra_app("embodied-eval", "eval")
def main(cfg: Any) -> None:
    from policies import CheckpointError, SpecMismatchError

    config: EvalConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        results = run(config)
    except (EvalError, CheckpointError, SpecMismatchError, FileNotFoundError) as err:
        raise SystemExit(f"embodied-eval: {err}") from None
    for suite, res in results["suites"].items():
        print(
            f"{suite}: {res['success_rate']:.1%} over {res['episodes']} episodes "
            f"(95% CI [{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}])"
            + (
                f"; pass@1..{len(res['pass_at_k'])}: " + " ".join(f"{p:.0%}" for p in res["pass_at_k"])
                if res.get("pass_at_k")
                else ""
            )
        )
    if results["interrupted"]:
        print(
            f"interrupted: finished episodes are kept in {config.out}; run the same command to resume", file=sys.stderr
        )
        raise SystemExit(130)


if __name__ == "__main__":
    main()
