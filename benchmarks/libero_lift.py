"""One VLA that sees, for a whole real-LIBERO suite: few-shot SFT, then Flow-SDE PPO in the anchor's
protocol, scored on the path every evaluation runs (greedy: the ODE from the initial noise).

    .venv/bin/python benchmarks/libero_lift.py --out runs/libero_lift --docs docs/results/libero-lift.md
    .venv/bin/python benchmarks/libero_lift.py --out runs/libero_lift --until sft      # the SFT start alone
    .venv/bin/python benchmarks/libero_lift.py --out runs/libero_lift --until rl --rl-iterations 40  # every seed's first phase
    .venv/bin/python benchmarks/libero_lift.py --out runs/libero_lift --table-only --docs docs/results/libero-lift.md

Every cell is a run folder that the same command resumes (hours on 2 cores: run it again in the next
session). Extra arguments after ``--`` go to every pipeline cell as Hydra overrides.

1. ``OUT/sft`` (``embodied-pipeline``): the suite's scripted experts, with DART noise on their executed
   actions, record ``--demos`` demonstrations per task from the training states 25..49; SFT of one flow
   VLA for all tasks (:data:`SFT_OVERRIDES`); its greedy success on the official (task, state) pairs
   (50 per task) and on the held-out states (:func:`sims.suites.heldout_states`).
2. ``OUT/rl_s{S}``, then ``OUT/rl_s{S}_it{N}``: Flow-SDE PPO from that start in phases
   (:data:`PHASES`), each a pipeline run that carries the previous one's RL on (``init_from=``,
   ``continue_rl=true``), trained on the official pairs it is scored on (``rl.init_states=protocol``,
   pi_RL's protocol), the greedy policy probed on them every few iterations (``rl.greedy_every``, so
   the sampled and the greedy success are logged side by side). Seed 0 runs the frozen-actor control
   beside it (``rl.control=true``: the same run with ``algo.lr=0``); ``--rl-seeds`` adds RL seeds over
   the same SFT start. That is the ``small`` recipe; ``--recipe NAME`` runs another of :data:`RECIPES` (its
   own cells, ``OUT/rl_large_s{S}`` for ``large``; the table reports every recipe's finished phases).
   ``--blends SPEC...`` scores policies between SFT and the first phases (:class:`Blend`, cells
   ``OUT/blend_*``): the mean of several runs' updates, or one run's at a share of its step.
3. ``OUT/reference_sft``, ``OUT/reference_rl_it{N}``: ``embodied-eval simulator=robosuite``, real
   LIBERO's own env (robosuite 1.4 in ``.venv-libero``) through the policy server, on
   ``--reference-states`` states of every task; seed 0's RL checkpoint after its last finished phase
   (``N`` iterations: each phase's checkpoint gets its own cells; ``reference_rl_large_it{N}`` for the
   ``large`` recipe) paired with the SFT one.
4. ``OUT/pro_{variant}_sft``, ``OUT/pro_{variant}_rl_it{N}``: LIBERO-PRO's perturbed variants of the
   suite (:data:`PRO_VARIANTS`) in the reference env on ``--pro-states`` states per task, RL paired
   with SFT.

Writes ``OUT/libero_lift.json`` and, with ``--docs``, the table with the issue's criteria
(:func:`verdicts`).

Across sessions and machines: every finished cell is also kept in ``--records`` (default
``benchmarks/records/libero_lift``: its results, evaluations' episodes, metrics and checkpoints; no
dataset, videos or logs: :func:`archive`), and a cell missing from ``OUT`` is restored from there
before anything runs (:func:`restore`). Commit the records folder and the next session goes on from
the last finished cell.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the sibling benchmark's helpers
    sys.path.insert(0, str(ROOT))

from benchmarks.rl_lift import finished_results, measured_on, own_minutes, run_cell, split_overrides, states_moved  # noqa: E402

SUITE = "libero_spatial"
TASKS = list(range(10))
#: the SFT start: every task, two 64 px views and the 8-D LIBERO state (the policy reads no privileged
#: state; the pipeline's critic is a value head on the policy's own detached features), DART noise 0.1,
#: 4000 SFT steps with random shifts of up to 4 px; one greedy episode per official state
SFT_OVERRIDES = [
    f"sim.suite={SUITE}",
    f"tasks=[{','.join(map(str, TASKS))}]",
    "action_noise=0.1",
    "sft.steps=4000",
    "sft.augment_shift=4",
    "eval.attempts=1",
    "video_tasks=1",
]
#: the RL phases: (iterations at the phase's end, its ``rl.*`` settings); 40 envs x 16 chunks per iteration.
#: The greedy probe (50 episodes) costs about as much as four iterations: every 5 iterations while the
#: curve is steep, every 10 after
PHASES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (40, ("rl.greedy_every=5",)),
    (80, ("rl.greedy_every=10",)),
    (120, ("rl.greedy_every=10",)),
    (160, ("rl.greedy_every=10",)),
    (200, ("rl.greedy_every=10",)),
)
#: two env runners of 20 envs: a runner holds one simulator per task its envs run (about 1.4 GB each with
#: LIBERO's 4096 px textures in software GL) and renders on one core, and each runs 5 tasks' envs
#: (:func:`embodied.rllib.env_runner.env_tasks`), so the two sample on both cores (seed 0's first phase, run
#: before, sampled on one runner with all 40 envs: its record's config says so)
RL_OVERRIDES = ["rl.init_states=protocol", "rl.greedy_states=5", "rl.runtime.num_env_runners=2"]


@dataclass(frozen=True)
class Recipe:
    """One RL recipe over the SFT start: its cells are ``OUT/{prefix}_s{S}`` (first phase) and
    ``OUT/{prefix}_s{S}_it{N}``; ``overrides`` go to every phase after :data:`RL_OVERRIDES`. Only the
    recipe with ``control`` runs the frozen-actor control beside its seed 0: with the actor frozen
    (``algo.lr=0``) the greedy policy is the SFT one whatever the batch, so one control serves every recipe."""

    name: str
    prefix: str
    overrides: tuple[str, ...]
    phases: tuple[tuple[int, tuple[str, ...]], ...]
    control: bool
    about: str


#: the recipes, by ``--recipe`` name. ``small``: 640 chunks per iteration in 64-chunk minibatches (20 steps).
#: ``sde2``: ``small`` with each chunk's stochastic denoising step drawn from the first 2 of 5
#: (``algo.sde_steps=2``): a step drawn at the last one, whose injected noise is the smallest and whose
#: log-probability's score the largest, carried 68-77% of a batch's gradient variance on our ``spatial`` suite.
#: ``large``: 2560 chunks per iteration (64 chunks per env) in 640-chunk minibatches (8 steps), the same lr:
#: per sample, each step's gradient noise weighs a tenth as much (the noise scale is about 12,000 chunks)
#: and the actor moves about a third as far; the anchor updates on 24,576 chunks in 2048-chunk minibatches
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("small", "rl", (), PHASES, True, "640 chunks per update, 64-chunk minibatches"),
        Recipe(
            "sde2",
            "rl_sde2",
            ("rl.algo.sde_steps=2",),
            PHASES,
            False,
            "`small`, the stochastic step drawn from the first 2 of 5 denoising steps",
        ),
        Recipe(
            "large",
            "rl_large",
            ("rl.chunks_per_iter=64", "rl.algo.minibatch_size=640"),
            ((40, ("rl.greedy_every=5",)), (80, ("rl.greedy_every=10",)), (120, ("rl.greedy_every=10",))),
            False,
            "2560 chunks per update, 640-chunk minibatches",
        ),
    )
}
DEFAULT_RECIPE = "small"
#: LIBERO-PRO's perturbations scored in the reference env (language, objects, swapped positions)
PRO_VARIANTS = ("lan", "object", "swap")
#: the issue's bars: an SFT start below START, RL at TARGET or more, every RL seed above SEEDS_ABOVE, the
#: reference env within REFERENCE_GAP of our simulator on the same states
START, TARGET, SEEDS_ABOVE, REFERENCE_GAP = 0.70, 0.90, 0.85, 0.10


#: what a cell's record leaves out: the demonstrations (``data/``), videos, plots, TensorBoard events, Ray's
#: session files, the greedy probe's copy of the policy, logs, and the optimizer state of SFT and of the frozen
#: control (neither is resumed once finished; later phases copy the control's policy); RL checkpoints stay (a
#: later phase carries them on)
SKIP_FOLDERS, SKIP_SUFFIXES, SKIP_PREFIXES = (
    {"videos", "plots", "tb", "ray", "greedy_probe"},
    {".mp4", ".log"},
    ("data/", "sft/train_state/", "rl_control/checkpoint/train_state/"),
)
RECORDS = ROOT / "benchmarks" / "records" / "libero_lift"


def _skipped(rel: Path) -> bool:
    """Whether a file of a cell (its path ``rel`` in the cell) stays out of the record."""
    return (
        bool(SKIP_FOLDERS & set(rel.parts[:-1]))
        or rel.suffix in SKIP_SUFFIXES
        or rel.as_posix().startswith(SKIP_PREFIXES)
    )


def archive(cell: Path, records: Path) -> Path:
    """Copy a finished cell into ``records/<cell name>`` (replacing an older copy), without what
    :data:`ARCHIVE_SKIP` names; the record's folder."""
    dest = records / cell.name
    tmp = records / f".{cell.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for path in sorted(cell.rglob("*")):
        if path.is_file() and not path.is_symlink() and not _skipped(path.relative_to(cell)):
            target = tmp / path.relative_to(cell)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def recorded(cell: Path, records: Path) -> bool:
    """Whether ``records`` holds this cell as it is now (the same ``results.json``)."""
    mine, kept = cell / "results.json", records / cell.name / "results.json"
    return kept.is_file() and mine.is_file() and kept.read_bytes() == mine.read_bytes()


