"""Does online RL lift a few-shot VLA? The main job from several SFT starts, each against its control.

    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift                 # 3 seeds x {5, 20} demonstrations
    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift --seeds 0 --demos 20 -- sft.steps=400
    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift --anchor         # also the anchor's protocol
    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift --anchor-only    # the anchor's protocol alone
    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift --anchor-only --eval-seeds 1 2  # its last phase: 3 seeds
    .venv/bin/python benchmarks/rl_lift.py --out runs/rl_lift40 --init-from runs/rl_lift -- rl.iterations=40

Every cell is the main job, ``embodied-pipeline seed=S episodes_per_task=D rl.control=true`` in
``OUT/d{D}_s{S}`` (extra arguments after ``--`` are passed to every cell as Hydra overrides): SFT on
D demonstrations, Flow-SDE PPO from it, the frozen-actor control (the same RL run with
``algo.lr=0``), and each policy evaluated on the protocol's states with ``eval.attempts`` episodes
per state. A rerun skips finished cells and resumes an interrupted one. With ``--init-from RUN``
each cell starts from the same cell of an earlier run of this benchmark (its demonstrations, SFT
policy and SFT evaluations copied by ``embodied-pipeline init_from=``; their configuration must
match except for ``rl.*``): another RL setting over the same SFT starts, without repeating SFT.

Writes ``OUT/rl_lift.json`` and ``OUT/rl_lift.csv`` (one row per cell) and, with ``--docs FILE``,
the Markdown table with the verdicts on three criteria:

1. every start below 85% gets a paired RL - SFT interval above 0;
2. no run ends below its start (paired RL - SFT >= 0);
3. per demonstration count, the gain's spread across seeds (sample std) is less than half its mean.

With ``--anchor`` it also runs the anchor's protocol (pi_RL on LIBERO: RL on the very initial states it
is evaluated on, ``rl.init_states=protocol``) on the ``spatial`` suite's pick-and-place tasks 1 and 8,
with the held-out states' success beside it (``ANCHOR_OVERRIDES``; the criterion: a start below 70% ends
at 90% or more). Its RL runs in the phases of ``ANCHOR_PHASES``, each a pipeline run in its own folder
(``OUT/anchor_spatial`` to 80 iterations with the frozen control, then ``OUT/anchor_spatial_it{N}``)
that carries the previous phase's RL on (``init_from=PREV continue_rl=true``) at the phase's ``rl.*``
settings, evaluated at the end of every phase. About five hours on 2 cores; a rerun resumes. One sampling
seed's evaluation of a policy moves by several points: ``--eval-seeds`` evaluates the last finished phase
again with other seeds, and the mean over them decides the criterion.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: a start below this gets a paired RL - SFT interval above 0 (criterion 1)
LOW_START = 0.85
FIELDS = [
    "demos",
    "seed",
    "sft",
    "rl",
    "control",
    "rl_minus_sft",
    "rl_minus_sft_lo",
    "rl_minus_sft_hi",
    "rl_minus_control",
    "rl_minus_control_lo",
    "rl_minus_control_hi",
    "control_minus_sft",
    "sft_protocol",
    "rl_protocol",
    "approx_kl_first",
    "approx_kl",
    "approx_kl_max",
    "clip_fraction",
    "explained_variance",
    "main_minutes",
    "minutes",
]
#: the anchor's protocol on ``spatial`` (``--anchor``): a state-only flow policy (vision at 64 px does not
#: learn these pick-and-place tasks on this scale) from 100 smoothed DART demonstrations per task, RL on
#: the protocol's 50 states per task with a 120-step training limit (the experts take ~70 steps)
ANCHOR_OVERRIDES = [
    "sim.suite=spatial",
    "tasks=[1,8]",
    "sim.cameras=[]",
    "video_tasks=0",
    "policy.cameras=[]",
    "policy.state_obs=privileged",
    "expert_gain=0.35",
    "action_noise=0.1",
    "sft.steps=8000",
    "sft.batch_size=64",
    "rl.init_states=protocol",
    "rl.max_episode_steps=120",
]
ANCHOR_DEMOS = 100  # demonstrations per task of the anchor cell
#: the anchor's RL in phases: (iterations at the phase's end, its ``rl.*`` settings). The first at the
#: pipeline's defaults; then larger minibatches, more epochs and a smaller step; then twice the envs per
#: iteration and twice the minibatch (the same updates per iteration on twice the chunks)
ANCHOR_PHASES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (80, ()),
    (320, ()),
    (640, ("rl.algo.minibatch_size=320", "rl.algo.epochs=4", "rl.algo.lr=5e-6")),
    (880, ("rl.num_envs=80", "rl.algo.minibatch_size=640", "rl.algo.epochs=4", "rl.algo.lr=5e-6")),
)
#: the stages after which an anchor phase is finished
ANCHOR_LAST = ("eval_rl_heldout", "eval_control_heldout")
#: the anchor's criterion: a start below ANCHOR_START ends at ANCHOR_TARGET or more (protocol states)
ANCHOR_START, ANCHOR_TARGET = 0.70, 0.90
#: what an evaluation with another sampling seed (``--eval-seeds``) keeps of the pipeline's own
RESEED_KEYS = (
    "checkpoint",
    "suite",
    "episodes",
    "first_state",
    "num_envs",
    "image_size",
    "attempts",
    "mode",
    "max_steps",
)
#: the anchor's evaluations that ``--eval-seeds`` repeats: (stage, the row's columns ``{prefix}s`` (the
#: readings) and ``{prefix}_mean``, the states it scores)
RESEED_STAGES = (("eval_rl", "rl_seed", "protocol states"), ("eval_rl_heldout", "heldout_rl_seed", "held-out states"))
#: the main job's own stages (the cell adds the control's)
MAIN_STAGES = ("collect", "sft", "eval_sft", "rl", "eval_rl")


def pipeline_command(out: Path, demos: int, seed: int, extra: list[str]) -> list[str]:
    exe = Path(sys.executable).with_name("embodied-pipeline")
    return [str(exe), f"out={out}", f"seed={seed}", f"episodes_per_task={demos}", "rl.control=true", *extra]


def anchor_folder(out: Path, phase: int) -> Path:
    """The run folder of the anchor's ``phase`` (0-based): ``anchor_spatial``, then ``anchor_spatial_it{N}``."""
    return out / ("anchor_spatial" if phase == 0 else f"anchor_spatial_it{ANCHOR_PHASES[phase][0]}")


