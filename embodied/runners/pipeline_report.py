"""The pipeline's ``report.md`` pieces: one renderer per section (lines of markdown from ``results.json``)
and the plot. Which sections a report has, in which order, the stages decide
(:func:`embodied.runners.pipeline_stages.write_report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from embodied.runs import cpu_summary


def origin_section(results: dict[str, Any]) -> list[str]:
    """The title, and where copied stages came from (``init_from`` / ``continue_rl``)."""
    cfg = results["config"]
    lines = [f"# Pipeline run: suite `{cfg['sim']['suite']}`, tasks {results.get('tasks')}", ""]
    start = results.get("init_from")
    if start:
        lines += [
            f"Stages {', '.join(start['stages'])} were copied from the run `{start['run']}` "
            "(`init_from=`: the same configuration except `rl.*`); their figures and times are that run's."
        ]
        if start.get("rl_from_iteration") is not None:
            lines += [
                f"RL carried that run's RL on from its iteration {start['rl_from_iteration']} "
                "(`continue_rl=true`: its checkpoint and metrics, then this run's `rl.*` settings)."
            ]
        lines += [""]
    return lines


def collect_section(c: dict[str, Any]) -> list[str]:
    lines = [
        "## 1. Demonstrations from the scripted experts",
        "",
        f"{c['episodes']} episodes, {c['frames']} frames in {c['wall_s']:.1f} s "
        f"({c['frames_per_s']:.0f} frames/s with rendering), dataset `{c['dataset']}` (LeRobot v3.0 layout). "
        f"Mean expert success: **{c['expert_success_rate']:.1%}**.",
        "",
        "| task | instruction | success | attempts | kept |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t['task']} {t['name']} | {t['instruction']} | {t['success_rate']:.0%} | {t['attempts']} | "
        f"{t['episodes']} |"
        for t in c["tasks"]
    ]
    lines.append("")
    if c["video"]:
        lines += [f"Video: [{c['video']}]({c['video']}) ({c['video_frames']} frames)", ""]
    return lines


def sft_section(s: dict[str, Any]) -> list[str]:
    return [
        "## 2. Supervised fine-tuning",
        "",
        f"{s['family']} VLA ({s['parameters']:,} parameters), {s['steps']} steps on {s['episodes']} "
        f"demonstrations ({s['samples']} chunks) in {s['train_seconds']:.0f} s, final loss "
        f"{s['final_loss']:.4f}; bundle `{s['checkpoint']}`.",
        "",
    ]


def _init_states_text(rl: dict[str, Any], suite: str) -> str:
    if rl.get("init_states") == "protocol":
        return (
            " Trained on the evaluation's own 50 initial states per task (rl.init_states=protocol): "
            "the evaluation below scores states RL has seen."
        )
    if suite.startswith("libero_"):
        return (
            " Trained on LIBERO's states 25..49 (rl.init_states=random): the protocol's evaluation below "
            "includes them, the held-out one (states 50..99, sampled by LIBERO's placement initializer) "
            "does not."
        )
    return (
        " Trained on other initial states than the evaluation's (rl.init_states=random): the "
        "evaluation below is held out."
    )


def rl_section(rl: dict[str, Any], suite: str) -> list[str]:
    split = rl.get("time_split_s") or {}
    lines = [
        "## 3. Online RL",
        "",
        f"{rl['algo']} for {rl['iterations']} iterations: {rl['env_steps']:,} env steps in {rl['wall_s']:.0f} s "
        f"({rl['env_steps_per_s']} env-steps/s in the training loop)."
        + (
            f" Time split: the sampler spent {split['sim_s']:.0f} s simulating and {split['inference_s']:.0f} s "
            f"in inference, the learner {split['learn_s']:.0f} s; the driver waited {split['wait_s']:.0f} s "
            "for samples (the sampling that learning did not hide)."
            if split
            else ""
        )
        + f" Metrics `{rl['metrics']}`, bundle `{rl['checkpoint']}`."
        + _init_states_text(rl, suite),
        "",
    ]
    u = rl.get("updates") or {}
    if u:
        lines += [
            f"Updates (medians over the {u['actor_iterations']} iterations that trained the actor): approx KL "
            f"at the first minibatch {u.get('approx_kl_first', 0):.4f} (mean over all "
            f"{u.get('approx_kl', 0):.4f}), clip fraction {u.get('clip_fraction_first', 0):.2f} first / "
            f"{u.get('clip_fraction', 0):.2f} all, explained variance {u.get('explained_variance', 0):.2f}, "
            f"advantage std {u.get('advantage_std', 0):.3f}; largest policy lag {u['policy_lag_max']:.0f}, "
            f"{u['kl_stops']} early stops at the KL target.",
            "",
        ]
    return lines


def protocol_section(results: dict[str, Any]) -> list[str]:
    """The evaluations on the fixed protocol: the success table, pass@k, RL against SFT (unpaired and
    paired over the states, per task) and against the frozen control."""
    cfg = results["config"]
    before, after = results.get("eval_sft"), results.get("eval_rl")
    attempts = cfg["eval"].get("attempts", 1)
    lines = [
        "## 4. Evaluation on the fixed protocol",
        "",
        f"{cfg['eval']['episodes']} fixed initial states per task"
        + (
            f", {attempts} episodes each with other sampling noise (the first is the protocol's)"
            if attempts > 1
            else ""
        )
        + ", greedy policy, the task's own step limit.",
        "",
        "![pipeline](plots/pipeline.png)",
        "",
        "| policy | success | episodes | 95% CI |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {label} | **{res['success_rate']:.1%}** | {res['episodes']} | [{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}] |"
        for label, res in (("SFT", before), ("SFT + RL", after))
        if res
    ]
    lines.append("")
    curves = [
        (label, res["pass_at_k"])
        for label, res in (("SFT", before), ("SFT + RL", after))
        if res and res.get("pass_at_k")
    ]
    if curves:
        lines += [
            "The table is each state's first episode (the protocol's). Over every attempt, pass@1..K "
            "(the chance that one of k attempts at a state succeeds): "
            + "; ".join(f"{label} " + ", ".join(f"{p:.0%}" for p in c) for label, c in curves)
            + ".",
            "",
        ]
    if before and after:
        lines += rl_minus_sft(before, after, attempts)
    return lines + control_lines(results)


def rl_minus_sft(before: dict[str, Any], after: dict[str, Any], attempts: int) -> list[str]:
    """RL - SFT: Newcombe's interval on the protocol's episodes, paired over the states, per task."""
    from embodied.eval.report import paired_text
    from embodied.eval.stats import difference_interval

    d, lo, hi = difference_interval(after["successes"], after["episodes"], before["successes"], before["episodes"])
    lines = [
        f"RL - SFT: **{d:+.1%}**, 95% interval [{lo:+.3f}, {hi:+.3f}] (Newcombe)"
        + (" - the interval excludes 0." if lo > 0 or hi < 0 else "."),
        "",
    ]
    cmp = after.get("comparison") or {}
    paired = cmp.get("paired")
    if paired:
        lines += [
            f"Paired over the {paired['states']} initial states ({attempts} episode"
            f"{'s' if attempts > 1 else ''} per state and policy, every attempt counted), RL - SFT: "
            f"{paired_text(paired, 'SFT ', 'SFT + RL ')}.",
            "",
        ]
    if cmp.get("tasks"):
        lines += [
            "| task | SFT | SFT + RL | difference | 95% CI | paired difference | 95% CI |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in cmp["tasks"]:
            pr = r.get("paired")
            cells = f"{pr['difference']:+.1%} | [{pr['ci95'][0]:+.2f}, {pr['ci95'][1]:+.2f}]" if pr else "- | -"
            lines.append(
                f"| {r['name']} | {r['before']:.0%} | {r['now']:.0%} | {r['difference']:+.0%} | "
                f"[{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | {cells} |"
            )
        lines.append("")
    return lines


def control_lines(results: dict[str, Any]) -> list[str]:
    """The frozen-actor control's success, and RL against it paired over the states."""
    from embodied.eval.report import paired_text

    control, vs = results.get("eval_control"), results.get("rl_vs_control") or {}
    if not control:
        return []
    lines: list[str] = []
    ran = (results.get("rl_control") or {}).get("iterations")
    if ran is not None and ran != (results.get("rl") or {}).get("iterations"):
        lines += [
            f"The control ran {ran} iterations (its actor frozen, the same policy at any count; "
            "copied with `continue_rl=true`)."
        ]
    lines += [
        f"Frozen-actor control (the same RL run with algo.lr=0): **{control['success_rate']:.1%}** "
        f"[{control['ci95'][0]:.2f}, {control['ci95'][1]:.2f}]"
        + (", pass@1..K " + ", ".join(f"{p:.0%}" for p in control["pass_at_k"]) if control.get("pass_at_k") else "")
        + ".",
        "",
    ]
    if vs.get("paired"):
        lines += [
            f"Paired over the {vs['paired']['states']} initial states, RL - control: "
            f"{paired_text(vs['paired'], 'control ', 'SFT + RL ')}.",
            "",
        ]
    return lines


