"""The RL workload's rendering (``bench=sim`` and ``bench=libero``): ``step_chunk`` with render on demand
against the same chunks rendering every step.

A chunked policy reads one observation per chunk, so :func:`sims.core.step_chunk` draws only the
observations it returns (the chunk's last one and the final ones of episodes that end inside it).
This times, for each batch size N and chunk size H, random chunks in [-1, 1] from a seeded stream
stepped with two camera views: ``on_demand`` (``step_chunk`` as RL and evaluation call it) and
``every_step`` (``render_every_step=True``: the per-step API's rendering of the same work). The two
variants alternate inside every repeat, each on its own env built alike; a repeat runs
``control_steps`` control steps (whole chunks). Rates are env-steps/s (executed control steps of all
envs per second); the ratio is the median of the per-repeat ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

VARIANTS = ("on_demand", "every_step")


def _run_chunks(env: Any, chunks: int, horizon: int, gen: torch.Generator, every: bool) -> int:
    """Step ``chunks`` random chunks ``[N, horizon, A]``; the env steps executed."""
    n, a = env.num_envs, int(env.action_spec.shape[0])
    steps = 0
    for _ in range(chunks):
        res = env.step_chunk(torch.rand(n, horizon, a, generator=gen) * 2 - 1, render_every_step=every)
        steps += int(res.executed.sum())
    return steps


def time_workload(
    make_env: Callable[[int], Any],
    *,
    num_envs: Sequence[int],
    chunk_sizes: Sequence[int],
    control_steps: int,
    repeats: int,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (N, H): each variant's env-steps/s per repeat and median, and
    ``speedup`` = on_demand / every_step (median of the per-repeat ratios).

    Args:
        make_env: builds an env of N envs with the views to render (called twice per N).
        control_steps: control steps per timed repeat (rounded up to whole chunks).
    """
    rows = []
    for n in num_envs:
        envs = {v: make_env(int(n)) for v in VARIANTS}
        try:
            for v, env in envs.items():  # untimed warm-up: first renders allocate
                env.reset(seed=seed)
                _run_chunks(env, 1, 2, torch.Generator().manual_seed(seed), v == "every_step")
            for h in chunk_sizes:
                chunks = -(-int(control_steps) // int(h))
                rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for rep in range(repeats):
                    for v, env in envs.items():
                        if progress is not None:
                            progress(f"N={n} H={h} {v} repeat {rep + 1}/{repeats}")
                        env.reset(seed=seed + rep)
                        gen = torch.Generator().manual_seed(seed + rep)
                        t0 = time.perf_counter()
                        steps = _run_chunks(env, chunks, int(h), gen, v == "every_step")
                        rates[v].append(steps / (time.perf_counter() - t0))
                ratios = [a / b for a, b in zip(rates["on_demand"], rates["every_step"])]
                rows.append(
                    {
                        "num_envs": int(n),
                        "chunk_size": int(h),
                        "control_steps": chunks * int(h),
                        "repeats": int(repeats),
                        **{f"{v}_env_steps_per_s": statistics.median(r) for v, r in rates.items()},
                        **{f"{v}_runs": [round(x, 3) for x in r] for v, r in rates.items()},
                        "speedup": statistics.median(ratios),
                    }
                )
        finally:
            for env in envs.values():
                env.close()
    return rows


def format_rows(rows: list[dict[str, Any]], label: str) -> str:
    """A markdown table of :func:`time_workload`'s rows."""
    lines = [f"| {label} | N | H | on demand (env-steps/s) | every step | speed-up |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.get('suite', '')} | {r['num_envs']} | {r['chunk_size']} | "
            f"{r['on_demand_env_steps_per_s']:.1f} | {r['every_step_env_steps_per_s']:.1f} | "
            f"{r['speedup']:.2f}x |"
        )
    return "\n".join(lines)


__all__ = ["VARIANTS", "format_rows", "time_workload"]