def anchor_phase_command(out: Path, phase: int, seed: int, start: list[str], extra: list[str]) -> list[str]:
    """The pipeline command of the anchor's ``phase``: the first from ``start`` (its ``init_from=``, if
    any), each later one carrying the previous phase's RL on (its frozen control copied along)."""
    iterations, settings = ANCHOR_PHASES[phase]
    origin = start if phase == 0 else [f"init_from={anchor_folder(out, phase - 1).resolve()}", "continue_rl=true"]
    return pipeline_command(
        anchor_folder(out, phase),
        ANCHOR_DEMOS,
        seed,
        [*ANCHOR_OVERRIDES, f"rl.iterations={iterations}", *settings, *origin, *extra],
    )


def own_minutes(results: dict[str, Any]) -> float:
    """Minutes of the stages a run folder ran itself (not those ``init_from=`` copied)."""
    copied = set((results.get("init_from") or {}).get("stages", []))
    return round(sum(v for k, v in results.get("stage_seconds", {}).items() if k not in copied) / 60, 1)


def reseeded_eval_command(phase: Path, stage: str, seed: int) -> list[str]:
    """``embodied-eval`` of the evaluation ``stage`` of the run folder ``phase`` again, the same policy,
    states and attempts with the sampling seed ``seed``, in ``phase/{stage}_seed{seed}`` (no videos)."""
    cfg = json.loads((phase / stage / "eval_config.json").read_text())
    exe = Path(sys.executable).with_name("embodied-eval")
    keep = [f"{k}={cfg[k]}" for k in RESEED_KEYS if cfg.get(k) is not None]
    return [
        str(exe),
        f"out={phase / f'{stage}_seed{seed}'}",
        *keep,
        f"tasks=[{','.join(map(str, cfg['tasks']))}]",
        f"seed={seed}",
        "videos=none",
    ]


