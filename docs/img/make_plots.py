"""Remake the PNGs under docs/img from the measured records (no run is repeated).

    .venv/bin/python docs/img/make_plots.py            # every plot
    .venv/bin/python docs/img/make_plots.py main_job   # some of them (names: see PLOTS)

Each plot reads the JSON/CSV under benchmarks/records/ (or, where a result has no record, the numbers of
its table in docs/results/, copied below with the page they come from). `libero_frame` renders a
LIBERO scene with our simulator and needs the scene cache (EMBODIED_LIBERO_CACHE); without it the plot
is skipped with a message.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REC = ROOT / "benchmarks" / "records"
OUT = Path(__file__).resolve().parent
SIZE = (6.0, 3.5)  # inches at 100 dpi: 600 x 350 px
DPI = 100

plt.rcParams.update(
    {"font.size": 8, "axes.titlesize": 9, "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False}
)


def _save(fig, name: str, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> None:
    path = OUT / f"{name}.png"
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KB")


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main_job() -> None:
    """The main job at today's defaults: success before/after RL, and the RL stage's training curve."""
    run = REC / "main_job_six_minutes" / "defaults_20it"
    res = json.loads((run / "results.json").read_text())
    rows = _csv(run / "rl" / "metrics.csv")
    fig, (a, b) = plt.subplots(1, 2, figsize=SIZE, gridspec_kw={"width_ratios": [1, 1.6]})
    names, rates, lo, hi = [], [], [], []
    for stage, label in (("eval_sft", "SFT"), ("eval_rl", "SFT + RL")):
        e = res[stage]
        names.append(label)
        rates.append(100 * e["success_rate"])
        lo.append(100 * (e["success_rate"] - e["ci95"][0]))
        hi.append(100 * (e["ci95"][1] - e["success_rate"]))
    a.bar(names, rates, yerr=[lo, hi], capsize=4, color=["#9aa7b8", "#2f6db5"])
    for i, r in enumerate(rates):
        a.text(i, 4, f"{r:.1f}%", ha="center", color="white", fontweight="bold")
    p = res["eval_rl"]["comparison"]["paired"]
    a.set_title(
        f"protocol (50 states), 95% CI\npaired RL - SFT {100 * p['difference']:+.1f}% "
        f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
    )
    a.set_ylabel("success (%)")
    a.set_ylim(0, 100)
    it = [int(r["iteration"]) for r in rows]
    b.plot(
        it,
        [100 * float(r["success_rate"]) for r in rows],
        "o-",
        ms=3,
        color="#2f6db5",
        label="sampled training success",
    )
    warm = res["config"]["rl"]["algo"]["critic_warmup"]
    b.axvspan(0.5, warm + 0.5, color="#dddddd", label="critic warm-up (actor frozen)")
    b.set_xlabel("RL iteration (640 chunks each)")
    b.set_ylabel("success (%)")
    b.set_ylim(40, 100)
    b.set_title(f"Flow-SDE PPO, {res['rl']['env_steps']:,} env steps in {res['stage_seconds']['rl']:.0f} s")
    b.legend(loc="lower right")
    m = res["machine"]
    fig.suptitle(
        f"The main job at its defaults (goal / lift_the_can), {m['cpu_count']}-core {m['cpu']} VM, 2026-12-06",
        fontsize=9,
    )
    _save(fig, "main-job")


def rl_lift_grid() -> None:
    """RL - SFT, paired over the 50 states, per SFT start, in the three goal-task grids."""
    grids = [
        ("rl_lift_4959f6e", "320 chunks x 30 iterations", "#c9a227"),
        ("rl_lift_76e035e", "640 x 30", "#7aa0d4"),
        ("rl_lift_it40", "640 x 40", "#2f6db5"),
    ]
    cells = [(5, 0), (5, 1), (5, 2), (20, 0), (20, 1), (20, 2)]
    fig, ax = plt.subplots(figsize=SIZE)
    for g, (name, label, color) in enumerate(grids):
        rows = {(r["demos"], r["seed"]): r for r in json.loads((REC / name / "rl_lift.json").read_text())["rows"]}
        x = np.arange(len(cells)) + (g - 1) * 0.25
        d = np.array([100 * rows[c]["rl_minus_sft"] for c in cells])
        err = np.array(
            [
                [100 * (rows[c]["rl_minus_sft"] - rows[c]["rl_minus_sft_lo"]) for c in cells],
                [100 * (rows[c]["rl_minus_sft_hi"] - rows[c]["rl_minus_sft"]) for c in cells],
            ]
        )
        ax.errorbar(x, d, yerr=err, fmt="o", ms=4, capsize=2, color=color, label=label)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cells)), [f"{d} demos\nseed {s}" for d, s in cells], fontsize=7)
    ax.set_ylabel("RL - SFT, paired (points, 95% CI)")
    ax.set_title("RL lift over six SFT starts (goal / lift_the_can, 2-core CPU VMs)")
    ax.legend(loc="upper center", ncol=3, fontsize=7)
    ax.set_ylim(-15, 55)
    _save(fig, "rl-lift-grid")


def rl_lift_anchor() -> None:
    """The anchor's protocol on `spatial`: success on the protocol and held-out states over RL iterations."""
    fig, ax = plt.subplots(figsize=SIZE)
    # the first run (Intel Xeon, 2026-12-05/06), carried on by hand: the path the comparison table follows
    first = REC / "rl_lift_76e035e"
    files = [first / "anchor_spatial" / "results.json"] + [
        first / "anchor_spatial_resumed" / f
        for f in (
            "results_160.json",
            "results_240.json",
            "results_320.json",
            "results_400_mb320_e4_lr5e-6.json",
            "results_480_mb320_e4_lr5e-6.json",
            "results_640_mb320_e4_lr5e-6.json",
            "results_720_envs80_mb640_e4_lr5e-6.json",
            "results_800_envs80_mb640_e4_lr5e-6.json",
            "results_880_envs80_mb640_e4_lr5e-6.json",
        )
    ]
    pts = []
    for f in files:
        r = json.loads(f.read_text())
        pts.append(
            (
                r["config"]["rl"]["iterations"],
                r["eval_rl"]["pass_at_k"][0],
                r["eval_rl_heldout"]["pass_at_k"][0],
                r["eval_sft"]["pass_at_k"][0],
                r["eval_sft_heldout"]["pass_at_k"][0],
            )
        )
    it = [0] + [p[0] for p in pts]
    ax.plot(
        it,
        [100 * pts[0][3]] + [100 * p[1] for p in pts],
        "s--",
        ms=3,
        color="#7aa0d4",
        label="first run (Intel): protocol",
    )
    ax.plot(it, [100 * pts[0][4]] + [100 * p[2] for p in pts], "s:", ms=3, color="#c9a227", label="first run: held-out")
    # the one-command run (AMD EPYC, commit b0b4153, 2026-12-06)
    rows = _csv(REC / "rl_lift_anchor_b0b4153" / "rl_lift_anchor.csv")
    it = [0] + [int(r["iterations"]) for r in rows]
    ax.plot(
        it,
        [100 * float(rows[0]["sft"])] + [100 * float(r["rl"]) for r in rows],
        "o-",
        ms=4,
        color="#2f6db5",
        label="one command (AMD): protocol",
    )
    ax.plot(
        it,
        [100 * float(rows[0]["heldout_sft"])] + [100 * float(r["heldout_rl"]) for r in rows],
        "o-",
        ms=4,
        color="#e08a2c",
        label="one command: held-out",
    )
    ax.axhline(90, color="grey", lw=0.8, ls="--")
    ax.text(5, 90.6, "90%: the anchor's target", color="grey")
    for x in (320, 640):
        ax.axvline(x, color="#dddddd", lw=0.8)
    ax.text(330, 95, "from 320: minibatch 320,\n4 epochs, lr 5e-6", fontsize=7, color="grey")
    ax.text(650, 95, "from 640: 80 envs,\nminibatch 640", fontsize=7, color="grey")
    ax.set_xlabel("RL iteration")
    ax.set_ylabel("success over 4 attempts (%)")
    ax.set_ylim(55, 100)
    ax.set_title("The anchor's protocol: spatial tasks 1 + 8, RL on the 100 states it is scored on")
    ax.legend(loc="lower right", fontsize=7)
    _save(fig, "rl-lift-anchor")


