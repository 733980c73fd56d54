"""Results of an evaluation: aggregation with intervals, comparison, JSON/CSV/Markdown, bar plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from embodied.eval.harness import EpisodeRecord
from embodied.eval.stats import difference_interval, paired_difference_interval, pass_at_k, wilson_interval
from embodied.runs import cpu_summary


def aggregate(
    records: Iterable[EpisodeRecord], suites: Sequence[str], tasks_of: dict[str, list[int]], names: dict[str, list[str]]
) -> dict[str, Any]:
    """Per suite and task: success rate, 95% Wilson interval, lengths, failures by init id (the
    protocol's episodes: attempt 0). Where states were attempted several times (``attempts=K``), also
    ``pass_at_k [K]``: the chance that one of k attempts at a state succeeds, k = 1..K, averaged over
    the states (pass@1 is the success rate over every attempt; pass@K - pass@1 is the headroom a
    policy that picked its noise well per state would have). ``state_successes`` lists every state's
    ``[init id, successes, attempts]`` over all its attempts, for paired comparisons."""
    records = list(records)
    by_task: dict[tuple[str, int], list[EpisodeRecord]] = {}
    by_state: dict[tuple[str, int], dict[int, list[bool]]] = {}
    for r in records:
        by_state.setdefault((r.suite, r.task), {}).setdefault(r.init_id, []).append(r.success)
        if r.attempt == 0:
            by_task.setdefault((r.suite, r.task), []).append(r)
    attempts = 1 + max((r.attempt for r in records), default=0)
    out: dict[str, Any] = {}
    for suite in suites:
        rows = []
        for t in tasks_of[suite]:
            eps = sorted(by_task.get((suite, t), []), key=lambda r: r.init_id)
            k, n = sum(r.success for r in eps), len(eps)
            lo, hi = wilson_interval(k, n)
            rows.append(
                {
                    "task": t,
                    "name": names[suite][t],
                    "episodes": n,
                    "successes": k,
                    "success_rate": k / n if n else 0.0,
                    "ci95": [round(lo, 4), round(hi, 4)],
                    "mean_length": float(np.mean([r.length for r in eps])) if eps else 0.0,
                    "failures": [r.init_id for r in eps if not r.success],
                    "diverged": sum(r.diverged for r in eps),
                    "state_successes": [[i, sum(s), len(s)] for i, s in sorted(by_state.get((suite, t), {}).items())],
                }
            )
            if attempts > 1:
                rows[-1]["pass_at_k"] = _pass_curve(by_state.get((suite, t), {}), attempts)
        k_all = sum(r["successes"] for r in rows)
        n_all = sum(r["episodes"] for r in rows)
        lo, hi = wilson_interval(k_all, n_all)
        out[suite] = {
            "success_rate": float(np.mean([r["success_rate"] for r in rows])) if rows else 0.0,
            "episodes": n_all,
            "ci95": [round(lo, 4), round(hi, 4)],
            "tasks": rows,
        }
        if attempts > 1:
            curves = [r["pass_at_k"] for r in rows if r["pass_at_k"]]
            out[suite]["pass_at_k"] = (
                [round(float(np.mean([c[k] for c in curves if len(c) > k])), 4) for k in range(max(map(len, curves)))]
                if curves
                else []
            )
    return out


def _pass_curve(states: dict[int, list[bool]], attempts: int) -> list[float]:
    """``[pass@1, ..., pass@K]`` over the states, each k over the states with at least k attempts
    recorded (an interrupted run may have fewer for some)."""
    curve = []
    for k in range(1, attempts + 1):
        vals = [pass_at_k(len(s), sum(s), k) for s in states.values() if len(s) >= k]
        if not vals:
            break
        curve.append(round(float(np.mean(vals)), 4))
    return curve


def compare(current: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """Per task present in both results: difference of the protocol's success rates with Newcombe's
    95% interval and, where both runs list their states' successes, the paired difference over the
    states both ran (every attempt counted; :func:`paired_difference_interval`); per suite the same
    pairing over all those states."""
    out: dict[str, Any] = {}
    for suite, cur in current.items():
        prev = previous.get("suites", {}).get(suite)
        if prev is None:
            continue
        old = {r["name"]: r for r in prev["tasks"]}
        rows = []
        now_all: list[float] = []
        before_all: list[float] = []
        for r in cur["tasks"]:
            o = old.get(r["name"])
            if o is None or not r["episodes"] or not o.get("episodes"):
                continue
            k_old = o.get("successes", round(o["success_rate"] * o["episodes"]))
            d, lo, hi = difference_interval(r["successes"], r["episodes"], k_old, o["episodes"])
            rows.append(
                {
                    "task": r["task"],
                    "name": r["name"],
                    "now": r["success_rate"],
                    "before": o["success_rate"],
                    "difference": round(d, 4),
                    "ci95": [round(lo, 4), round(hi, 4)],
                    "significant": lo > 0 or hi < 0,
                }
            )
            now_rates, before_rates = _paired_rates(r.get("state_successes"), o.get("state_successes"))
            if now_rates:
                rows[-1]["paired"] = _paired_summary(now_rates, before_rates)
                now_all += now_rates
                before_all += before_rates
        out[suite] = {
            "tasks": rows,
            "mean_difference": float(np.mean([r["difference"] for r in rows])) if rows else 0.0,
        }
        if now_all:
            out[suite]["paired"] = _paired_summary(now_all, before_all)
    return out


def _paired_rates(now: list[list[int]] | None, before: list[list[int]] | None) -> tuple[list[float], list[float]]:
    """Success rates over the attempts of the states both runs recorded (``[init id, successes, attempts]``)."""
    if not now or not before:
        return [], []
    old = {i: k / n for i, k, n in before if n}
    pairs = [(k / n, old[i]) for i, k, n in now if n and i in old]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _paired_summary(now: list[float], before: list[float]) -> dict[str, Any]:
    d, lo, hi = paired_difference_interval(now, before)
    return {
        "difference": round(d, 4),
        "ci95": [round(lo, 4), round(hi, 4)],
        "states": len(now),
        "now": round(float(np.mean(now)), 4),
        "before": round(float(np.mean(before)), 4),
        "significant": lo > 0 or hi < 0,
    }


def paired_text(p: dict[str, Any], before: str = "", now: str = "") -> str:
    """One line of a paired comparison (``compare``'s ``paired``): both rates, the difference and its interval."""
    return (
        f"{before}{p['before']:.1%} -> {now}{p['now']:.1%}: {p['difference']:+.1%}, 95% interval "
        f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]" + (" - the interval excludes 0" if p["significant"] else "")
    )


def write_csv(path: Path, suites: dict[str, Any]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "suite",
                "task",
                "name",
                "episodes",
                "successes",
                "success_rate",
                "ci95_low",
                "ci95_high",
                "mean_length",
                "failures",
            ]
        )
        for suite, res in suites.items():
            for r in res["tasks"]:
                w.writerow(
                    [
                        suite,
                        r["task"],
                        r["name"],
                        r["episodes"],
                        r["successes"],
                        f"{r['success_rate']:.4f}",
                        r["ci95"][0],
                        r["ci95"][1],
                        f"{r['mean_length']:.1f}",
                        " ".join(map(str, r["failures"])),
                    ]
                )