def reseeded_success(phase: Path, stage: str, seed: int | None = None) -> tuple[int, float] | None:
    """``(seed, success over every attempt)`` of ``phase/stage`` (``seed=None``: the pipeline's own
    evaluation, its seed read from it) or of its run with ``seed`` (None before it finished)."""
    folder = phase / (stage if seed is None else f"{stage}_seed{seed}")
    if not (folder / "results.json").is_file():
        return None
    res = json.loads((folder / "results.json").read_text())
    cfg = json.loads((folder / "eval_config.json").read_text())
    suite = res["suites"][cfg["suite"]]
    # pass@1 is the success over every attempt (the table's measure); success_rate counts the first attempts
    return int(cfg["seed"]), float((suite.get("pass_at_k") or [suite["success_rate"]])[0])


def seed_columns(phase: Path, seeds: list[int]) -> dict[str, Any]:
    """The row's columns for the anchor's evaluations over several sampling seeds: per stage of
    :data:`RESEED_STAGES` the readings ``{seed: success}`` and their mean (only where every seed finished)."""
    out: dict[str, Any] = {}
    for stage, prefix, _ in RESEED_STAGES:
        readings = [reseeded_success(phase, stage)] + [reseeded_success(phase, stage, s) for s in seeds]
        if seeds and all(r is not None for r in readings):
            out[f"{prefix}s"] = {seed: rate for seed, rate in readings}
            out[f"{prefix}_mean"] = statistics.fmean(rate for _, rate in readings)
    return out


def largest_kl(metrics: Path) -> float | None:
    """The largest per-iteration approx KL of the iterations that trained the actor, in an RL stage's
    ``metrics.csv`` (None without one): a single update far beyond the target hides in the median."""
    from embodied.runs import read_complete_rows

    _, rows = read_complete_rows(metrics, "iteration")
    kls = [float(r["approx_kl"]) for r in rows if r.get("actor_updated") == "1" and r.get("approx_kl")]
    return max(kls) if kls else None


def _paired_columns(name: str, paired: dict[str, Any]) -> dict[str, Any]:
    """``name``, ``name_lo``, ``name_hi``: a paired comparison's difference and its 95% interval."""
    return {name: paired["difference"], f"{name}_lo": paired["ci95"][0], f"{name}_hi": paired["ci95"][1]}


def cell_row(results: dict[str, Any], demos: int, seed: int, cell: Path | None = None) -> dict[str, Any]:
    """One table row from a finished cell's ``results.json`` (and, with its folder ``cell``, the RL
    stage's ``metrics.csv``): success over every attempt (the paired comparisons' ``before``/``now``),
    the paired differences and the update diagnostics."""
    vs_sft = results["eval_rl"]["comparison"]["paired"]
    vs_control = results["rl_vs_control"]["paired"]
    control_vs_sft = results["eval_control"]["comparison"]["paired"]
    upd = results["rl"].get("updates") or {}
    return {
        "demos": demos,
        "seed": seed,
        "sft": vs_sft["before"],
        "rl": vs_sft["now"],
        "control": vs_control["before"],
        **_paired_columns("rl_minus_sft", vs_sft),
        **_paired_columns("rl_minus_control", vs_control),
        "control_minus_sft": control_vs_sft["difference"],
        "sft_protocol": results["eval_sft"]["success_rate"],
        "rl_protocol": results["eval_rl"]["success_rate"],
        "approx_kl_first": upd.get("approx_kl_first"),
        "approx_kl": upd.get("approx_kl"),
        "approx_kl_max": largest_kl(cell / "rl" / "metrics.csv") if cell is not None else None,
        "clip_fraction": upd.get("clip_fraction"),
        "explained_variance": upd.get("explained_variance"),
        "main_minutes": round(sum(v for k, v in results.get("stage_seconds", {}).items() if k in MAIN_STAGES) / 60, 1),
        "minutes": round(sum(results.get("stage_seconds", {}).values()) / 60, 1),
    }


