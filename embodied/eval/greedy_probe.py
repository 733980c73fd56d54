"""The policy as evaluation scores it, measured while RL trains (``embodied-train greedy_every=K``).

RL trains the policy it samples (Flow-SDE: noise injected at one denoising step), while every
evaluation runs the greedy path (the ODE from the initial noise, nothing injected). The two can part:
training success rises and the greedy policy stays where it was. This probe scores the greedy policy
on the run's own training states every K iterations, with the evaluation's harness, seeds and step
limits, so that ``greedy_success_rate`` stands beside ``success_rate`` in ``metrics.csv`` while the run
goes. Its episodes go to ``greedy_episodes.jsonl`` (one record per episode, with the iteration), the
same states and initial noise at every probe, so two probes compare state by state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

#: the probe's files in a run folder
PROBE_POLICY = "greedy_probe/policy"
PROBE_EPISODES = "greedy_episodes.jsonl"


def probe_first_state(suite: str, init_pool: str) -> int:
    """The first init id the probe scores: the protocol's states (``init_pool=protocol``, which RL
    then trains on) from 0, else the suite's training states (:func:`sims.suites.training_init_id`)."""
    import sims

    return 0 if init_pool == "protocol" else sims.suites.training_init_id(suite, 0)


def greedy_records(policy: Any, suite: str, **run: Any) -> list[dict[str, Any]]:
    """Greedy episodes of ``policy`` as :func:`embodied.eval.harness.run_suite` plays them with ``run``
    (tasks, episodes, num_envs, image_size, seed, first_state, and where given shard, env, check), as
    record dicts (:class:`embodied.eval.harness.EpisodeRecord`)."""
    from embodied.eval.harness import PolicyAgent, run_suite

    records: list[dict[str, Any]] = []
    run_suite(PolicyAgent(policy, "greedy"), suite, on_episode=lambda rec: records.append(dict(rec.__dict__)), **run)
    return records


def score_greedy(
    bundle: str | Path,
    *,
    suite: str,
    tasks: Sequence[int],
    states: int,
    first_state: int,
    num_envs: int,
    image_size: int,
    seed: int,
    workers: int = 1,
    env_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Greedy episodes of the policy ``bundle`` on ``states`` initial states per task from
    ``first_state`` (the tasks' own step limits, one attempt); returns their records as dicts
    (:class:`embodied.eval.harness.EpisodeRecord`). ``workers > 1`` shares the waves among processes."""
    from embodied.eval.parallel import WorkerSpec, default_threads, run_suite_parallel
    from embodied.latency import LatencyConfig

    records: list[dict[str, Any]] = []
    if workers > 1:
        spec = WorkerSpec(
            suite=suite,
            tasks=list(tasks),
            episodes=states,
            num_envs=num_envs,
            image_size=image_size,
            seed=seed,
            attempts=1,
            first_state=first_state,
            latency=LatencyConfig(),
            checkpoint=str(bundle),
            threads=default_threads(workers),
            env_options=dict(env_options or {}),
        )
        run_suite_parallel(spec, workers, on_episode=lambda rec: records.append(dict(rec.__dict__)))
    else:
        import policies

        policy = policies.load(bundle)
        records = greedy_records(
            policy,
            suite,
            tasks=list(tasks),
            episodes=states,
            num_envs=num_envs,
            image_size=image_size,
            seed=seed,
            first_state=first_state,
            check=policy.check_env,
            env_options=env_options,
        )
    return records


def log_probe(out: Path, iteration: int, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Append a probe's episodes to ``out/greedy_episodes.jsonl``; returns its metrics
    ``greedy_success_rate`` (mean over the tasks' rates) and ``greedy_episodes``."""
    with open(out / PROBE_EPISODES, "a") as f:
        for rec in records:
            f.write(json.dumps({"iteration": iteration, **rec}) + "\n")
    rates = [np.mean([r["success"] for r in records if r["task"] == t]) for t in sorted({r["task"] for r in records})]
    return {
        "greedy_success_rate": float(np.mean(rates)) if rates else float("nan"),
        "greedy_episodes": float(len(records)),
    }


def read_probes(out: Path) -> dict[int, list[dict[str, Any]]]:
    """``{iteration: records}`` of a run's probes (a probe repeated after a resume: its last run)."""
    path = Path(out) / PROBE_EPISODES
    probes: dict[int, dict[tuple[int, int], dict[str, Any]]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                probes.setdefault(int(rec["iteration"]), {})[(rec["task"], rec["init_id"])] = rec
    return {it: list(recs.values()) for it, recs in sorted(probes.items())}
