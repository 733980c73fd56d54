"""One suite's evaluation in several worker processes (``embodied-eval workers=K``).

The waves (``harness.run_suite``) are dealt round-robin to K spawned processes, each with its own
envs and its own copy of the policy. A wave's sampling is seeded from ``(seed, suite, wave,
attempt)`` alone, so the episodes are the ones a single process plays, in another order. On a
2-core machine two workers are ~1.7x faster than one process, which leaves a core idle while it
waits for the renderer or the policy.

Workers send every finished episode at once (the parent appends it to ``episodes.jsonl``: an
interrupted or crashed run resumes from it) and the frames of the episodes they film (at most
``video_max`` each; the parent keeps the first ``video_max`` of them all). A stop request (Ctrl-C
in the parent) reaches them through an event polled at every control step.
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from embodied.eval.harness import EpisodeRecord, FrameSink
from embodied.latency.stats import LatencyStats


@dataclass
class WorkerSpec:
    """What a worker needs to rebuild the agent and run its share of one suite (picklable)."""

    suite: str
    tasks: list[int]
    episodes: int
    num_envs: int
    image_size: int
    seed: int
    attempts: int
    first_state: int
    latency: Any  # embodied.latency.LatencyConfig
    checkpoint: str | None = None  # a policy bundle; None: the suite's scripted experts
    device: str = "cpu"
    mode: str = "greedy"
    rtc_beta: float = 5.0
    videos: str = "none"  # failures | all | none: which episodes a worker films
    video_max: int = 0  # episodes a worker films at most
    threads: int = 1  # torch intra-op threads per worker
    max_steps: int | None = None  # step limit per episode (None: the tasks' own)
    env_options: dict[str, Any] = field(default_factory=dict)  # further options of the suite's env
    done: list[dict[str, Any]] = field(default_factory=list)  # records of an interrupted run


def _worker(index: int, count: int, spec: WorkerSpec, out: Any, stop: Any) -> None:
    """Run waves ``index::count`` of the suite's remaining ones, reporting through ``out``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:
        import torch

        from embodied.eval.harness import ExpertAgent, PolicyAgent, run_suite

        torch.set_num_threads(spec.threads)
        if spec.checkpoint is not None:
            import policies

            policy = policies.load(spec.checkpoint, device=spec.device)
            agent: Any = PolicyAgent(policy, spec.mode, rtc_beta=spec.rtc_beta)
            check = policy.check_env
        else:
            agent, check = ExpertAgent(spec.suite), None
        filmed = 0

        def film(suite: str, task: int, init_id: int, frames: list, success: bool, length: int) -> bool:
            nonlocal filmed
            if spec.videos == "none" or (spec.videos == "failures" and success) or filmed >= spec.video_max:
                return filmed < spec.video_max
            filmed += 1
            out.put(("frames", (suite, task, init_id, frames, success, length)))
            return filmed < spec.video_max

        stats = run_suite(
            agent,
            spec.suite,
            tasks=spec.tasks,
            episodes=spec.episodes,
            num_envs=spec.num_envs,
            image_size=spec.image_size,
            seed=spec.seed,
            latency=spec.latency,
            done=[EpisodeRecord(**r) for r in spec.done],
            on_episode=lambda rec: out.put(("episode", rec.__dict__)),
            record_frames=spec.videos != "none",
            on_frames=film,
            check=check,
            should_stop=stop.is_set,
            attempts=spec.attempts,
            first_state=spec.first_state,
            shard=(index, count),
            max_steps=spec.max_steps,
            env_options=spec.env_options,
        )
        out.put(("done", stats))
    except KeyboardInterrupt:
        out.put(("stopped", None))
    except BaseException as err:  # noqa: BLE001 - everything goes back to the parent
        try:
            import pickle

            pickle.dumps(err)
            out.put(("error", (err, traceback.format_exc())))
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
            out.put(("error", (RuntimeError(f"{type(err).__name__}: {err}"), traceback.format_exc())))


def run_suite_parallel(
    spec: WorkerSpec,
    workers: int,
    *,
    on_episode: Callable[[EpisodeRecord], None],
    on_frames: FrameSink | None = None,
    progress: Any = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Run one suite's remaining waves in ``workers`` processes. Returns what ``run_suite`` does
    (``env_steps``, ``seconds``: this call's wall time, ``latency``: pooled over the workers).

    Raises ``KeyboardInterrupt`` after a stop request (the finished episodes have been handed to
    ``on_episode``), and a worker's own exception if one failed.
    """
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked OpenGL, thread pools or Ray state
    out, stop = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(i, workers, spec, out, stop), daemon=True, name=f"embodied-eval-worker-{i}")
        for i in range(workers)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    finished: list[dict[str, Any]] = []
    error: tuple[BaseException, str] | None = None
    stopped = False
    ended = 0
    try:
        while ended < workers:
            if should_stop is not None and should_stop() and not stop.is_set():
                stop.set()
            try:
                kind, payload = out.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and out.empty():
                    raise RuntimeError(
                        f"eval worker {dead[0].name} died with exit code {dead[0].exitcode} (killed for memory?); "
                        "the finished episodes are kept: run the same command to resume"
                    ) from None
                continue
            if kind == "episode":
                on_episode(EpisodeRecord(**payload))
                if progress is not None:
                    progress.update(1)
            elif kind == "frames":
                if on_frames is not None:
                    on_frames(*payload)
            else:
                ended += 1
                if kind == "done":
                    finished.append(payload)
                elif kind == "stopped":
                    stopped = True
                elif error is None:
                    error = payload
                    stop.set()  # the others stop at their next step
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    if error is not None:
        err, tb = error
        raise err from RuntimeError(f"in an eval worker:\n{tb}")
    if stopped:
        raise KeyboardInterrupt
    return {
        "env_steps": sum(p["env_steps"] for p in finished),
        "seconds": time.perf_counter() - start,
        "latency": pooled_latency(finished),
    }


def pooled_latency(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The latency figures of several ``run_suite`` results as one: counts summed, the timing
    summaries recomputed from every worker's samples."""
    parts = [p for p in parts if p.get("latency")]
    if not parts:
        return {}
    stats = LatencyStats()
    for p in parts:
        for stage, values in p.get("latency_samples", {}).items():
            for v in values:
                stats.record(stage, v)
    return {
        "held_steps": sum(p["latency"]["held_steps"] for p in parts),
        "requests": sum(p["latency"]["requests"] for p in parts),
        **stats.summary(),
    }


def default_threads(workers: int) -> int:
    """Torch threads per worker: the machine's cores shared out."""
    return max(1, (os.cpu_count() or 1) // max(workers, 1))