def restore(cell: Path, records: Path) -> bool:
    """A cell missing from ``OUT`` (no ``results.json``) copied back from its record; whether it was."""
    src = records / cell.name
    if (cell / "results.json").is_file() or not (src / "results.json").is_file():
        return False
    shutil.copytree(src, cell, dirs_exist_ok=True)
    print(f"[libero_lift] {cell.name}: restored from {src}", flush=True)
    return True


def seed_label(recipe: Recipe, seed: int) -> str:
    """How the tables name a recipe's seed: ``"0"`` for the default recipe's seed 0, ``"0 large"`` for another's."""
    return str(seed) if recipe.name == DEFAULT_RECIPE else f"{seed} {recipe.name}"


def pipeline(out: Path, extra: list[str]) -> list[str]:
    return [str(Path(sys.executable).with_name("embodied-pipeline")), f"out={out}", *extra]


def sft_command(out: Path, demos: int, extra: list[str]) -> list[str]:
    return pipeline(
        out / "sft", [*SFT_OVERRIDES, f"episodes_per_task={demos}", "stages=[collect,sft,eval_sft]", *extra]
    )


def phase_folder(out: Path, seed: int, phase: int, recipe: Recipe = RECIPES[DEFAULT_RECIPE]) -> Path:
    """``OUT/{prefix}_s{seed}`` for the first phase, ``OUT/{prefix}_s{seed}_it{N}`` for the later ones."""
    name = f"{recipe.prefix}_s{seed}"
    return out / (name if phase == 0 else f"{name}_it{recipe.phases[phase][0]}")


def phase_command(
    out: Path, seed: int, phase: int, demos: int, extra: list[str], recipe: Recipe = RECIPES[DEFAULT_RECIPE]
) -> list[str]:
    """The pipeline command of RL seed ``seed``'s ``phase`` of ``recipe``: the first from the SFT cell, each
    later one carrying the previous phase on (the control, where the recipe runs it, copied along)."""
    iterations, settings = recipe.phases[phase]
    start = out / "sft" if phase == 0 else phase_folder(out, seed, phase - 1, recipe)
    return pipeline(
        phase_folder(out, seed, phase, recipe),
        [
            *SFT_OVERRIDES,
            f"episodes_per_task={demos}",
            *RL_OVERRIDES,
            *recipe.overrides,
            f"rl.iterations={iterations}",
            *settings,
            f"rl.seed={seed}",
            f"rl.control={'true' if seed == 0 and recipe.control else 'false'}",
            f"init_from={start.resolve()}",
            *(["continue_rl=true"] if phase else []),
            *extra,
        ],
    )


def eval_command(out: Path, checkpoint: Path, suite: str, episodes: int, *settings: str) -> list[str]:
    """An ``embodied-eval`` run of ``checkpoint`` on every task of ``suite`` at 64 px, without videos."""
    exe = Path(sys.executable).with_name("embodied-eval")
    tasks = f"tasks=[{','.join(map(str, TASKS))}]"
    return [
        str(exe),
        f"out={out}",
        f"checkpoint={checkpoint}",
        f"suite={suite}",
        tasks,
        f"episodes={episodes}",
        "image_size=64",
        "videos=none",
        *settings,
    ]


def reference_command(
    out: Path, name: str, checkpoint: Path, suite: str, states: int, compare: Path | None = None
) -> list[str]:
    compared = [f"compare={compare}"] if compare is not None else []
    return eval_command(out / name, checkpoint, suite, states, "simulator=robosuite", *compared)


def eval_results(folder: Path) -> dict[str, Any] | None:
    path = folder / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def ci(bounds: list[float]) -> str:
    """A 95% interval as the tables print it."""
    return f"[{bounds[0]:+.3f}, {bounds[1]:+.3f}]"


def suite_rate(results: dict[str, Any] | None, suite: str) -> float | None:
    return None if results is None else float(results["suites"][suite]["success_rate"])


def paired(results: dict[str, Any] | None, suite: str) -> dict[str, Any] | None:
    """The paired comparison an ``embodied-eval compare=`` run (or a pipeline evaluation) holds."""
    if results is None:
        return None
    comparison = results.get("comparison") or {}
    comparison = comparison.get(suite, comparison)
    return comparison.get("paired")


def _metrics(path: Path) -> list[dict[str, str]]:
    import csv

    return list(csv.DictReader(open(path))) if path.is_file() else []


def probe_curve(run: Path) -> list[dict[str, float]]:
    """``[{iteration, sampled, greedy[, control]}]``: an RL stage's training success under its sampling
    beside the greedy probe's, at the iterations the probe ran (``rl/metrics.csv``), and the frozen-actor
    control's probe at the same iterations where it ran (``rl_control/metrics.csv``: the probe's own
    spread on a policy that does not move)."""
    control = {
        int(r["iteration"]): float(r["greedy_success_rate"])
        for r in _metrics(run / "rl_control" / "metrics.csv")
        if r.get("greedy_success_rate")
    }
    curve = []
    for r in _metrics(run / "rl" / "metrics.csv"):
        if r.get("greedy_success_rate"):
            it = int(r["iteration"])
            point = {"iteration": it, "sampled": float(r["success_rate"]), "greedy": float(r["greedy_success_rate"])}
            if r.get("greedy_episodes"):
                point["episodes"] = int(float(r["greedy_episodes"]))
            curve.append(point | ({"control": control[it]} if it in control else {}))
    return curve