def heldout_section(results: dict[str, Any]) -> list[str]:
    """Report lines on the held-out states (states neither the demonstrations nor RL started from)."""
    from embodied.eval.report import paired_text

    rows = [
        (label, results.get(key))
        for label, key in (
            ("SFT", "eval_sft_heldout"),
            ("SFT + RL", "eval_rl_heldout"),
            ("frozen control", "eval_control_heldout"),
        )
    ]
    rows = [(label, res) for label, res in rows if res]
    if not rows:
        return []
    lines = [
        "### Held-out initial states",
        "",
        "The same policies on initial states neither the demonstrations nor RL started from "
        "(`sims.suites.heldout_states`):",
        "",
        "| policy | success | episodes | 95% CI | pass@1..K |",
        "|---|---|---|---|---|",
    ]
    for label, res in rows:
        passk = ", ".join(f"{p:.0%}" for p in res["pass_at_k"]) if res.get("pass_at_k") else "-"
        lines.append(
            f"| {label} | **{res['success_rate']:.1%}** | {res['episodes']} | "
            f"[{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}] | {passk} |"
        )
    lines.append("")
    paired = ((results.get("eval_rl_heldout") or {}).get("comparison") or {}).get("paired")
    if paired:
        lines += [
            f"Paired over the {paired['states']} held-out states, RL - SFT: "
            f"{paired_text(paired, 'SFT ', 'SFT + RL ')}.",
            "",
        ]
    vs = (results.get("rl_vs_control_heldout") or {}).get("paired")
    if vs:
        lines += [
            f"Paired over the {vs['states']} held-out states, RL - control: "
            f"{paired_text(vs, 'control ', 'SFT + RL ')}.",
            "",
        ]
    return lines