def libero_experts() -> None:
    """The scripted experts over the 50 official states: our simulator against LIBERO's own env."""
    ours = json.loads((REC / "libero_experts_states50.json").read_text())
    ref = json.loads((REC / "libero_closed_loop_states50.json").read_text()) + json.loads(
        (REC / "libero_closed_loop_goal50.json").read_text()
    )
    # libero_goal tasks 0 and 7 (the fixture experts) have no record: docs/results/libero-scenes.md's table
    extra_ours = {("libero_goal", 0): 1.0, ("libero_goal", 7): 1.0}
    extra_ref = {("libero_goal", 0): 0.94, ("libero_goal", 7): 1.0}
    ours = {**{(r["suite"], r["task"]): r["success"] for r in ours}, **extra_ours}
    ref = {**{(r["suite"], r["task"]): r["success"] for r in ref}, **extra_ref}
    suites = ["libero_spatial", "libero_object", "libero_goal"]
    fig, axes = plt.subplots(1, 3, figsize=SIZE, sharey=True)
    for ax, s in zip(axes, suites):
        t = np.arange(10)
        ax.bar(t - 0.2, [100 * ours[(s, i)] for i in t], 0.4, color="#2f6db5", label="ours (MuJoCo 4)")
        ax.bar(t + 0.2, [100 * ref[(s, i)] for i in t], 0.4, color="#e08a2c", label="LIBERO's env, closed-loop")
        ax.set_xticks(t)
        ax.set_xlabel("task")
        ax.set_title(s)
        ax.set_ylim(50, 102)
    axes[0].set_ylabel("expert success, 50 official states (%)")
    fig.suptitle("Scripted experts, the env's default contacts (2-core Intel Xeon VM, 2026-12-05)", fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    _save(fig, "libero-experts", rect=(0, 0.06, 1, 1))


def libero_speed() -> None:
    """`embodied-bench bench=libero` on the 2-core Intel Xeon VM, 2026-12-05 (docs/results/libero-scenes.md)."""
    rows = [
        ("LIBERO's env", 71.4, "#e08a2c"),
        ("ours, 32 envs,\nnative\ncontacts", 463.5, "#2f6db5"),
        ("ours, 32 envs,\nreference\ncontacts", 290.8, "#2f6db5"),
        ("LIBERO's env", 6.35, "#e08a2c"),
        ("ours, 8 envs,\n2000 faces", 35.6, "#2f6db5"),
        ("ours, 8 envs,\n500 faces,\nno MSAA", 72.9, "#2f6db5"),
    ]
    fig, ax = plt.subplots(figsize=SIZE)
    x = np.arange(len(rows))
    ax.bar(x, [r[1] for r in rows], color=[r[2] for r in rows])
    for i, r in enumerate(rows):
        ax.text(i, r[1] * 1.08, f"{r[1]:g}", ha="center")
    ax.set_yscale("log")
    ax.set_ylim(3, 1000)
    ax.set_xticks(x, [r[0] for r in rows], fontsize=7)
    ax.text(1, 700, "no cameras", ha="center", color="grey")
    ax.text(4, 700, "two 128 px views", ha="center", color="grey")
    ax.axvline(2.5, color="#dddddd")
    ax.set_ylabel("env steps/s (log)")
    ax.set_title(
        "libero_spatial 0: LIBERO's env against ours, without and with cameras\n(2-core Intel Xeon VM, 2026-12-05)"
    )
    _save(fig, "libero-speed")


def libero_frame() -> None:
    """libero_spatial task 0, init state 0, as the policy sees it: the two 64 px views of our simulator."""
    if not os.environ.get("EMBODIED_LIBERO_CACHE"):
        print("libero_frame: skipped (set EMBODIED_LIBERO_CACHE to an exported scene cache)")
        return
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("EMBODIED_LIBERO_AUTO_EXPORT", "0")
    try:
        import sims

        env = sims.make(
            "mujoco", suite="libero_spatial", tasks=[0], num_envs=1, cameras=("agentview", "wrist"), image_size=64
        )
        obs = env.reset(init_ids=[0])
    except Exception as e:  # noqa: BLE001 - a missing or stale cache: say so and go on
        print(f"libero_frame: skipped ({type(e).__name__}: {e})")
        return
    views = np.asarray(obs["rgb"])[0]  # [V, H, W, 3] uint8
    env.close() if hasattr(env, "close") else None
    scale = 4  # 64 px -> 256 px, nearest neighbour
    big = [v.repeat(scale, 0).repeat(scale, 1) for v in views]
    gap = np.full((big[0].shape[0], 8, 3), 255, np.uint8)
    path = OUT / "libero-frame.png"
    plt.imsave(path, np.concatenate([big[0], gap, big[1]], axis=1))
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KB")


def libero_lift() -> None:
    """benchmarks/libero_lift.py, seed 0: the sampled training success, the greedy probe of RL and of the frozen
    control over RL iterations, and every finished phase's greedy success on all official pairs, beside the
    other runs' from the same SFT start (seeds, recipes)."""
    lift = REC / "libero_lift"
    cells = sorted(lift.glob("rl_s0*"), key=lambda c: int(c.name.partition("_it")[2] or 0))
    rows = {int(r["iteration"]): r for c in cells for r in _csv(c / "rl" / "metrics.csv")}
    control = {int(r["iteration"]): r for r in _csv(lift / "rl_s0" / "rl_control" / "metrics.csv")}
    fig, ax = plt.subplots(figsize=SIZE)
    it = sorted(rows)
    # an iteration ends only 20-30 episodes: the sampled success over the last 5 iterations' episodes, from the
    # 5th (an episode outlasts an iteration, so the first iterations end only the quick successes)
    ended = [float(rows[i]["episodes"]) for i in it]
    won = [float(rows[i]["success_rate"]) * e for i, e in zip(it, ended)]
    smooth = [100 * sum(won[max(0, k - 4) : k + 1]) / max(sum(ended[max(0, k - 4) : k + 1]), 1) for k in range(len(it))]
    ax.plot(
        it[4:], smooth[4:], color="#999999", lw=1, label="sampled (every ended episode, last 5 iterations; reads high)"
    )
    for runs, color, label in (
        (rows, "#2f6db5", "greedy probe: RL"),
        (control, "#e08a2c", "greedy probe: frozen control"),
    ):
        pts = [i for i in sorted(runs) if runs[i].get("greedy_success_rate")]
        ax.plot(pts, [100 * float(runs[i]["greedy_success_rate"]) for i in pts], "o-", ms=3, color=color, label=label)
    sft = json.loads((lift / "sft" / "results.json").read_text())["eval_sft"]["success_rate"]
    ends = [(0, sft)] + [
        (r["rl"]["iterations"], r["eval_rl"]["success_rate"])
        for r in (json.loads((c / "results.json").read_text()) for c in cells)
        if "eval_rl" in r
    ]
    ax.plot(
        [e[0] for e in ends],
        [100 * e[1] for e in ends],
        "D-",
        ms=5,
        color="#1b3f73",
        label="greedy, 500 official pairs",
    )
    # the other runs from the same SFT start (more seeds, other recipes): their greedy success on the 500 pairs
    others: dict[str, list[tuple[int, float]]] = {}
    for c in sorted(lift.glob("rl_*s[0-9]*")):
        run = c.name.partition("_it")[0]
        if run == "rl_s0" or not (c / "results.json").is_file():
            continue
        r = json.loads((c / "results.json").read_text())
        if "eval_rl" in r:
            others.setdefault(run, []).append((r["rl"]["iterations"], r["eval_rl"]["success_rate"]))
    shades = ["#7a7a7a", "#2a9d5b", "#a23b72", "#c9a227", "#5b4fa3"]
    for (run, pts), color in zip(sorted(others.items()), shades):
        recipe, _, seed = run[len("rl_") :].rpartition("s")
        name = f"seed {seed}" + (f", {recipe.rstrip('_')}" if recipe else "")
        pts = [(0, sft)] + sorted(pts)
        ax.plot(
            [x for x, _ in pts],
            [100 * y for _, y in pts],
            "s--",
            ms=4,
            lw=1,
            color=color,
            label=f"greedy, 500 pairs: {name}",
        )
    ax.axhline(90, color="grey", lw=0.8, ls="--")
    ax.text(1, 90.6, "90%: the target", color="grey")
    ax.axvline(40, color="#dddddd", lw=0.8)
    ax.text(41, 95, "from 40: two env runners\n(the probe's noise changes)", fontsize=7, color="grey")
    ax.set_xlabel("RL iteration (640 chunks each)")
    ax.set_ylabel("success (%)")
    ax.set_ylim(20, 100)
    ax.set_title("libero_spatial, one vision VLA for 10 tasks: Flow-SDE PPO from few-shot SFT")
    ax.legend(loc="lower right", fontsize=7)
    _save(fig, "libero-lift")


PLOTS = {
    "main_job": main_job,
    "rl_lift_grid": rl_lift_grid,
    "rl_lift_anchor": rl_lift_anchor,
    "libero_experts": libero_experts,
    "libero_speed": libero_speed,
    "libero_frame": libero_frame,
    "libero_lift": libero_lift,
}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(PLOTS):
        PLOTS[name]()