def sampled_rate(rows: list[dict[str, str]], first: int, last: int, frozen: bool = False) -> dict[str, float] | None:
    """The sampled policy's success in iterations ``first .. last`` of ``metrics.csv`` rows (``frozen``: only
    those whose actor was not updated, the critic's warm-up: the policy the phase started from), over each
    env's first episode since a reset (``fresh_success_rate`` of ``fresh_episodes``: unbiased, see
    :func:`embodied.rllib.env_runner.fresh_episodes`): ``{"rate", "episodes", "ended_rate", "ended_episodes"}``,
    the last two over every episode those iterations ended (``success_rate``, which the cuts bias); None where
    no row logged fresh episodes (runs made before they were)."""
    picked = [
        r
        for r in rows
        if first <= int(r["iteration"]) <= last and not (frozen and float(r.get("actor_updated") or 0) > 0)
    ]
    fresh = [r for r in picked if float(r.get("fresh_episodes") or 0) > 0]
    episodes = sum(float(r["fresh_episodes"]) for r in fresh)
    if not episodes:
        return None
    ended = [r for r in picked if float(r.get("episodes") or 0) > 0]
    ended_episodes = sum(float(r["episodes"]) for r in ended)
    return {
        "rate": sum(float(r["fresh_success_rate"]) * float(r["fresh_episodes"]) for r in fresh) / episodes,
        "episodes": episodes,
        "ended_rate": sum(float(r["success_rate"]) * float(r["episodes"]) for r in ended) / ended_episodes,
        "ended_episodes": ended_episodes,
    }


def probe_flips(run: Path) -> dict[str, int] | None:
    """At the first iteration both RL's and the frozen control's probes ran (``greedy_episodes.jsonl``):
    ``{iteration, states, differ}``, the states whose greedy outcome differs between the two (the same
    states and initial noise; only the weights moved). None without both probes."""

    def outcomes(path: Path) -> dict[int, dict[tuple[int, int], bool]]:
        by_it: dict[int, dict[tuple[int, int], bool]] = {}
        for line in path.read_text().splitlines() if path.is_file() else []:
            r = json.loads(line)
            by_it.setdefault(r["iteration"], {})[(r["task"], r["init_id"])] = bool(r["success"])
        return by_it

    rl, control = outcomes(run / "rl" / "greedy_episodes.jsonl"), outcomes(run / "rl_control" / "greedy_episodes.jsonl")
    common = sorted(rl.keys() & control.keys())
    if not common:
        return None
    a, b = rl[common[0]], control[common[0]]
    shared = a.keys() & b.keys()
    return {"iteration": common[0], "states": len(shared), "differ": sum(a[k] != b[k] for k in shared)}


#: the anchor's chunks per update (RLinf's pi0 on LIBERO: 64 envs x 8 rollout epochs x 48 chunks)
ANCHOR_CHUNKS_PER_UPDATE = 64 * 8 * 48


def update_signal(run: Path, first: int, last: int, minibatch: int) -> dict[str, float] | None:
    """How much of an update is signal, over iterations ``first..last`` of ``run/rl/metrics.csv``: the
    means of approx KL and clip fraction, and of ``grad_cos_first`` (the cosine between two disjoint
    minibatches' actor gradients) with its standard error. For minibatch gradients ``G + noise`` of
    ``minibatch`` chunks, cos ~ |G|^2 / (|G|^2 + tr(Sigma) / minibatch), so ``noise_scale`` =
    ``minibatch * (1 / cos - 1)`` estimates the batch (in chunks) at which signal and noise weigh alike
    (McCandlish et al. 2018's simple noise scale); None where cos <= 0 (noise only, within the estimate)."""
    import statistics

    rows = [r for r in _metrics(run / "rl" / "metrics.csv") if first <= int(r["iteration"]) <= last]
    cos = [float(r["grad_cos_first"]) for r in rows if r.get("grad_cos_first") not in (None, "", "nan")]
    cos = [c for c in cos if not math.isnan(c)]
    if len(cos) < 2:
        return None
    mean = statistics.fmean(cos)
    return {
        "iterations": len(rows),
        "approx_kl": statistics.fmean(float(r["approx_kl"]) for r in rows),
        "clip_fraction": statistics.fmean(float(r["clip_fraction"]) for r in rows),
        "explained_variance": statistics.fmean(float(r["explained_variance"]) for r in rows),
        "grad_cos": mean,
        "grad_cos_se": statistics.stdev(cos) / math.sqrt(len(cos)),
        "noise_scale": minibatch * (1 / mean - 1) if mean > 0 else None,
    }


#: the names of a flow VLA's critic weights in a checkpoint (the policy's value head, or a separate critic)
CRITIC_MARKS = ("value_mlp.", "critic.")


def update_agreement(start: dict[str, Any], ends: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """How far the actor's updates from one start point the same way: ``start`` and each of ``ends`` (label
    -> the weights after an RL run) are checkpoint state dicts (name -> tensor). The actor is every floating
    weight outside the critic (:data:`CRITIC_MARKS`) that some run moved. Returns ``{"relative": {label:
    |d| / |w|}, "cosine": [[a, b, cos(d_a, d_b)], ...]}`` for the updates ``d = end - start`` (``w`` the
    start's moved weights); None with fewer than two runs or nothing moved.

    Were each update a shared direction ``s`` plus independent noise, ``cos(d_a, d_b) ~ |s|^2 / (|d_a| |d_b|)``:
    the share of the updates' squared norm the runs agree on (the rest cancels over runs, and costs the
    policy whatever a random step of that size costs)."""
    import torch

    if len(ends) < 2:
        return None
    names = [
        k
        for k, w in start.items()
        if w.is_floating_point()
        and not any(f".{m}" in f".{k}" for m in CRITIC_MARKS)
        and any(not torch.equal(w, end[k]) for end in ends.values())
    ]
    if not names:
        return None
    scale = float(torch.cat([start[k].flatten().double() for k in names]).norm())
    deltas = {
        label: torch.cat([(end[k].double() - start[k].double()).flatten() for k in names])
        for label, end in ends.items()
    }
    labels = list(deltas)
    return {
        "relative": {label: float(d.norm()) / scale if scale > 0 else None for label, d in deltas.items()},
        "cosine": [
            [a, b, float(deltas[a] @ deltas[b] / (deltas[a].norm() * deltas[b].norm()))]
            for i, a in enumerate(labels)
            for b in labels[i + 1 :]
        ],
    }


def checkpoint_weights(folder: Path) -> dict[str, Any]:
    """A policy checkpoint folder's weights (``model.safetensors``)."""
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@dataclass(frozen=True)
class Blend:
    """A policy between the SFT start and RL: SFT + ``alpha`` x the mean of RL phases' updates (from SFT),
    scored greedy on the official pairs in cell ``OUT/blend_{cell}``. The mean of several runs' updates keeps
    what they share and shrinks their independent parts by the square root of their number (a preview of a
    run with that many times the samples per update); one run's update at ``alpha`` 0.5 tells a first-order
    effect (half the full step's change) from curvature (a quarter of it)."""

    runs: tuple[str, ...]  # finished phase cells, e.g. ``rl_sde2_s1``, ``rl_s0_it80``
    alpha: float = 1.0

    @property
    def cell(self) -> str:
        return "blend_" + "+".join(self.runs) + ("" if self.alpha == 1.0 else f"_x{self.alpha:g}")


def parse_blend(spec: str, cells: dict[str, tuple[str, int]]) -> Blend:
    """``--blends`` spec: ``all`` (every run's first phase) or ``CELL[+CELL...]`` (finished phase cells, e.g.
    ``rl_s0_it80``), either with ``@ALPHA`` (default 1). ``cells``: the finished phase cells -> (the run's
    label, the phase's index)."""
    runs, _, alpha = spec.partition("@")
    try:
        a = float(alpha) if alpha else 1.0
    except ValueError:
        raise SystemExit(f"--blends {spec}: {alpha!r} is not a number (CELL[+CELL...][@ALPHA], e.g. rl_s1@0.5)")
    names = tuple(c for c, (_, i) in cells.items() if i == 0) if runs == "all" else tuple(runs.split("+"))
    unknown = [n for n in names if n not in cells]
    if unknown or not names:
        raise SystemExit(
            f"--blends {spec}: {unknown or 'no run'} is no finished phase; choose among {list(cells)} or 'all'"
        )
    return Blend(names, a)


def blend_weights(start: dict[str, Any], ends: list[dict[str, Any]], alpha: float) -> dict[str, Any]:
    """``start + alpha * mean_i(ends[i] - start)`` for every floating weight ``start`` holds, in float32 (the
    checkpoints' own dtype); any other weight from ``ends[0]``. State dicts name -> tensor."""
    out = {}
    for k, v in ends[0].items():
        if k in start and start[k].is_floating_point():
            mean = sum(e[k].float() - start[k].float() for e in ends) / len(ends)
            out[k] = (start[k].float() + alpha * mean).to(v.dtype).contiguous()
        else:
            out[k] = v
    return out


def write_blend(start: Path, ends: list[Path], alpha: float, dest: Path) -> Path:
    """The checkpoint bundle of :func:`blend_weights` over checkpoint folders, in ``dest`` (config and
    normalization stats from ``ends[0]``, the blend named in its ``extra``)."""
    from safetensors.torch import save_file

    from policies.files import sha256_file, write_atomic

    weights = blend_weights(checkpoint_weights(start), [checkpoint_weights(e) for e in ends], alpha)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(dest / "model.safetensors"))
    shutil.copy(ends[0] / "stats.json", dest / "stats.json")
    meta = json.loads((ends[0] / "config.json").read_text())
    meta["files"]["model.safetensors"] = sha256_file(dest / "model.safetensors")
    meta["extra"] = {
        **meta.get("extra", {}),
        "blend": {"start": str(start), "ends": list(map(str, ends)), "alpha": alpha},
    }
    write_atomic(dest / "config.json", json.dumps(meta, indent=2).encode())
    return dest