def states_moved(before: dict[str, Any], now: dict[str, Any]) -> tuple[int, int]:
    """``(better, worse)``: the initial states on which evaluation ``now`` succeeded in more / fewer of
    its attempts than ``before`` (two ``embodied-eval`` results of the same states; (0, 0) without
    per-state outcomes). A policy that moved without direction changes many states both ways."""

    def per_state(res: dict[str, Any]) -> dict[tuple[int, int], int]:
        return {(t["task"], s[0]): s[1] for t in res.get("tasks", []) for s in t.get("state_successes", [])}

    a, b = per_state(before), per_state(now)
    shared = a.keys() & b.keys()
    return sum(b[k] > a[k] for k in shared), sum(b[k] < a[k] for k in shared)


def anchor_row(results: dict[str, Any]) -> dict[str, Any]:
    """The anchor cell's row from its ``results.json``: success over every attempt on the protocol's
    states (which RL trained on) and on the held-out ones, with the paired differences."""
    vs_sft = results["eval_rl"]["comparison"]["paired"]
    vs_control = results["rl_vs_control"]["paired"]
    held = results["eval_rl_heldout"]["comparison"]["paired"]
    held_control = results["rl_vs_control_heldout"]["paired"]
    upd = results["rl"].get("updates") or {}
    better, worse = states_moved(results["eval_sft"], results["eval_rl"])
    return {
        "sft": vs_sft["before"],
        "rl": vs_sft["now"],
        "control": vs_control["before"],
        **_paired_columns("rl_minus_sft", vs_sft),
        **_paired_columns("rl_minus_control", vs_control),
        "states_better": better,
        "states_worse": worse,
        "heldout_sft": held["before"],
        "heldout_rl": held["now"],
        "heldout_control": held_control["before"],
        **_paired_columns("heldout_rl_minus_sft", held),
        "approx_kl": upd.get("approx_kl"),
        "clip_fraction": upd.get("clip_fraction"),
        "iterations": results["rl"].get("iterations"),
        "minutes": round(sum(results.get("stage_seconds", {}).values()) / 60, 1),
    }


def anchor_verdict(row: dict[str, Any]) -> tuple[str, bool, str]:
    """``(criterion, holds, evidence)``: a start below ANCHOR_START ends at ANCHOR_TARGET or more."""
    criterion = f"`spatial`, the anchor's protocol: SFT < {ANCHOR_START:.0%} -> SFT + RL >= {ANCHOR_TARGET:.0%}"
    # one sampling seed's reading of a policy moves by several points: with other seeds measured
    # (--eval-seeds) their mean decides
    final = row.get("rl_seed_mean", row["rl"])
    holds = row["sft"] < ANCHOR_START and final >= ANCHOR_TARGET
    why = f"{row['sft']:.1%} -> {row['rl']:.1%} at {row['iterations']} iterations"
    if "rl_seed_mean" in row:
        why += f" ({final:.1%} over evaluation seeds {', '.join(map(str, row['rl_seeds']))})"
    if row["sft"] >= ANCHOR_START:
        why += f" (the start is not below {ANCHOR_START:.0%})"
    return criterion, holds, why + f"; held-out states {row['heldout_sft']:.1%} -> {row['heldout_rl']:.1%}"