def plot_suite(path: Path, suite: str, res: dict[str, Any], title: str) -> None:
    """Bar plot of per-task success with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["tasks"]
    rates = np.array([r["success_rate"] for r in rows])
    lo = rates - np.array([r["ci95"][0] for r in rows])
    hi = np.array([r["ci95"][1] for r in rows]) - rates
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
    ax.bar(range(len(rows)), rates, yerr=[lo, hi], capsize=3, color="#4c78a8")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['task']}" for r in rows])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("task")
    ax.set_ylabel("success rate (95% Wilson interval)")
    ax.set_title(f"{title}: {suite}, mean {res['success_rate']:.1%}")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    """The Markdown report."""
    lines = [f"# Evaluation: {results['agent']['label']}", ""]
    cfg = results["config"]
    first = cfg.get("first_state", 0)
    states = f" (states {first}..{first + cfg['episodes'] - 1}: held out from the protocol's)" if first else ""
    protocol = results.get("protocol") or (
        f"Protocol: {cfg['episodes']} fixed initial states per task{states}, one episode each, "
        f"{cfg['mode']} policy, execution `{cfg['execution']}` with an inference delay of "
        f"{cfg.get('delay', 0)} control steps ({cfg.get('delay_source', 'steps')}), "
        f"{cfg['num_envs']} parallel envs, seed {cfg['seed']}."
        + (f" Episodes cut at {cfg['max_steps']} steps: not the protocol's limit." if cfg.get("max_steps") else "")
        + (" Visual meshes drawn as the scenes have them (meshes=full)." if cfg.get("meshes") == "full" else "")
    )
    lines += [protocol, f"Wall time {results['wall_s']:.1f} s, {results['env_steps_per_s']:.1f} env-steps/s.", ""]
    for suite, lat in (results.get("latency") or {}).items():
        inf = lat.get("inference")
        if inf:
            lines += [
                f"Latency ({suite}): {lat['requests']} chunk requests, inference p50 {inf['p50'] * 1e3:.1f} ms, "
                f"p95 {inf['p95'] * 1e3:.1f} ms, max {inf['max'] * 1e3:.1f} ms; {lat['held_steps']} env-steps "
                "spent holding still (no action queued).",
                "",
            ]
    if results.get("interrupted"):
        lines += [
            "**Interrupted**: the numbers cover the episodes finished so far; run the same command to resume.",
            "",
        ]
    for suite, res in results["suites"].items():
        lines += [
            f"## {suite}: {res['success_rate']:.1%} (episodes {res['episodes']}, pooled 95% CI "
            f"[{res['ci95'][0]:.2f}, {res['ci95'][1]:.2f}])",
            "",
            f"![{suite}](plots/{suite}.png)",
            "",
            "| task | name | success | 95% CI | mean length | failed init ids |",
            "|---|---|---|---|---|---|",
        ]
        for r in res["tasks"]:
            fails = " ".join(map(str, r["failures"][:20])) + (" ..." if len(r["failures"]) > 20 else "")
            lines.append(
                f"| {r['task']} | {r['name']} | {r['success_rate']:.0%} ({r['successes']}/{r['episodes']}) | "
                f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['mean_length']:.0f} | {fails} |"
            )
        lines.append("")
        if res.get("pass_at_k"):
            curve = ", ".join(f"pass@{k + 1} {p:.0%}" for k, p in enumerate(res["pass_at_k"]))
            lines += [
                f"Attempts per initial state: {cfg.get('attempts', len(res['pass_at_k']))} (other sampling noise each; the table is "
                f"attempt 0, the protocol's): {curve}.",
                "",
            ]
        cmp = results.get("comparison", {}).get(suite)
        if cmp:
            lines += [
                f"### {suite}: change against {results['compare_with']} (mean {cmp['mean_difference']:+.1%})",
                "",
                "| task | before | now | difference | 95% CI | paired over states, all attempts | 95% CI |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in cmp["tasks"]:
                mark = " *" if r["significant"] else ""
                p = r.get("paired")
                paired = (
                    f"{p['before']:.0%} -> {p['now']:.0%}: {p['difference']:+.1%}{' *' if p['significant'] else ''} | "
                    f"[{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}]"
                    if p
                    else "- | -"
                )
                lines.append(
                    f"| {r['name']} | {r['before']:.0%} | {r['now']:.0%} | {r['difference']:+.0%}{mark} | "
                    f"[{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | {paired} |"
                )
            lines += [
                "",
                "\\* the interval excludes 0. Difference and 95% CI: the protocol's episodes (Newcombe); "
                "paired: the mean over the initial states both runs played of the change in each state's "
                "success rate over its attempts, with a normal interval from the states' spread.",
                "",
            ]
            if cmp.get("paired"):
                lines += [f"Paired over {cmp['paired']['states']} states: {paired_text(cmp['paired'])}.", ""]
    if results.get("videos"):
        lines += ["## Videos", ""] + [f"- [{v}]({v})" for v in results["videos"]] + [""]
    m = results["machine"]
    lines += [
        "## Reproducibility",
        "",
        f"- agent: {results['agent']['label']}; checkpoint sha256 {results['agent'].get('sha256', '-')}",
        f"- device {results['device']}; python {m['python']}, torch {m['torch']}, mujoco {m['mujoco']}, "
        f"numpy {m['numpy']}; {m['platform']}, {cpu_summary(m)}",
        "",
    ]
    return "\n".join(lines)


def load_previous(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"compare={path}: no results.json there (give a previous embodied-eval run folder)")
    return json.loads(p.read_text())