def blend_of_cell(name: str) -> Blend | None:
    """The :class:`Blend` a ``blend_*`` cell name stands for."""
    if not name.startswith("blend_"):
        return None
    runs, sep, alpha = name[len("blend_") :].rpartition("_x")
    try:
        return Blend(tuple(runs.split("+")), float(alpha)) if sep else Blend(tuple(alpha.split("+")))
    except ValueError:
        return None


def blend_rows(
    out: Path,
    records: Path,
    sft: dict[str, Any],
    cells: dict[str, tuple[str, int]],
    phases: dict[str, list[dict[str, Any]]],
    specs: list[str],
    run: bool,
) -> list[dict[str, Any]]:
    """Every blend named by ``specs`` (run now where ``run``) or already finished in ``out`` or ``records``:
    ``{"cell", "runs" (labels), "alpha", "success", "difference", "ci95", "states", "full_step"}``, paired
    with SFT over the official pairs; ``full_step`` is the mean of those phases' own RL - SFT."""
    wanted = [parse_blend(s, cells) for s in specs]
    found = {b.cell: b for b in wanted}
    for folder in sorted([*out.glob("blend_*"), *records.glob("blend_*")]):
        b = blend_of_cell(folder.name)
        if b is not None and all(r in cells for r in b.runs):
            found.setdefault(b.cell, b)
    rows = []
    for cell, b in found.items():
        folder = out / cell
        restore(folder, records)
        if run and b in wanted and eval_results(folder) is None:
            if not (folder / "policy" / "config.json").is_file():
                ends = [out / r / "rl" / "checkpoint" / "policy" for r in b.runs]
                write_blend(out / "sft" / "sft" / "ckpt", ends, b.alpha, folder / "policy")
        results = eval_cell(folder, blend_command(folder), f"blend {cell}", records, run and b in wanted)
        if results is None:
            continue
        vs = phase_over_phase(sft["eval_sft"], results["suites"][SUITE])
        rows_of = [phases[cells[r][0]][cells[r][1]] for r in b.runs]
        own = [row["rl_minus_sft"] for row in rows_of]
        rows.append(
            {
                "cell": cell,
                "runs": [f"{cells[r][0]} at {row['iterations']}" for r, row in zip(b.runs, rows_of)],
                "alpha": b.alpha,
                "success": results["suites"][SUITE]["success_rate"],
                **({"difference": vs["difference"], "ci95": vs["ci95"], "states": vs["states"]} if vs else {}),
                "full_step": sum(own) / len(own) if own else None,
            }
        )
    return rows


def blend_command(cell: Path) -> list[str]:
    """The greedy evaluation of a blend on the official pairs, as the pipeline scores SFT and RL."""
    return eval_command(cell, cell / "policy", SUITE, 50, "num_envs=25", "mode=greedy", "seed=0", "attempts=1")


def phase_over_phase(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any] | None:
    """Two greedy evaluations of the same states (``eval_rl`` of consecutive phases): ``{"difference",
    "ci95", "states", "better", "worse"}``, paired over the states both scored (each state's success over
    its attempts), and how many states ended better and worse."""
    from embodied.eval.stats import paired_difference_interval

    def rates(res: dict[str, Any]) -> dict[tuple[int, int], float]:
        return {(t["task"], s[0]): s[1] / s[2] for t in res.get("tasks", []) for s in t.get("state_successes", [])}

    a, b = rates(before), rates(now)
    shared = sorted(a.keys() & b.keys())
    if len(shared) < 2:
        return None
    d, lo, hi = paired_difference_interval([b[k] for k in shared], [a[k] for k in shared])
    better, worse = states_moved(before, now)
    return {"difference": d, "ci95": [lo, hi], "states": len(shared), "better": better, "worse": worse}