def verdicts(rows: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """``(criterion, holds, evidence)`` for the three criteria of the module docstring."""
    low = [r for r in rows if r["sft"] < LOW_START]
    bad_low = [r for r in low if r["rl_minus_sft_lo"] <= 0]
    out = [
        (
            f"every start below {LOW_START:.0%} gets a paired RL - SFT interval above 0",
            not bad_low,
            f"{len(low) - len(bad_low)} of {len(low)} low starts"
            + ("; fails: " + ", ".join(f"d{r['demos']} s{r['seed']}" for r in bad_low) if bad_low else ""),
        )
    ]
    below = [r for r in rows if r["rl_minus_sft"] < 0]
    out.append(
        (
            "no run ends below its start",
            not below,
            f"{len(rows) - len(below)} of {len(rows)} runs"
            + ("; below: " + ", ".join(f"d{r['demos']} s{r['seed']}" for r in below) if below else ""),
        )
    )
    for demos in sorted({r["demos"] for r in rows}):
        gains = [r["rl_minus_sft"] for r in rows if r["demos"] == demos]
        if len(gains) < 2:
            out.append(
                (
                    f"{demos} demonstrations: spread across seeds < half the mean gain",
                    False,
                    f"{len(gains)} seed: needs at least 2",
                )
            )
            continue
        mean, std = statistics.mean(gains), statistics.stdev(gains)
        out.append(
            (
                f"{demos} demonstrations: spread across seeds < half the mean gain",
                mean > 0 and std < mean / 2,
                f"mean {mean:+.3f}, std {std:.3f} over {len(gains)} seeds",
            )
        )
    return out


def _kl(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


#: a heading in the docs file from which on the text is kept when the table is written again
NOTES_HEADING = "## Notes"


#: the heading of the anchor's section (``--anchor-only --docs`` replaces that section alone)
ANCHOR_HEADING = "## The anchor's protocol on `spatial`"


def anchor_markdown(
    phases: list[dict[str, Any]],
    machine: dict[str, Any] | None,
    measured: str | None = None,
    command: str | None = None,
) -> list[str]:
    """The anchor's section: the last finished phase's table and verdict, every finished phase beside
    (``command``: the benchmark command that ran it, when it ran alone)."""
    pct = lambda x: f"{x:.1%}"  # noqa: E731
    paired = lambda r, k: f"{r[k]:+.3f} [{r[k + '_lo']:+.3f}, {r[k + '_hi']:+.3f}]"  # noqa: E731
    row = phases[-1]
    first = " ".join(anchor_phase_command(Path("OUT"), 0, 0, [], [])[1:])
    lines = [
        ANCHOR_HEADING,
        "",
        "RL on the very initial states it is evaluated on (`rl.init_states=protocol`, pi_RL's LIBERO protocol): "
        "the `spatial` suite's pick-and-place tasks 1 and 8 (two identical cubes), 50 protocol states each, "
        "4 attempts per state; the held-out states (50..99, seen by neither the demonstrations nor RL) beside "
        f"it. The RL runs in {len(ANCHOR_PHASES)} phases, each a pipeline run that carries the previous one's "
        "RL on (`init_from=PREV continue_rl=true`, the frozen control copied along: its actor never moves); "
        f"the first: `embodied-pipeline {first}`; then the same with `rl.iterations=N`, the phase's settings "
        "and `init_from=`, `continue_rl=true`:",
        "",
        "| phase | to iteration | RL settings | protocol | held-out | RL - SFT, protocol [95% CI] | "
        "states better / worse than SFT | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (iterations, settings) in enumerate(ANCHOR_PHASES):
        r = phases[i] if i < len(phases) else None
        cells = (
            f"{pct(r['rl'])} | {pct(r['heldout_rl'])} | {paired(r, 'rl_minus_sft')} | "
            f"{r['states_better']} / {r['states_worse']} | {r['own_minutes']}"
            if r
            else "not run | | | | "
        )
        lines.append(f"| {i + 1} | {iterations} | {' '.join(f'`{a}`' for a in settings) or 'the defaults'} | {cells} |")
    lines.append("")
    if command:
        lines += [f"Command: `{command}`", ""]
    if machine:
        lines += [
            f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} cores ({machine.get('cpu')})"
            + (f"; {measured}." if measured else "."),
            "",
        ]
    lines += [
        f"After phase {len(phases)} of {len(ANCHOR_PHASES)}:",
        "",
        "| states | SFT | SFT + RL | control | RL - SFT [95% CI] |",
        "|---|---|---|---|---|",
        f"| protocol (trained on) | {pct(row['sft'])} | {pct(row['rl'])} | {pct(row['control'])} | "
        f"{paired(row, 'rl_minus_sft')} |",
        f"| held-out | {pct(row['heldout_sft'])} | {pct(row['heldout_rl'])} | {pct(row['heldout_control'])} | "
        f"{paired(row, 'heldout_rl_minus_sft')} |",
        "",
    ]
    for _, column, label in RESEED_STAGES:
        if f"{column}_mean" in row:
            readings = ", ".join(f"{pct(rate)} (seed {seed})" for seed, rate in row[f"{column}s"].items())
            lines += [
                f"SFT + RL on the {label} with other sampling seeds (`--eval-seeds`): {readings}; mean "
                f"**{pct(row[f'{column}_mean'])}**.",
                "",
            ]
    lines += [
        f"RL - control on the protocol states {paired(row, 'rl_minus_control')}; {row['iterations']} iterations, "
        f"approx KL {(row['approx_kl'] or 0):.4f}, clip fraction {(row['clip_fraction'] or 0):.3f} (medians of "
        f"the last phase); {sum(r['own_minutes'] for r in phases):.1f} minutes in all.",
        "",
    ]
    criterion, ok, why = anchor_verdict(row)
    lines += [
        "| criterion | holds | evidence |",
        "|---|---|---|",
        f"| {criterion} | {'yes' if ok else '**no**'} | {why} |",
    ]
    return lines


def replace_anchor_section(old: str, section: list[str]) -> str:
    """The docs text ``old`` with its anchor section (from :data:`ANCHOR_HEADING` to the next ``## ``
    heading) replaced by ``section``; without one, ``section`` goes before the notes (or at the end)."""
    text = "\n".join(section).rstrip("\n") + "\n\n"
    if ANCHOR_HEADING in old:
        start = old.index(ANCHOR_HEADING)
        end = old.find("\n## ", start + len(ANCHOR_HEADING))
        return old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    at = old.find(NOTES_HEADING)
    return old + ("\n" if old and not old.endswith("\n\n") else "") + text if at < 0 else old[:at] + text + old[at:]


def measured_on(cells: list[Path]) -> str | None:
    """The day the newest of the finished ``cells`` wrote its ``results.json`` (``YYYY-MM-DD``), the date a
    table of them was measured on, not the day it was written out; None without one."""
    times = [(c / "results.json").stat().st_mtime for c in cells if (c / "results.json").is_file()]
    return time.strftime("%Y-%m-%d", time.gmtime(max(times))) if times else None


def markdown(
    rows: list[dict[str, Any]],
    command: str,
    machine: dict[str, Any] | None,
    planned: int | None = None,
    anchor: list[dict[str, Any]] | None = None,
    anchor_machine: dict[str, Any] | None = None,
    measured: str | None = None,
    anchor_measured: str | None = None,
) -> str:
    pct = lambda x: f"{x:.1%}"  # noqa: E731
    lines = [
        "# RL lift over few-shot SFT starts",
        "",
        "The main job (`embodied-pipeline`, goal suite, lift the can) from SFT starts of several seeds and "
        "demonstration counts; each RL run against its frozen-actor control (the same run with `algo.lr=0`: "
        "the same seeds, envs, sampling and critic updates). Success is over every attempt (4 episodes per "
        "protocol state with other sampling noise); differences are paired over the 50 states (95% intervals); "
        "approx KL (median / largest) and clip fraction (median) are over the iterations that trained the "
        "actor.",
        "",
        f"Command: `{command}`",
        "",
    ]
    if planned is not None and len(rows) < planned:
        lines += [
            f"Cells measured: {len(rows)} of {planned} (the same command resumes the missing ones); the "
            "verdicts below cover the measured cells only.",
            "",
        ]
    if machine:
        lines += [
            f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} cores ({machine.get('cpu')}), "
            f"torch {machine.get('torch')}, mujoco {machine.get('mujoco')}" + (f"; {measured}." if measured else "."),
            "",
        ]
    lines += [
        "| demos | seed | SFT | SFT + RL | control | RL - SFT [95% CI] | RL - control [95% CI] | "
        "approx KL median / max | clip fraction | main job / cell minutes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["demos"], r["seed"])):
        lines.append(
            f"| {r['demos']} | {r['seed']} | {pct(r['sft'])} | {pct(r['rl'])} | {pct(r['control'])} | "
            f"{r['rl_minus_sft']:+.3f} [{r['rl_minus_sft_lo']:+.3f}, {r['rl_minus_sft_hi']:+.3f}] | "
            f"{r['rl_minus_control']:+.3f} [{r['rl_minus_control_lo']:+.3f}, {r['rl_minus_control_hi']:+.3f}] | "
            f"{(r['approx_kl'] or 0):.4f} / {_kl(r.get('approx_kl_max'))} | {(r['clip_fraction'] or 0):.3f} | "
            f"{r['main_minutes']} / {r['minutes']} |"
        )
    lines += ["", "| criterion | holds | evidence |", "|---|---|---|"]
    lines += [f"| {c} | {'yes' if ok else '**no**'} | {ev} |" for c, ok, ev in verdicts(rows)]
    if anchor:
        lines += [""] + anchor_markdown(anchor, anchor_machine, anchor_measured)
    return "\n".join(lines) + "\n"


def finished_results(cell: Path, last: tuple[str, ...] = ("eval_rl", "eval_control")) -> dict[str, Any] | None:
    """A cell's ``results.json`` once its stages ``last`` are done (None before)."""
    done = cell / "results.json"
    if not done.is_file():
        return None
    results = json.loads(done.read_text())
    return results if set(last) <= set(results["stages_done"]) else None


def command_line(args: argparse.Namespace, extra: list[str]) -> str:
    """The benchmark's command as the docs show it: the options given (the grid's only without
    ``--anchor-only``)."""
    parts = [f"--out {args.out}"]
    if not args.anchor_only:
        parts += ["--seeds", *map(str, args.seeds), "--demos", *map(str, args.demos)]
    parts += ["--anchor-only"] if args.anchor_only else ["--anchor"] if args.anchor else []
    parts += [f"--init-from {args.init_from}"] if args.init_from else []
    parts += ["--eval-seeds", *map(str, args.eval_seeds)] if args.eval_seeds else []
    return "python benchmarks/rl_lift.py " + " ".join(parts + (["--", *extra] if extra else []))


def run_cell(cell: Path, cmd: list[str], label: str) -> bool:
    """Run (or resume) one pipeline cell, its output in ``cell/cell.log``; True when it succeeded."""
    print(f"[rl_lift] {label}: {' '.join(cmd[1:])}", flush=True)
    cell.mkdir(parents=True, exist_ok=True)
    with open(cell / "cell.log", "a") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        print(f"[rl_lift] cell {cell} failed (exit {proc.returncode}); see {cell / 'cell.log'}", flush=True)
    return proc.returncode == 0


def split_overrides(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """``(options, overrides)``: the command line (default ``sys.argv[1:]``) cut at ``--``; what follows
    goes to every pipeline cell as Hydra overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the cells (OUT/d{D}_s{S})")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--demos", type=int, nargs="+", default=[5, 20], help="demonstrations per task")
    ap.add_argument(
        "--anchor",
        action="store_true",
        help="also the anchor's protocol on spatial, in phases (OUT/anchor_spatial, OUT/anchor_spatial_it{N}; "
        "seed 0, the first --seeds)",
    )
    ap.add_argument(
        "--anchor-only", action="store_true", help="the anchor's protocol alone (--anchor without the grid)"
    )
    ap.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="an earlier run of this benchmark whose cells' SFT stages each cell starts from",
    )
    ap.add_argument("--docs", type=Path, default=None, help="write the Markdown table here")
    ap.add_argument("--table-only", action="store_true", help="only collect finished cells into the table")
    ap.add_argument(
        "--eval-seeds",
        type=int,
        nargs="+",
        default=[],
        help="evaluate the anchor's last finished phase again with these sampling seeds, on its protocol "
        "and held-out states (OUT/anchor_spatial_it{N}/eval_rl_seed{S}, eval_rl_heldout_seed{S}); "
        "the mean over them and the pipeline's own decides the anchor's criterion",
    )
    args = ap.parse_args(argv)
    args.anchor = args.anchor or args.anchor_only
    args.out.mkdir(parents=True, exist_ok=True)
    # seed-major: a partial run covers every count
    cells = [] if args.anchor_only else [(d, s) for s in args.seeds for d in args.demos]

    def start(name: str) -> list[str]:
        if args.init_from is None:
            return []
        source = args.init_from.resolve() / name
        if not (source / "results.json").is_file():
            print(f"[rl_lift] {name}: no such cell in {args.init_from}; it runs from its first stage", flush=True)
            return []
        return [f"init_from={source}"]

    rows, machine, finished = [], None, []
    for i, (demos, seed) in enumerate(cells, 1):
        cell = args.out / f"d{demos}_s{seed}"
        if finished_results(cell) is None and not args.table_only:
            run_cell(cell, pipeline_command(cell, demos, seed, [*start(cell.name), *extra]), f"cell {i}/{len(cells)}")
        results = finished_results(cell)
        if results is not None:
            rows.append(cell_row(results, demos, seed, cell))
            machine, finished = results.get("machine", machine), finished + [cell]
            r = rows[-1]
            print(
                f"[rl_lift] d{demos} s{seed}: SFT {r['sft']:.1%} -> RL {r['rl']:.1%} (control {r['control']:.1%}), "
                f"paired RL - SFT {r['rl_minus_sft']:+.3f} [{r['rl_minus_sft_lo']:+.3f}, {r['rl_minus_sft_hi']:+.3f}]",
                flush=True,
            )
    phases: list[dict[str, Any]] = []  # the anchor's finished phases, in order
    anchor_machine, anchor_cells = None, []
    for i, (iterations, _) in enumerate(ANCHOR_PHASES if args.anchor else ()):
        cell = anchor_folder(args.out, i)
        if finished_results(cell, ANCHOR_LAST) is None and not args.table_only:
            run_cell(
                cell,
                anchor_phase_command(args.out, i, args.seeds[0], start(cell.name) if i == 0 else [], extra),
                f"the anchor's protocol on spatial, phase {i + 1}/{len(ANCHOR_PHASES)} (to {iterations} iterations)",
            )
        results = finished_results(cell, ANCHOR_LAST)
        if results is None:
            break
        phases.append(anchor_row(results) | {"own_minutes": own_minutes(results)})
        anchor_machine, anchor_cells = results.get("machine"), anchor_cells + [cell]
        print(f"[rl_lift] anchor, phase {i + 1}: {anchor_verdict(phases[-1])[2]}", flush=True)
    if phases and args.eval_seeds:
        last = anchor_folder(args.out, len(phases) - 1)
        for seed in args.eval_seeds:
            for stage, _, _ in RESEED_STAGES:
                if reseeded_success(last, stage, seed) is None and not args.table_only:
                    run_cell(
                        last,
                        reseeded_eval_command(last, stage, seed),
                        f"the anchor's phase {len(phases)} evaluated again ({stage}, seed {seed})",
                    )
        phases[-1].update(seed_columns(last, args.eval_seeds))
    anchor = phases[-1] if phases else None
    (args.out / "rl_lift.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "verdicts": verdicts(rows) if rows else [],
                "overrides": extra,
                "machine": machine,
                "anchor": anchor,
                "anchor_verdict": anchor_verdict(anchor) if anchor else None,
                "anchor_phases": phases,
                "anchor_overrides": ANCHOR_OVERRIDES if args.anchor else None,
                "anchor_schedule": ANCHOR_PHASES if args.anchor else None,
            },
            indent=2,
        )
    )
    with open(args.out / "rl_lift.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    if phases:
        with open(args.out / "rl_lift_anchor.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(anchor))
            w.writeheader()
            w.writerows({k: json.dumps(v) if isinstance(v, dict) else v for k, v in p.items()} for p in phases)
    if args.docs and rows:
        command = command_line(args, extra)
        old = args.docs.read_text() if args.docs.is_file() else ""
        notes = old[old.index(NOTES_HEADING) :] if NOTES_HEADING in old else ""
        args.docs.write_text(
            markdown(
                rows,
                command,
                machine,
                planned=len(cells),
                anchor=phases,
                anchor_machine=anchor_machine,
                measured=measured_on(finished),
                anchor_measured=measured_on(anchor_cells),
            )
            + ("\n" + notes if notes else "")
        )
        print(f"[rl_lift] table written to {args.docs}")
    elif args.docs and args.anchor_only and phases:  # the grid's table stays; the anchor's section is replaced
        old = args.docs.read_text() if args.docs.is_file() else ""
        args.docs.write_text(
            replace_anchor_section(
                old, anchor_markdown(phases, anchor_machine, measured_on(anchor_cells), command_line(args, extra))
            )
        )
        print(f"[rl_lift] the anchor's section written to {args.docs}")
    for c, ok, ev in (verdicts(rows) if rows else []) + ([anchor_verdict(anchor)] if anchor else []):
        print(f"[rl_lift] {'PASS' if ok else 'FAIL'}: {c} ({ev})")
    return 0 if len(rows) == len(cells) and (len(phases) == len(ANCHOR_PHASES) or not args.anchor) else 1


if __name__ == "__main__":
    raise SystemExit(main())
