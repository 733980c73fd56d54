"""Self-imitation on real LIBERO: a policy's own successful greedy rollouts as its next training data.

    .venv/bin/python benchmarks/self_imitation.py --start runs/libero_lift/sft --out runs/self_imitation \\
        [--rounds 1] [--arms success all] [--steps 500] [--docs docs/results/self-imitation.md]

Flow-SDE PPO's update is noise at our sample budget (``benchmarks/libero_lift.py``: the gradient of two
disjoint minibatches points the same way with a cosine of about 0). Its signal is the correlation of one
denoising step's injected noise with an episode's success, scored through that step's Gaussian. This
benchmark asks whether the same episodes carry a usable signal when used whole: every round

1. **rollouts**: the round's policy runs greedy (the ODE from random initial noise, what evaluation scores)
   once from each of the protocol's 500 states (50 per task, the states RL trains on under the anchor's
   protocol), its failures kept and flagged (``embodied-collect checkpoint=... init_pool=protocol
   keep_failures=true``, one process per task; other initial noise than the evaluation's);
2. **arms**: SFT continued from the round's policy, its normalisation kept (``stats_from=init``), on

   - ``success``: the successful episodes alone (self-imitation: success-filtered behaviour cloning, the
     reward-weighted regression of a 0/1 reward), and
   - ``all``: every episode, the control (the same sampling and training, the reward ignored);
3. each arm scored greedy on the protocol's states (seed 0, paired per state with the start's
   evaluation, as the pipeline scores SFT and RL) and on the 500 held-out states LIBERO's placement
   initializer sampled, which no rollout started from.

A round after the first starts from the previous round's ``success`` policy (iterated self-imitation, an
online method: each round's data is the current policy's). ``--start`` is a pipeline cell (``sft/ckpt``
and its ``eval_sft`` and ``eval_sft_heldout``). Every step is a folder of ``OUT/round{r}/`` and is skipped
once done (an interrupted collection, SFT or evaluation resumes), so the command resumes across sessions.
Writes ``OUT/self_imitation.json`` and, with ``--docs``, the results page.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the sibling benchmarks' helpers
    sys.path.insert(0, str(ROOT))

from benchmarks.libero_lift import (  # noqa: E402
    SUITE,
    TASKS,
    ci,
    eval_command,
    eval_results,
    paired,
    phase_over_phase,
    suite_rate,
)
from benchmarks.rl_lift import measured_on, run_cell, states_moved  # noqa: E402

#: the held-out states' first init id and count per task (real LIBERO: the 50 its initializer sampled)
HELDOUT_FIRST, STATES = 50, 50


@dataclass(frozen=True)
class Arm:
    """One way to train on a round's rollouts: ``only_successes`` is embodied-sft's setting."""

    name: str
    only_successes: bool
    about: str


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("success", True, "the successful rollouts alone (self-imitation)"),
        Arm("all", False, "every rollout, the reward ignored (control)"),
    )
}


def round_start(out: Path, start: Path, r: int) -> Path:
    """The policy bundle round ``r`` starts from: the start cell's SFT policy, then the last round's
    ``success`` arm."""
    return start / "sft" / "ckpt" if r == 0 else out / f"round{r - 1}" / "success" / "sft" / "ckpt"


def rollout_command(dest: Path, policy: Path, task: int, seed: int) -> list[str]:
    """``embodied-collect`` of ``policy``'s greedy rollouts of ``task``, once from each protocol state
    (``seed``: the noise, a round's for every task; the evaluation's noise is seeded otherwise)."""
    return [
        str(Path(sys.executable).with_name("embodied-collect")),
        f"out={dest}",
        f"suite={SUITE}",
        f"checkpoint={policy}",
        "mode=greedy",
        "init_pool=protocol",
        f"tasks=[{task}]",
        f"episodes_per_task={STATES}",
        f"attempts_per_task={STATES}",
        "keep_failures=true",
        "num_envs=25",
        "num_threads=1",
        f"seed={seed}",
    ]


def sft_command(dest: Path, policy: Path, rollouts: list[Path], arm: Arm, args: argparse.Namespace) -> list[str]:
    """``embodied-sft`` continuing ``policy`` on ``rollouts`` as ``arm`` trains (resumed when begun)."""
    resume = ["resume=true"] if (dest / "train_state").is_dir() else []
    return [
        str(Path(sys.executable).with_name("embodied-sft")),
        f"out={dest}",
        f"data={rollouts[0]}",
        f"extra_data=[{','.join(map(str, rollouts[1:]))}]",
        f"only_successes={str(arm.only_successes).lower()}",
        f"init={policy}",
        "stats_from=init",
        f"steps={args.steps}",
        f"lr={args.lr}",
        f"batch_size={args.batch_size}",
        f"warmup_steps={min(100, args.steps // 10)}",
        f"augment_shift={args.augment_shift}",
        f"save_every={max(50, args.steps // 4)}",
        f"seed={args.seed}",
        *resume,
    ]


def score_command(dest: Path, policy: Path, heldout: bool, compare: Path) -> list[str]:
    """The greedy evaluation of ``policy`` as the pipeline scores SFT and RL, paired with ``compare``."""
    states = [f"first_state={HELDOUT_FIRST}"] if heldout else []
    return eval_command(
        dest, policy, SUITE, STATES, "num_envs=25", "mode=greedy", "seed=0", "attempts=1", *states, f"compare={compare}"
    )


def suite_block(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """An ``embodied-eval`` result's block of the suite (its ``tasks`` with each state's outcomes)."""
    return None if results is None else results["suites"][SUITE]


def collected(folder: Path) -> dict[str, Any] | None:
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def run_round(out: Path, start: Path, r: int, arms: list[Arm], args: argparse.Namespace) -> bool:
    """Round ``r``'s steps not done yet; whether all of them finished."""
    here = out / f"round{r}"
    policy = round_start(out, start, r)
    if not (policy / "config.json").is_file():
        print(f"[self_imitation] round {r}: no policy at {policy} yet", flush=True)
        return False
    rollouts = [here / "rollouts" / f"task{t}" for t in TASKS]
    for t, dest in zip(TASKS, rollouts):
        if collected(dest) is None:
            shutil.rmtree(dest, ignore_errors=True)  # a collection writes its dataset at the end: start it over
            if not run_cell(dest.parent, rollout_command(dest, policy, t, args.seed + 1000 * r), f"rollouts {r}/{t}"):
                return False
    for arm in arms:
        cell = here / arm.name
        if not (cell / "sft" / "sft.json").is_file():
            if not run_cell(cell, sft_command(cell / "sft", policy, rollouts, arm, args), f"{arm.name} sft {r}"):
                return False
    # every arm on the protocol's states before any on the held-out ones: the comparison comes first
    for heldout, name, baseline in ((False, "eval", "eval_sft"), (True, "eval_heldout", "eval_sft_heldout")):
        for arm in arms:
            cell = here / arm.name
            if eval_results(cell / name) is None:
                cmd = score_command(cell / name, cell / "sft" / "ckpt", heldout, start / baseline)
                if not run_cell(cell, cmd, f"{arm.name} {name} {r}"):
                    return False
    return True