def videos_section(results: dict[str, Any]) -> list[str]:
    vids = (results.get("eval_sft") or {}).get("videos", []) + (results.get("eval_rl") or {}).get("videos", [])
    return ["Videos:", ""] + [f"- [{v}]({v})" for v in vids] + [""] if vids else []


def time_section(results: dict[str, Any]) -> list[str]:
    lines = ["## Time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in results.get("stage_seconds", {}).items()]
    m = results["machine"]
    return lines + [
        "",
        f"Machine: {m['platform']}, {cpu_summary(m)}, torch {m['torch']}, numpy {m.get('numpy')}, "
        f"mujoco {m['mujoco']}, GL {m['mujoco_gl']}",
        "",
    ]


def plot_pipeline(results: dict[str, Any], out: Path) -> Path | None:
    """Success before/after RL per task (95% intervals) and the RL training curve."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = results.get("eval_sft"), results.get("eval_rl")
    if before is None and after is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    width = 0.38
    for shift, res, label, color in ((-width / 2, before, "SFT", "#9ecae9"), (width / 2, after, "SFT + RL", "#4c78a8")):
        if res is None:
            continue
        rows = res["tasks"]
        rates = np.array([t["success_rate"] for t in rows])
        err = [rates - np.array([t["ci95"][0] for t in rows]), np.array([t["ci95"][1] for t in rows]) - rates]
        ax.bar(
            np.arange(len(rows)) + shift,
            rates,
            width,
            yerr=err,
            capsize=3,
            color=color,
            label=f"{label}: {res['success_rate']:.0%}",
        )
        ax.set_xticks(np.arange(len(rows)))
        ax.set_xticklabels([t["name"].replace("_", " ")[:22] for t in rows], rotation=15, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson interval)")
    ax.set_title("fixed protocol: before and after RL")
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    metrics = out / "rl" / "metrics.csv"
    if metrics.exists():
        rows = [r for r in csv.DictReader(open(metrics)) if r["success_rate"] not in ("", "nan")]
        if rows:
            steps = np.array([float(r["env_steps"]) for r in rows])
            succ = np.array([float(r["success_rate"]) for r in rows])
            k = min(10, len(succ))
            smooth = np.convolve(succ, np.ones(k) / k, mode="valid")
            ax.plot(steps, succ, color="#c6dbef", label="per iteration")
            ax.plot(steps[k - 1 :], smooth, color="#08519c", label=f"mean of {k}")
            ax.set_xlabel("env steps")
            ax.set_ylabel("training success (exploring)")
            ax.set_ylim(0, 1.05)
            ax.legend(loc="lower right")
            ax.grid(alpha=0.3)
    ax.set_title("RL: episodes ending in success during training")
    fig.tight_layout()
    path = out / "plots" / "pipeline.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
