"""Success under inference delay (``embodied-bench bench=latency``): execution modes against d.

For every delay d in ``delays`` (control steps, simulated: deterministic) and every mode in
``modes``, the fixed evaluation protocol runs on ``suite``/``tasks`` (``episodes`` initial states
per task): ``sync`` (wait d steps holding still for every chunk), ``async`` (naive: plan from an
observation d steps old, drop the stale actions), ``rtc`` (real-time chunking) with
``checkpoint``, and ``aware`` with ``aware_checkpoint`` (a policy fine-tuned by latency-aware RL,
``embodied-train latency_delays=[...]``). Modes that cannot run a delay (async/rtc/aware need
d < chunk size) are reported as skipped. Quoted per cell: success rate with its 95% Wilson
interval, mean completion time of the successful episodes (control steps, waits included) and the
steps spent holding still. A first pass measures the checkpoint's real inference latency (p50 /
p95 / max per chunk on this machine) and the delay d it implies at the control rate.

Outputs: ``latency.json`` (config, machine, measured latency, every cell), ``latency.csv`` (one row
per mode and d), ``latency.md`` (the table) and ``latency.png`` (success and completion time
against d, one line per mode).
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json


@dataclass
class LatencyBenchConfig(BenchConfig):
    """``bench=latency``: success rate and completion time against the inference delay d."""

    checkpoint: Optional[str] = None  # the policy for sync / async / rtc (rtc: a flow policy)
    aware_checkpoint: Optional[str] = None  # a policy trained with latency_delays (mode aware)
    suite: str = "dynamic"
    tasks: Optional[list[int]] = None  # default: all tasks of the suite
    episodes: int = 20  # fixed initial states per task
    delays: list[int] = field(default_factory=lambda: [0, 2, 4, 8])  # d in control steps
    modes: list[str] = field(default_factory=lambda: ["sync", "async", "rtc", "aware"])
    num_envs: int = 20
    image_size: int = 64
    threshold: Optional[int] = None  # async/rtc request threshold (default max(d, H/2))
    merge: str = "replace"  # async merge rule
    rtc_beta: float = 5.0
    latency_probe_chunks: int = 30  # chunk requests timed for the measured latency (0: skip)


SCHEMA = LatencyBenchConfig


def _measure(policy: Any, suite: str, tasks: list[int], image_size: int, num_envs: int, chunks: int) -> dict[str, Any]:
    """Wall-clock inference latency per chunk of ``policy`` on this machine (greedy, batch num_envs)."""
    import torch

    import sims
    from embodied.latency import LatencyStats
    from policies.io import env_inputs, task_instructions

    stats = LatencyStats()
    with sims.make(
        sims.suites.backend(suite),
        suite=suite,
        num_envs=num_envs,
        seed=0,
        cameras=tuple(policy.config.cameras),
        image_size=image_size,
        state_obs=policy.config.state_obs,
    ) as env:
        obs = env.reset(task_ids=[tasks[i % len(tasks)] for i in range(num_envs)], init_ids=list(range(num_envs)))
        batch = env_inputs(obs, task_instructions(env))
        if policy.config.state_dim != batch["state"].shape[1]:
            return {}
        with torch.no_grad():
            policy.act(batch)  # warm-up
            for _ in range(chunks):
                with stats.time("inference"):
                    policy.act(batch)
    hz = float(policy.config.control_hz)
    return {
        "batch": num_envs,
        "control_hz": hz,
        **stats.summary()["inference"],
        "delay_p50": stats.delay(hz, quantile=50),
        "delay_p95": stats.delay(hz, quantile=95),
    }


def run(cfg: LatencyBenchConfig, out: Path) -> dict[str, Any]:
    import policies
    import sims
    from embodied.eval.harness import PolicyAgent, run_suite
    from embodied.eval.report import aggregate
    from embodied.latency import EXECUTION_MODES, LatencyConfig

    bad = [m for m in cfg.modes if m not in EXECUTION_MODES]
    if bad:
        raise BenchError(f"unknown mode(s) {bad}; choose from {EXECUTION_MODES}")
    if any(m != "aware" for m in cfg.modes) and cfg.checkpoint is None:
        raise BenchError("checkpoint=... is required for the sync / async / rtc modes")
    if "aware" in cfg.modes and cfg.aware_checkpoint is None:
        raise BenchError(
            "mode aware needs aware_checkpoint=... (a policy trained with embodied-train "
            "latency_delays=[...]); or drop it from modes"
        )
    if cfg.suite not in sims.suites.all_names():
        raise BenchError(f"unknown suite {cfg.suite!r}; choose from {sims.suites.all_names()}")
    specs = sims.suites.tasks(cfg.suite)
    tasks = list(range(len(specs))) if cfg.tasks is None else list(cfg.tasks)
    names = {cfg.suite: [t.name for t in specs]}
    base = policies.load(cfg.checkpoint) if cfg.checkpoint else None
    aware = policies.load(cfg.aware_checkpoint) if cfg.aware_checkpoint else None
    measured = (
        _measure(base, cfg.suite, tasks, cfg.image_size, min(cfg.num_envs, 10), cfg.latency_probe_chunks)
        if base is not None and cfg.latency_probe_chunks > 0
        else {}
    )
    cells: list[dict[str, Any]] = []
    for d in cfg.delays:
        for mode in cfg.modes:
            policy = aware if mode == "aware" else base
            lat = LatencyConfig(mode=mode, delay=d, threshold=cfg.threshold, merge=cfg.merge, rtc_beta=cfg.rtc_beta)
            cell: dict[str, Any] = {"mode": mode, "delay": d}
            try:
                lat.check(policy.chunk_size)
                if mode == "rtc" and policy.family != "flow":
                    raise ValueError("rtc needs a flow policy")
            except ValueError as err:
                cells.append({**cell, "skipped": str(err)})
                print(f"d={d} {mode:6s}: skipped ({err})", flush=True)
                continue
            records: list[Any] = []
            t0 = time.perf_counter()
            stats = run_suite(
                PolicyAgent(policy, "greedy", rtc_beta=cfg.rtc_beta),
                cfg.suite,
                tasks=tasks,
                episodes=cfg.episodes,
                num_envs=cfg.num_envs,
                image_size=cfg.image_size,
                seed=cfg.seed,
                latency=lat,
                on_episode=records.append,
                check=policy.check_env,
            )
            res = aggregate(records, [cfg.suite], {cfg.suite: tasks}, names)[cfg.suite]
            done = [r.length for r in records if r.success]
            cell.update(
                success_rate=res["success_rate"],
                ci95=res["ci95"],
                episodes=res["episodes"],
                completion_steps=float(np.mean(done)) if done else None,
                held_steps_per_episode=stats["latency"]["held_steps"] / max(len(records), 1),
                per_task={r["name"]: r["success_rate"] for r in res["tasks"]},
                seconds=round(time.perf_counter() - t0, 1),
            )
            cells.append(cell)
            comp = f"{cell['completion_steps']:.0f}" if done else "-"
            print(
                f"d={d} {mode:6s}: success {res['success_rate']:.1%} [{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}] "
                f"completion {comp} steps, held {cell['held_steps_per_episode']:.1f}/episode",
                flush=True,
            )
    result = {"config": asdict(cfg), "machine": machine_info(), "measured_latency": measured, "cells": cells}
    write_json(out / "latency.json", result)
    with open(out / "latency.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "mode",
                "delay",
                "success_rate",
                "ci_low",
                "ci_high",
                "completion_steps",
                "held_steps_per_episode",
                "episodes",
                "skipped",
            ]
        )
        for c in cells:
            w.writerow(
                [
                    c["mode"],
                    c["delay"],
                    c.get("success_rate", ""),
                    *(c.get("ci95") or ["", ""]),
                    c.get("completion_steps") or "",
                    c.get("held_steps_per_episode", ""),
                    c.get("episodes", ""),
                    c.get("skipped", ""),
                ]
            )
    (out / "latency.md").write_text(markdown(result))
    plot(out / "latency.png", result)
    return result


def markdown(result: dict[str, Any]) -> str:
    cfg, cells = result["config"], result["cells"]
    lines = [
        f"# Success against inference delay: {cfg['suite']} tasks {cfg['tasks']}",
        "",
        f"{cfg['episodes']} fixed initial states per task; simulated delay d in control steps; checkpoint "
        f"`{cfg['checkpoint']}`, latency-aware checkpoint `{cfg['aware_checkpoint']}`.",
        "",
    ]
    m = result.get("measured_latency")
    if m:
        lines += [
            f"Measured inference latency on this machine (batch {m['batch']}): p50 {m['p50'] * 1e3:.1f} ms, "
            f"p95 {m['p95'] * 1e3:.1f} ms, max {m['max'] * 1e3:.1f} ms -> d = {m['delay_p50']} (p50) / "
            f"{m['delay_p95']} (p95) control steps at {m['control_hz']:.0f} Hz.",
            "",
        ]
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    lines += ["| d | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for d in dict.fromkeys(c["delay"] for c in cells):
        row = []
        for mode in modes:
            c = next(c for c in cells if c["delay"] == d and c["mode"] == mode)
            if "skipped" in c:
                row.append("n/a")
            else:
                comp = f"{c['completion_steps']:.0f}" if c["completion_steps"] else "-"
                row.append(f"{c['success_rate']:.0%} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}], {comp} steps")
        lines.append(f"| {d} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Cells: success rate [95% Wilson interval], mean completion time of the successful episodes "
        "(control steps, waiting included). n/a: the mode cannot run that delay (chunk too short).",
        "",
    ]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(c["mode"] for c in result["cells"]):
        pts = [c for c in result["cells"] if c["mode"] == mode and "skipped" not in c]
        if not pts:
            continue
        ds = [c["delay"] for c in pts]
        rate = [c["success_rate"] for c in pts]
        err = np.array([[c["success_rate"] - c["ci95"][0], c["ci95"][1] - c["success_rate"]] for c in pts]).T
        ax1.errorbar(ds, rate, yerr=err, marker="o", capsize=3, label=mode)
        comp = [(c["delay"], c["completion_steps"]) for c in pts if c["completion_steps"]]
        if comp:
            ax2.plot(*zip(*comp), marker="o", label=mode)
    ax1.set(
        xlabel="inference delay d (control steps)",
        ylabel="success rate",
        ylim=(-0.02, 1.02),
        title=f"{result['config']['suite']}: success",
    )
    ax2.set(xlabel="inference delay d (control steps)", ylabel="steps to success", title="completion time")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