def phase_row(
    results: dict[str, Any], folder: Path, since: int = 0, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One finished phase (its iterations after ``since``, where the previous phase ended): greedy success
    on the official pairs (RL, SFT, the control where it ran), on the held-out states, the paired
    differences, the probe's curve and the update diagnostics (:func:`update_signal`); with ``previous`` (the
    previous phase's results) what this phase changed on the official pairs (:func:`phase_over_phase`)."""
    vs_sft = results["eval_rl"]["comparison"]["paired"]
    row: dict[str, Any] = {
        "iterations": results["rl"].get("iterations"),
        "sft": results["eval_sft"]["success_rate"],
        "rl": results["eval_rl"]["success_rate"],
        "rl_minus_sft": vs_sft["difference"],
        "rl_minus_sft_ci": vs_sft["ci95"],
        "minutes": own_minutes(results),
        "env_steps": results["rl"].get("env_steps"),
    }
    held_tasks = {t["task"]: t["success_rate"] for t in (results.get("eval_rl_heldout") or {}).get("tasks", [])}
    row["tasks"] = {
        t["task"]: (t["success_rate"], held_tasks.get(t["task"])) for t in results["eval_rl"].get("tasks", [])
    }
    better, worse = states_moved(results["eval_sft"], results["eval_rl"])
    row.update(states_better=better, states_worse=worse)
    if previous is not None and "eval_rl" in previous:
        row["vs_previous"] = phase_over_phase(previous["eval_rl"], results["eval_rl"])
        row["previous_iterations"] = previous["rl"].get("iterations")
    if "eval_control" in results:
        row["control"] = results["eval_control"]["success_rate"]
        row["rl_minus_control"] = results["rl_vs_control"]["paired"]["difference"]
        row["rl_minus_control_ci"] = results["rl_vs_control"]["paired"]["ci95"]
    if "eval_rl_heldout" in results:
        held = results["eval_rl_heldout"]["comparison"]["paired"]
        row.update(
            heldout_sft=held["before"],
            heldout_rl=held["now"],
            heldout_rl_minus_sft=held["difference"],
            heldout_ci=held["ci95"],
        )
    curve = probe_curve(folder)
    if curve:
        row.update(probe=curve)
    if row["iterations"]:  # the sampled success at the phase's start and over its second half
        rl_rows = _metrics(folder / "rl" / "metrics.csv")
        row["sampled_start"] = sampled_rate(rl_rows, since + 1, row["iterations"], frozen=True)
        row["sampled"] = sampled_rate(rl_rows, (since + row["iterations"]) // 2 + 1, row["iterations"])
    flips = probe_flips(folder)
    if flips:
        row.update(probe_flips=flips)
    upd = results["rl"].get("updates") or {}
    row.update(approx_kl=upd.get("approx_kl"), clip_fraction=upd.get("clip_fraction"))
    rl = (results.get("config") or {}).get("rl")
    if rl:
        row["runners"] = (rl.get("runtime") or {}).get("num_env_runners")
    if rl and row["iterations"]:
        row["chunks_per_update"] = rl["num_envs"] * rl["chunks_per_iter"]
        signal = update_signal(folder, since + 1, row["iterations"], rl["algo"]["minibatch_size"])
        if signal:
            row["signal"] = signal
    return row


def verdicts(
    sft: float | None, seeds: dict[int, dict[str, Any]], reference: dict[str, Any]
) -> list[tuple[str, bool, str]]:
    """``(criterion, holds, evidence)`` for the issue's bars on the last finished phase of each seed."""
    out: list[tuple[str, bool, str]] = []
    first = seeds.get(0)
    if sft is not None:
        out.append((f"SFT below {START:.0%} greedy on the official pairs", sft < START, f"{sft:.1%}"))
    if first is not None:
        lo = first["rl_minus_sft_ci"][0]
        out.append(
            (
                f"RL >= {TARGET:.0%} with a paired interval above 0",
                first["rl"] >= TARGET and lo > 0,
                f"{first['rl']:.1%}, paired {first['rl_minus_sft']:+.3f} [{lo:+.3f}, "
                f"{first['rl_minus_sft_ci'][1]:+.3f}] at {first['iterations']} iterations",
            )
        )
        if "control" in first:
            ctl = first["control"]
            out.append(
                (
                    "the frozen control stays at SFT's level",
                    abs(ctl - first["sft"]) < 0.05,
                    f"control {ctl:.1%} against SFT {first['sft']:.1%}",
                )
            )
    if len(seeds) > 1:
        rates = {s: r["rl"] for s, r in seeds.items()}
        out.append(
            (
                f"every RL seed above {SEEDS_ABOVE:.0%}",
                all(v > SEEDS_ABOVE for v in rates.values()),
                ", ".join(f"seed {s}: {v:.1%}" for s, v in sorted(rates.items())),
            )
        )
    ours, theirs = reference.get("ours_rl"), reference.get("rl")
    if ours is not None and theirs is not None:
        pair = reference.get("paired")
        above = pair is not None and pair["ci95"][0] > 0
        lift = f", paired {pair['difference']:+.3f} {ci(pair['ci95'])}" if pair else ""
        out.append(
            (
                f"the reference env within {REFERENCE_GAP:.0%} of ours on the same states, and above SFT's "
                "(a paired interval above 0)",
                abs(theirs - ours) <= REFERENCE_GAP and above,
                f"reference {theirs:.1%} against SFT {reference.get('sft', float('nan')):.1%}{lift}; ours {ours:.1%}",
            )
        )
    return out


def sft_start(results: dict[str, Any]) -> dict[str, Any]:
    """What the SFT cell did: demonstrations, SFT, and its greedy success per task (official, held-out)."""
    c, s = results.get("collect") or {}, results.get("sft") or {}
    held = {t["task"]: t["success_rate"] for t in (results.get("eval_sft_heldout") or {}).get("tasks", [])}
    return {
        "demos": c.get("episodes"),
        "frames": c.get("frames"),
        "expert_success": c.get("expert_success_rate"),
        "sft_steps": s.get("steps"),
        "final_loss": s.get("final_loss"),
        "parameters": s.get("parameters"),
        "stage_minutes": {k: round(v / 60, 1) for k, v in results.get("stage_seconds", {}).items()},
        "tasks": [
            {"task": t["task"], "name": t["name"], "official": t["success_rate"], "heldout": held.get(t["task"])}
            for t in results["eval_sft"].get("tasks", [])
        ],
    }


def start_lines(start: dict[str, Any], rl: dict[str, Any] | None = None) -> list[str]:
    """The SFT start's section of the table page, per task beside ``rl`` (a :func:`phase_row`: seed 0's last
    finished phase) where one finished."""
    if not start:
        return []
    mins = ", ".join(f"{k} {v}" for k, v in start["stage_minutes"].items())
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    per_task = (rl or {}).get("tasks") or {}
    lines = [
        f"{start['demos']} demonstrations ({start['frames']} frames; the scripted experts succeed "
        f"{start['expert_success']:.1%} of the time under DART noise), {start['sft_steps']} SFT steps of a "
        f"{start['parameters']:,}-parameter flow VLA (final loss {start['final_loss']:.3f}); minutes: {mins}.",
        "",
        *([f"Per task, SFT and then RL (seed 0 at {rl['iterations']} iterations):", ""] if per_task else []),
        f"| task | official pairs{': SFT -> RL' if per_task else ''} | held-out states{': SFT -> RL' if per_task else ''} |",
        "|---|---|---|",
    ]
    for t in start["tasks"]:
        now = per_task.get(t["task"]) or per_task.get(str(t["task"]))
        official, heldout = pct(t["official"]), pct(t["heldout"])
        if now:
            official, heldout = f"{official} -> {pct(now[0])}", f"{heldout} -> {pct(now[1])}"
        lines.append(f"| {t['task']} {t['name']} | {official} | {heldout} |")
    return lines + [""]


def chosen_seed0(report: dict[str, Any]) -> str:
    """The label of the reported recipe's seed 0 in ``report["phases"]``."""
    return seed_label(RECIPES[report.get("recipe", DEFAULT_RECIPE)], 0)


def probe_lines(report: dict[str, Any]) -> list[str]:
    """Seed 0's greedy probe beside its sampled training success and the frozen control's probe."""
    first = report.get("phases", {}).get(chosen_seed0(report)) or []
    curve = first[-1].get("probe", []) if first else []  # a phase carries the earlier ones' metrics on
    if not curve:
        return []
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    lines = [
        "",
        "![Seed 0: sampled and greedy success over RL iterations](../img/libero-lift.png)",
        "",
        "(`docs/img/make_plots.py libero_lift` redraws it from the records.) "
        "The greedy probe (5 official states per task) against the sampled training success, and the frozen-actor "
        "control's probe (seed 0; the control's spread is the probe's own):",
        "",
        "| iteration | sampled (training) | greedy (probe) | greedy (frozen control) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {p['iteration']} | {pct(p['sampled'])} | {pct(p['greedy'])} | {pct(p.get('control'))} |" for p in curve
    ]
    runners = [r.get("runners") for r in first]
    if len(set(runners)) > 1:
        changes = ", ".join(f"{r['iterations']} iterations: {r.get('runners')}" for r in first)
        lines += [
            "",
            "A probe plays its episodes in waves of one env runner's envs, seeded by wave, so its initial noise "
            f"changes with the runner count (phases ending at {changes} runner(s)): probes compare state by state "
            "within a phase, not across that change.",
        ]
    last, flips = curve[-1], first[0].get("probe_flips")
    if last.get("episodes"):
        half = 1.96 * math.sqrt(max(last["greedy"] * (1 - last["greedy"]), 1e-9) / last["episodes"])
        lines += ["", f"One probe is {last['episodes']} episodes: its 95% interval is about ±{half:.0%}."]
        if flips:
            lines[-1] += (
                f" At iteration {flips['iteration']}, {flips['differ']} of its {flips['states']} states already ended "
                "otherwise under RL's weights than under the frozen control's (the same states and initial noise), so "
                "two probes compare nearly unpaired: the probe shows which way the greedy path goes, the evaluations "
                "over all states how far."
            )
    lines += [
        "",
        "The sampled column counts every episode training ended. Each probe resets the envs and cuts the "
        "episodes in progress, more often long ones (failures run to the step limit), so it reads high and "
        "does not compare with the greedy rates (below: with each env's first episode after a reset).",
    ]
    return lines


def sampled_lines(report: dict[str, Any]) -> list[str]:
    """The sampled policy (Flow-SDE's noise, what RL trains) against the greedy path, where a phase logged
    each env's first episode after a reset (:func:`sampled_rate`)."""
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    cell = lambda x: "-" if not x else f"{pct(x['rate'])} of {x['episodes']:.0f} ({pct(x['ended_rate'])})"  # noqa: E731
    rows = []
    for seed, phases in sorted(report.get("phases", {}).items()):
        for i, r in enumerate(phases):
            start, half = r.get("sampled_start"), r.get("sampled")
            if not (start or half):
                continue
            greedy_start = report.get("sft") if i == 0 else phases[i - 1]["rl"]
            rows.append(
                f"| {seed} | {r['iterations']} | {cell(start)} | {pct(greedy_start)} | {cell(half)} | {pct(r['rl'])} |"
            )
    if not rows:
        return []
    return [
        "",
        "## The sampled policy against the greedy path",
        "",
        "RL trains the policy it samples (Flow-SDE: noise injected at one denoising step); evaluation scores the "
        "greedy path. The sampled success here counts each env's first episode after a reset (`fresh_success_rate`, "
        "an unbiased draw), in brackets every episode the same iterations ended (`success_rate`, which the resets "
        "bias upward). At the phase's start the actor is frozen for the critic's warm-up: the policy the phase "
        "started from, under RL's noise.",
        "",
        "| seed | to iteration | sampled at the start (all ended) | greedy at the start | sampled, second half "
        "(all ended) | greedy at the end |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def signal_lines(report: dict[str, Any]) -> list[str]:
    """The mechanism section: how much of each update is signal (:func:`update_signal`), phase by phase."""
    rows = [(seed, r) for seed, phases in sorted(report.get("phases", {}).items()) for r in phases if r.get("signal")]
    if not rows:
        return []
    lines = [
        "",
        "## How much of an update is signal",
        "",
        "Two disjoint minibatches' actor gradients point the same way only as far as they share the true gradient: "
        "their cosine (`grad_cos_first`, every iteration) gives the gradient noise scale, the batch in chunks at "
        "which signal and noise weigh alike (`minibatch x (1/cos - 1)`; `benchmarks/libero_lift.py: update_signal`). "
        "An update far below it moves mostly along noise, and PPO's trust region (the KL and clipping below) is "
        "spent on that noise; there a bigger batch buys fewer, cleaner steps from the same samples but hardly more "
        "progress per sample, so the lift is bounded by the env steps and by the estimator's noise per sample, not "
        "by the update's shape. The estimator sets that noise: a chunk's Flow-SDE score is divided by its step's "
        "injected variance, smallest at the last denoising steps, so where the stochastic step is drawn from "
        f"(`algo.sde_steps`, the `sde2` recipe) moves the noise scale. The anchor updates on {ANCHOR_CHUNKS_PER_UPDATE:,} "
        "chunks.",
        "",
        "| seed | iterations | chunks per update | approx KL | clip fraction | explained variance "
        "| gradient cosine (± s.e.) | noise scale (chunks) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, r in rows:
        g = r["signal"]
        scale = "noise only" if g["noise_scale"] is None else f"{g['noise_scale']:,.0f}"
        lines.append(
            f"| {seed} | {r['iterations']} ({g['iterations']} in the phase) | {r['chunks_per_update']} | "
            f"{g['approx_kl']:.4f} | {g['clip_fraction']:.3f} | {g['explained_variance']:.2f} | "
            f"{g['grad_cos']:+.3f} ± {g['grad_cos_se']:.3f} | {scale} |"
        )
    agree = report.get("agreement")
    if agree:
        its = agree.get("iterations", {})
        runs = ", ".join(
            f"seed {a} at {its.get(a, '?')} iterations: " + ("-" if r is None else f"{r:.1%}")
            for a, r in agree["relative"].items()
        )
        pairs = "; ".join(f"seeds {a} and {b}: {c:+.3f}" for a, b, c in agree["cosine"])
        lines += [
            "",
            "Where the first phases of several runs ended, from the same SFT start: the actor's update "
            f"(its weights' change, the critic left out) against its weights' norm ({runs}), and the cosine "
            f"between two runs' updates ({pairs}). Were each update a shared direction plus independent noise, "
            "the cosine is the share of their squared norm the runs agree on (`update_agreement`); Adam's noise is "
            "not isotropic, so noise alone leaves cosines of a few hundredths either way, and only a cosine well "
            f"above the spread of the pairs (here {min(c for *_, c in agree['cosine']):+.3f} to "
            f"{max(c for *_, c in agree['cosine']):+.3f}) says the runs found one direction.",
        ]
    lines += blend_lines(report.get("blends") or [])
    moved = []
    for seed, phases in sorted(report.get("phases", {}).items()):
        for i, r in enumerate(phases):
            step = r.get("vs_previous") or {}
            better, worse = (step.get("better"), step.get("worse")) if i else (r["states_better"], r["states_worse"])
            if better is not None and better + worse:
                z = (better - worse) / math.sqrt(better + worse)
                start = "SFT" if not i else f"{phases[i - 1]['iterations']} iterations"
                moved.append(
                    f"seed {seed}, {start} to {r['iterations']}: {better} better, {worse} worse (z = {z:+.1f})"
                )
    if moved:
        lines += [
            "",
            "Each phase moves the greedy outcome of many states both ways. Were the update's movement noise alone, "
            "as many would end better as worse; the sign test's z (|z| > 2: a direction) says how far the net lift "
            "stands out of that churn: " + "; ".join(moved) + ".",
        ]
    return lines


def blend_lines(blends: list[dict[str, Any]]) -> list[str]:
    """The blends (:class:`Blend`): SFT plus a share of the runs' updates, scored on the official pairs."""
    if not blends:
        return []
    lines = [
        "",
        "Policies between SFT and RL (`--blends`; `benchmarks/libero_lift.py: Blend`): SFT plus a share of RL "
        "phases' updates (each from SFT to the phase's end). The mean of several runs' updates keeps what they share and shrinks their "
        "independent parts by the square root of their number, as a run with that many times the samples per "
        "update would; one run's update at half its step changes the greedy success by half the full step's "
        "change where the effect is first order, by a quarter where curvature (the cost of a random step) "
        "dominates.",
        "",
        "| updates of | step | official pairs | - SFT [95% CI] | those runs at their full step (mean - SFT) |",
        "|---|---|---|---|---|",
    ]
    for b in blends:
        runs = "mean of seeds " + ", ".join(b["runs"]) if len(b["runs"]) > 1 else f"seed {b['runs'][0]}"
        diff = f"{b['difference']:+.3f} {ci(b['ci95'])}" if "difference" in b else "-"
        full = "-" if b.get("full_step") is None else f"{b['full_step']:+.3f}"
        lines.append(f"| {runs} | {b['alpha']:g} | {b['success']:.1%} | {diff} | {full} |")
    return lines


def recipe_lines(report: dict[str, Any]) -> list[str]:
    """Where more than one recipe has finished phases: what each is (a seed labelled ``"0 large"`` ran
    ``--recipe large``) and which one the criteria judge."""
    recipes = report.get("recipes") or {}
    if len(recipes) < 2:
        return []
    named = "; ".join(f"`{name}`: {about}" for name, about in recipes.items())
    judged = report.get("recipe", DEFAULT_RECIPE)
    return [
        f"RL recipes (`--recipe`; a seed's label names its recipe, none for `{DEFAULT_RECIPE}`): {named}. "
        f"The criteria below judge `{judged}`; the frozen-actor control is `{DEFAULT_RECIPE}`'s (with the actor "
        "frozen, the greedy policy is the SFT one whatever the batch).",
        "",
    ]


def markdown(report: dict[str, Any], command: str) -> str:
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    lines = [
        "# One vision VLA for a real-LIBERO suite, lifted by RL",
        "",
        f"`{SUITE}`, all {len(TASKS)} tasks, one flow VLA that sees (two 64 px views, the 8-D LIBERO state, the "
        "instruction; no privileged state in the policy), few-shot SFT from DART demonstrations, then Flow-SDE "
        "PPO on the official pairs it is scored on (pi_RL's protocol). Every success here is the greedy path "
        "(the ODE from the initial noise), one episode per state; differences are paired over the states.",
        "",
        f"Command: `{command}`",
        "",
    ]
    machine, measured = report.get("machine"), report.get("measured")
    if machine:
        lines += [
            f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} cores ({machine.get('cpu')})"
            + (f"; {measured}." if measured else "."),
            "",
        ]
    lines += [
        f"SFT start: **{pct(report.get('sft'))}** on the official pairs, {pct(report.get('sft_heldout'))} on "
        "the held-out states.",
        "",
        *start_lines(report.get("sft_start") or {}, (report.get("phases", {}).get(chosen_seed0(report)) or [None])[-1]),
        "RL phases finished so far:" if report.get("phases") else "No RL phase has finished yet.",
        "",
        *(
            [
                f"Every figure below is one run of one seed on one machine ({len(report['phases'])} RL seed(s) so "
                "far): an observation, not yet a result.",
                "",
            ]
            if 0 < len(report.get("phases", {})) < 2
            else []
        ),
        *recipe_lines(report),
        "| seed | iterations | env runners | env steps | RL | RL - SFT [95% CI] | control | RL - control [95% CI] "
        "| held-out RL (- SFT) | states better / worse | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, phases in sorted(report.get("phases", {}).items()):
        for r in phases:
            lines.append(
                f"| {seed} | {r['iterations']} | {r.get('runners') or '-'} | {r.get('env_steps') or '-'} | {pct(r['rl'])} | "
                f"{r['rl_minus_sft']:+.3f} "
                f"{ci(r['rl_minus_sft_ci'])} | {pct(r.get('control'))} | "
                + (f"{r['rl_minus_control']:+.3f} {ci(r['rl_minus_control_ci'])}" if "rl_minus_control" in r else "-")
                + f" | {pct(r.get('heldout_rl'))}"
                + (f" ({r['heldout_rl_minus_sft']:+.3f} {ci(r['heldout_ci'])})" if "heldout_ci" in r else "")
                + f" | {r['states_better']} / {r['states_worse']} | {r['minutes']} |"
            )
    steps = [
        f"seed {seed} from {r['previous_iterations']} to {r['iterations']} iterations: "
        f"{r['vs_previous']['difference']:+.3f} {ci(r['vs_previous']['ci95'])} ({r['vs_previous']['better']} states "
        f"better, {r['vs_previous']['worse']} worse)"
        for seed, phases in sorted(report.get("phases", {}).items())
        for r in phases
        if r.get("vs_previous")
    ]
    if steps:
        lines += ["", "What each later phase changed, paired on the official pairs: " + "; ".join(steps) + "."]
    by_count: dict[int, dict[int, Any]] = {}
    for seed, phases in sorted(report.get("phases", {}).items()):
        for r in phases:
            by_count.setdefault(r["iterations"], {})[seed] = r.get("runners")
    mixed = {n: seeds for n, seeds in sorted(by_count.items()) if len(seeds) > 1 and len(set(seeds.values())) > 1}
    for n, seeds in mixed.items():
        lines += [
            "",
            f"At {n} iterations the seeds sampled on different env-runner counts ("
            + ", ".join(f"seed {s}: {c}" for s, c in sorted(seeds.items()))
            + "): the seeds differ in that as well, so their difference is not the seed's alone.",
        ]
    lines += probe_lines(report) + sampled_lines(report) + signal_lines(report)
    ref = report.get("reference") or {}
    if ref:
        lines += [
            "",
            f"In the reference env (robosuite 1.4, {ref.get('states')} states per task): SFT {pct(ref.get('sft'))}, "
            f"RL at {ref.get('rl_iterations')} iterations {pct(ref.get('rl'))}"
            + (f", paired {ref['paired']['difference']:+.3f} {ci(ref['paired']['ci95'])}" if ref.get("paired") else "")
            + f"; ours on the same states: SFT {pct(ref.get('ours_sft'))}, RL {pct(ref.get('ours_rl'))}."
            + "".join(
                f" {name}: the two simulators end {a['agree']} of {a['states']} states alike ({a['ours_only']} "
                f"succeed in ours only, {a['reference_only']} in the reference only)."
                for name, a in (("SFT", ref.get("agree_sft")), ("RL", ref.get("agree_rl")))
                if a
            ),
        ]
    pro = {v: r for v, r in (report.get("pro") or {}).items() if r.get("sft") is not None or r.get("rl") is not None}
    if report.get("pro") and not pro:
        lines.append("LIBERO-PRO's variants: not scored yet.")
    for variant, r in pro.items():
        lines.append(
            f"LIBERO-PRO `{variant}`: SFT {pct(r.get('sft'))} -> RL {pct(r.get('rl'))}"
            + (f", paired {r['paired']['difference']:+.3f} {ci(r['paired']['ci95'])}" if r.get("paired") else "")
            + "."
        )
    lines += ["", "| criterion | holds | evidence |", "|---|---|---|"]
    lines += [f"| {c} | {'yes' if ok else '**no**'} | {ev} |" for c, ok, ev in report.get("verdicts", [])]
    return "\n".join(lines) + "\n"


def state_outcomes(tasks: list[dict[str, Any]], states: int) -> dict[tuple[int, int], bool]:
    """``{(task, init id): success}`` of an evaluation's per-task records (``state_successes``) on the
    first ``states`` states of every task."""
    return {(t["task"], s[0]): s[1] > 0 for t in tasks for s in t.get("state_successes", []) if s[0] < states}


def agreement(ours: dict[str, Any] | None, theirs: dict[str, Any] | None, states: int) -> dict[str, int] | None:
    """How often our simulator and the reference env end the same (task, state) alike: ``{"states",
    "agree", "ours_only", "reference_only"}`` (success in one simulator only) over the states both ran."""
    if ours is None or theirs is None:
        return None
    a = state_outcomes(ours.get("tasks", []), states)
    b = state_outcomes(theirs["suites"][SUITE].get("tasks", []), states)
    common = sorted(a.keys() & b.keys())
    if not common:
        return None
    return {
        "states": len(common),
        "agree": sum(a[k] == b[k] for k in common),
        "ours_only": sum(a[k] and not b[k] for k in common),
        "reference_only": sum(b[k] and not a[k] for k in common),
    }


def ours_on(results: dict[str, Any] | None, states: int) -> float | None:
    """Our simulator's greedy success on the first ``states`` official states of every task, from a pipeline
    evaluation's per-state outcomes (``state_successes``), to set beside the reference env's."""
    if results is None:
        return None
    outcomes = [s[1] > 0 for t in results.get("tasks", []) for s in t.get("state_successes", []) if s[0] < states]
    return sum(outcomes) / len(outcomes) if outcomes else None


def pipeline_cell(
    cell: Path, needed: tuple[str, ...], cmd: list[str], label: str, records: Path, run: bool
) -> dict[str, Any] | None:
    """A pipeline cell's results once its stages ``needed`` are done: restored from ``records``, else (with
    ``run``) run or resumed now and then archived there; None while unfinished."""
    restore(cell, records)
    if run and finished_results(cell, needed) is None:
        run_cell(cell, cmd, label)
    results = finished_results(cell, needed)
    if results is not None and not recorded(cell, records):
        archive(cell, records)
    return results


def eval_cell(cell: Path, cmd: list[str], label: str, records: Path, run: bool) -> dict[str, Any] | None:
    """An ``embodied-eval`` cell's results, as :func:`pipeline_cell` keeps them."""
    restore(cell, records)
    if run and eval_results(cell) is None:
        run_cell(cell, cmd, label)
    results = eval_results(cell)
    if results is not None and not recorded(cell, records):
        archive(cell, records)
    return results


#: the stages that finish a cell: every evaluation with its held-out twin (real LIBERO scores both)
SFT_DONE = ("eval_sft", "eval_sft_heldout")
RL_DONE = ("eval_rl", "eval_rl_heldout")
CONTROL_DONE = ("eval_control", "eval_control_heldout")


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--demos", type=int, default=20, help="DART demonstrations per task")
    ap.add_argument(
        "--rl-seeds", type=int, nargs="+", default=[0, 1], help="RL seeds over the SFT start (0 has the control)"
    )
    ap.add_argument(
        "--rl-iterations",
        type=int,
        default=None,
        help="run each seed's RL phases up to this many iterations (default: all the recipe's phases; later ones "
        "finished already are still reported)",
    )
    ap.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=DEFAULT_RECIPE,
        help="the RL recipe to run, score in the reference env and judge by the criteria (every recipe's "
        "finished phases are reported)",
    )
    ap.add_argument(
        "--blends",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="score SFT + a share of RL updates (Blend): 'all' (the mean of every run's first phase), "
        "CELL[+CELL...] (those phases' mean, e.g. rl_s0_it80+rl_s1_it80), either with @ALPHA (e.g. rl_sde2_s1@0.5); "
        "finished blends are reported",
    )
    ap.add_argument("--reference-states", type=int, default=10, help="states per task in the reference env")
    ap.add_argument("--pro-states", type=int, default=5, help="states per task of each LIBERO-PRO variant")
    ap.add_argument("--until", choices=("sft", "rl", "reference", "pro"), default="pro", help="the last part to run")
    ap.add_argument("--table-only", action="store_true", help="only collect the finished cells")
    ap.add_argument("--docs", type=Path, default=None)
    ap.add_argument("--records", type=Path, default=RECORDS, help="where finished cells are kept (commit it)")
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = ("sft", "rl", "reference", "pro")
    runs = lambda part: not args.table_only and parts.index(part) <= parts.index(args.until)  # noqa: E731
    report: dict[str, Any] = {"suite": SUITE, "demos": args.demos, "overrides": extra, "phases": {}}
    records = args.records
    sft = pipeline_cell(out / "sft", SFT_DONE, sft_command(out, args.demos, extra), "SFT start", records, runs("sft"))
    cells = []
    if sft is not None:
        report.update(
            sft=sft["eval_sft"]["success_rate"],
            machine=sft.get("machine"),
            sft_heldout=(sft.get("eval_sft_heldout") or {}).get("success_rate"),
            sft_start=sft_start(sft),
        )
        cells.append(out / "sft")
    recipe = RECIPES[args.recipe]
    report["recipe"] = recipe.name
    chosen: dict[int, dict[str, Any]] = {}  # the chosen recipe's last finished phase per seed
    seed0: list[tuple[dict[str, Any], Path]] = []  # its seed 0's finished phases, in order
    firsts: dict[str, Path] = {}  # every run's first-phase RL checkpoint, by its label
    phase_cells: dict[str, tuple[str, int]] = {}  # every finished phase's cell name -> (its run's label, index)
    for each in RECIPES.values():  # every recipe's finished phases are reported; only the chosen one runs
        until = args.rl_iterations if args.rl_iterations is not None else each.phases[-1][0]
        for seed in args.rl_seeds if sft is not None else []:
            rows: list[dict[str, Any]] = []
            previous: dict[str, Any] | None = None
            for phase, (iterations, _) in enumerate(each.phases):
                folder = phase_folder(out, seed, phase, each)
                results = pipeline_cell(
                    folder,
                    RL_DONE + (CONTROL_DONE if seed == 0 and each.control else ()),
                    phase_command(out, seed, phase, args.demos, extra, each),
                    f"RL ({each.name}) seed {seed}, phase {phase + 1}/{len(each.phases)} (to {iterations} iterations)",
                    records,
                    runs("rl") and each is recipe and iterations <= until,
                )
                if results is None:
                    break
                rows.append(phase_row(results, folder, rows[-1]["iterations"] if rows else 0, previous))
                phase_cells[folder.name] = (seed_label(each, seed), phase)
                previous = results
                if each is recipe and seed == 0:
                    seed0.append((results, folder))
                cells.append(folder)
            if rows:
                report["phases"][seed_label(each, seed)] = rows
                first = phase_folder(out, seed, 0, each) / "rl" / "checkpoint" / "policy"
                if first.is_dir():
                    firsts[seed_label(each, seed)] = first
                report.setdefault("recipes", {})[each.name] = each.about
                if each is recipe:
                    chosen[seed] = rows[-1]
    if sft is not None and len(firsts) > 1:
        report["agreement"] = update_agreement(
            checkpoint_weights(out / "sft" / "sft" / "ckpt"),
            {label: checkpoint_weights(folder) for label, folder in firsts.items()},
        )
        if report["agreement"]:
            report["agreement"]["iterations"] = {label: report["phases"][label][0]["iterations"] for label in firsts}
    if sft is not None:
        report["blends"] = blend_rows(out, records, sft, phase_cells, report["phases"], args.blends, runs("rl"))
    reference: dict[str, Any] = {}
    if seed0 and sft is not None:
        # the reference env scores seed 0's last finished phase (each phase's checkpoint has its own cells);
        # where those cells have not run, the table reports the latest phase whose cells have
        scored = seed0[-1]
        if not runs("reference"):
            for results, folder in reversed(seed0):
                tag = f"reference_{recipe.prefix}_it{results['rl'].get('iterations')}"
                if eval_cell(out / tag, [], tag, records, False) is not None:
                    scored = (results, folder)
                    break
        rl_ckpt = (scored[1] / "rl" / "checkpoint" / "policy").resolve()
        sft_ckpt = (out / "sft" / "sft" / "ckpt").resolve()
        rl_tag = f"{recipe.prefix}_it{scored[0]['rl'].get('iterations')}"
        for name, ckpt, base in (
            ("reference_sft", sft_ckpt, None),
            (f"reference_{rl_tag}", rl_ckpt, out / "reference_sft"),
        ):
            eval_cell(
                out / name,
                reference_command(out, name, ckpt, SUITE, args.reference_states, base),
                f"{name} in the reference env",
                records,
                runs("reference"),
            )
        reference = {
            "states": args.reference_states,
            "sft": suite_rate(eval_results(out / "reference_sft"), SUITE),
            "rl": suite_rate(eval_results(out / f"reference_{rl_tag}"), SUITE),
            "rl_iterations": scored[0]["rl"].get("iterations"),
            "paired": paired(eval_results(out / f"reference_{rl_tag}"), SUITE),
            "ours_rl": ours_on(scored[0]["eval_rl"], args.reference_states),
            "ours_sft": ours_on(scored[0]["eval_sft"], args.reference_states),
            "agree_sft": agreement(scored[0]["eval_sft"], eval_results(out / "reference_sft"), args.reference_states),
            "agree_rl": agreement(
                scored[0]["eval_rl"], eval_results(out / f"reference_{rl_tag}"), args.reference_states
            ),
        }
        pro: dict[str, Any] = {}
        for variant in PRO_VARIANTS:
            suite = f"{SUITE}_{variant}"
            for tag, ckpt in (("sft", sft_ckpt), (rl_tag, rl_ckpt)):
                name = f"pro_{variant}_{tag}"
                base = out / f"pro_{variant}_sft" if tag == rl_tag else None
                eval_cell(
                    out / name,
                    reference_command(out, name, ckpt, suite, args.pro_states, base),
                    f"LIBERO-PRO {variant}, {tag} policy",
                    records,
                    runs("pro"),
                )
            pro[variant] = {
                "sft": suite_rate(eval_results(out / f"pro_{variant}_sft"), suite),
                "rl": suite_rate(eval_results(out / f"pro_{variant}_{rl_tag}"), suite),
                "paired": paired(eval_results(out / f"pro_{variant}_{rl_tag}"), suite),
            }
        report["pro"] = pro
    report["reference"] = reference
    report["measured"] = measured_on(cells)
    report["verdicts"] = verdicts(report.get("sft"), chosen, reference)
    (out / "libero_lift.json").write_text(json.dumps(report, indent=2))
    command = (
        f"python benchmarks/libero_lift.py --out {out}"
        + (f" --recipe {recipe.name}" if recipe.name != DEFAULT_RECIPE else "")
        + (" -- " + " ".join(extra) if extra else "")
    )
    if args.docs:
        args.docs.write_text(markdown(report, command))
        print(f"[libero_lift] table written to {args.docs}")
    for c, ok, ev in report["verdicts"]:
        print(f"[libero_lift] {'PASS' if ok else 'FAIL'}: {c} ({ev})")
    return 0 if report["verdicts"] and all(ok for _, ok, _ in report["verdicts"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