def rollout_outcomes(folder: Path) -> dict[tuple[int, int], bool]:
    """``{(task, init id): success}`` of one task's rollouts (the dataset's episode records)."""
    path = folder / "meta" / "embodied" / "episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return {(int(e["suite_task_index"]), int(e["init_id"])): bool(e["success"]) for e in rows}


def rollout_summary(here: Path, start_eval: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The round's rollouts: episodes, successes and success rate (None until every task's is done); with
    ``start_eval`` (an evaluation's suite block; round 0, whose rollouts are the start's policy on the evaluated states with other
    initial noise) also how far they differ from that evaluation state by state: what re-drawing the
    noise alone changes (``churn``: the paired difference, states better and worse)."""
    folders = [here / "rollouts" / f"task{t}" for t in TASKS]
    if any(collected(f) is None for f in folders):
        return None
    outcomes = {k: v for f in folders for k, v in rollout_outcomes(f).items()}
    successes = sum(outcomes.values())
    summary: dict[str, Any] = {
        "episodes": len(outcomes),
        "successes": successes,
        "success_rate": successes / max(len(outcomes), 1),
    }
    if start_eval is not None:
        # the rollouts as an evaluation's block: each state's outcome, one attempt
        tasks: dict[int, list[list[int]]] = {}
        for (t, i), ok in sorted(outcomes.items()):
            tasks.setdefault(t, []).append([i, int(ok), 1])
        block = {"tasks": [{"task": t, "state_successes": states} for t, states in tasks.items()]}
        if (churn := phase_over_phase(start_eval, block)) is not None:
            summary["churn"] = churn
    return summary


def arm_row(out: Path, start: Path, r: int, arm: Arm) -> dict[str, Any] | None:
    """One arm's row once its evaluation on the protocol's states is done (held-out where done)."""
    cell = out / f"round{r}" / arm.name
    res = eval_results(cell / "eval")
    if res is None:
        return None
    sft = json.loads((cell / "sft" / "sft.json").read_text())
    held = eval_results(cell / "eval_heldout")
    base = eval_results(start / "eval_sft")
    better, worse = states_moved(suite_block(base), suite_block(res)) if base else (0, 0)
    return {
        "round": r,
        "arm": arm.name,
        "episodes": sft["episodes"],
        "samples": sft["samples"],
        "steps": sft["steps"],
        "success": suite_rate(res, SUITE),
        "paired": paired(res, SUITE),
        "heldout": suite_rate(held, SUITE),
        "heldout_paired": paired(held, SUITE),
        "better": better,
        "worse": worse,
        "train_minutes": round(sft["train_seconds"] / 60, 1),
    }


def filter_effect(here: Path) -> dict[str, Any] | None:
    """``success`` against ``all`` in one round, paired per protocol state: what the reward's filter adds
    over training on the same rollouts without it (None until both are scored)."""
    blocks = [suite_block(eval_results(here / arm / "eval")) for arm in ("all", "success")]
    return None if None in blocks else phase_over_phase(*blocks)


def report(out: Path, start: Path, rounds: int, arms: list[Arm]) -> dict[str, Any]:
    """Every finished round and arm, and the start's own scores."""
    rows, rollouts, filters = [], {}, {}
    base, held = eval_results(start / "eval_sft"), eval_results(start / "eval_sft_heldout")
    for r in range(rounds):
        summary = rollout_summary(out / f"round{r}", suite_block(base) if r == 0 else None)
        if summary is not None:
            rollouts[r] = summary
        rows += [row for arm in arms if (row := arm_row(out, start, r, arm)) is not None]
        if (effect := filter_effect(out / f"round{r}")) is not None:
            filters[r] = effect
    cells = [out / f"round{r['round']}" / r["arm"] / "eval" for r in rows]
    return {
        "start": str(start),
        "start_success": suite_rate(base, SUITE),
        "start_heldout": suite_rate(held, SUITE),
        "rollouts": rollouts,
        "rows": rows,
        "filter": filters,
        "measured": measured_on(cells),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _diff(p: dict[str, Any] | None) -> str:
    return "-" if not p else f"{p['difference']:+.3f} {ci(p['ci95'])}"


def markdown(rep: dict[str, Any], command: str) -> str:
    """The results page: the rollouts and each arm against the start, paired per state."""
    lines = [
        "# Self-imitation on libero_spatial",
        "",
        f"Measured {rep['measured'] or '-'} with `{command}` (`benchmarks/self_imitation.py`, which says what "
        "each step runs). One policy for the 10 tasks, cameras only; every figure is greedy (the ODE from "
        "random initial noise), one episode per state, from one run on one machine (2 cores, no GPU).",
        "",
        f"Start: `{rep['start']}` at {_pct(rep['start_success'])} on the 500 protocol states, "
        f"{_pct(rep['start_heldout'])} on the 500 held-out states: the SFT start of "
        "[libero-lift.md](libero-lift.md), where Flow-SDE PPO from it is measured.",
        "",
        "| round | rollouts (greedy, other noise) | successes kept | - start's evaluation [95% CI] "
        "| states better / worse |",
        "|---|---|---|---|---|",
    ]
    for r, s in sorted(rep["rollouts"].items(), key=lambda kv: int(kv[0])):
        churn = s.get("churn")
        moved = f"{churn['better']} / {churn['worse']}" if churn else "-"
        lines.append(
            f"| {r} | {_pct(s['success_rate'])} of {s['episodes']} | {s['successes']} | {_diff(churn)} | {moved} |"
        )
    lines += [
        "",
        "Round 0's rollouts are the start's policy on the states its evaluation scores, with other initial "
        "noise: their difference from that evaluation is what re-drawing the noise alone changes, the "
        "churn any change of the weights also re-draws.",
    ]
    lines += [
        "",
        "| round | arm | episodes | samples | SFT steps | protocol | - start [95% CI] | states better / worse "
        "| held-out | - start [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in rep["rows"]:
        lines.append(
            f"| {w['round']} | {w['arm']} | {w['episodes']} | {w['samples']} | {w['steps']} | {_pct(w['success'])} "
            f"| {_diff(w['paired'])} | {w['better']} / {w['worse']} | {_pct(w['heldout'])} "
            f"| {_diff(w['heldout_paired'])} |"
        )
    for r, f in sorted(rep.get("filter", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"\nRound {r}, `success` against `all` (the reward's filter), paired over {f['states']} states: "
            f"{_diff(f)}, {f['better']} states better, {f['worse']} worse."
        )
    lines += [
        "",
        "Arms: " + "; ".join(f"`{a.name}`: {a.about}" for a in ARMS.values()) + ". Samples are the steps "
        "where the policy read its views (one per chunk); the intervals pair each state's outcome with "
        "the start's (`embodied-eval compare=`). Records: `benchmarks/records/self_imitation/` (each "
        "evaluation, the rollouts' outcomes, the `success` policy's bundle, re-evaluable with `embodied-eval`).",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--start", type=Path, required=True, help="pipeline cell: sft/ckpt, eval_sft, eval_sft_heldout")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--steps", type=int, default=500, help="SFT steps per arm and round")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--augment-shift", type=int, default=4)
    p.add_argument("--seed", type=int, default=1, help="rollout noise and SFT seed (evaluation keeps seed 0)")
    p.add_argument("--table-only", action="store_true", help="write the report of what finished, run nothing")
    p.add_argument("--docs", type=Path, help="also write the results page here")
    args = p.parse_args(argv)
    for key in ("rounds", "steps", "batch_size"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start, out = args.start.resolve(), args.out.resolve()
    missing = [
        p
        for p in (start / "sft" / "ckpt" / "config.json", start / "eval_sft", start / "eval_sft_heldout")
        if not p.exists()
    ]
    if missing:
        raise SystemExit(f"--start {start} is not a finished pipeline cell: missing {', '.join(map(str, missing))}")
    arms = [ARMS[a] for a in args.arms]
    ok = True
    if not args.table_only:
        for r in range(args.rounds):
            if not run_round(out, start, r, arms, args):
                ok = False
                break
    rep = report(out, start, args.rounds, arms)
    rep["start"] = str(args.start)  # as given: the page shows the command's own paths
    out.mkdir(parents=True, exist_ok=True)
    (out / "self_imitation.json").write_text(json.dumps(rep, indent=1))
    command = (
        f"python benchmarks/self_imitation.py --start {args.start} --out {args.out} --rounds {args.rounds} "
        f"--steps {args.steps}"
    )
    if args.docs:
        args.docs.write_text(markdown(rep, command))
    print(markdown(rep, command), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
