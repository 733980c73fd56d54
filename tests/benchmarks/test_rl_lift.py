"""The RL-lift benchmark's table and verdicts (benchmarks/rl_lift.py) from pipeline results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("rl_lift", ROOT / "benchmarks" / "rl_lift.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results(sft: float, rl: float, lo: float, control: float) -> dict:
    def paired(before, now, low):
        return {
            "before": before,
            "now": now,
            "difference": now - before,
            "ci95": [low, now - before + 0.05],
            "states": 50,
        }

    return {
        "eval_rl": {"comparison": {"paired": paired(sft, rl, lo)}, "success_rate": rl},
        "rl_vs_control": {"paired": paired(control, rl, lo)},
        "eval_control": {"comparison": {"paired": paired(sft, control, -0.05)}},
        "eval_sft": {"success_rate": sft},
        "rl": {"updates": {"approx_kl_first": 0.001}},
        "stage_seconds": {"sft": 300, "rl": 600},
    }


def test_verdicts_follow_the_three_criteria():
    m = _module()
    good = [m.cell_row(_results(0.6, 0.8 + 0.01 * s, 0.1, 0.6), 5, s) for s in range(3)]
    assert good[0]["minutes"] == 15.0 and good[0]["rl_minus_sft"] == 0.8 - 0.6
    assert [ok for _, ok, _ in m.verdicts(good)] == [True, True, True]
    # a low start whose interval touches 0, and a run that ends below its start
    bad = good[:2] + [m.cell_row(_results(0.7, 0.65, -0.1, 0.7), 5, 2)]
    held = {c.split(":")[0]: ok for c, ok, _ in m.verdicts(bad)}
    assert held["every start below 85% gets a paired RL - SFT interval above 0"] is False
    assert held["no run ends below its start"] is False
    assert held["5 demonstrations"] is False  # the gains' spread is now larger than half their mean
    table = m.markdown(bad, "python benchmarks/rl_lift.py --out X", None)
    assert table.count("\n| 5 |") == 3 and "**no**" in table and "Cells measured" not in table
    assert "Cells measured: 3 of 6" in m.markdown(bad, "cmd", None, planned=6)


def test_the_table_is_dated_by_its_newest_cell_not_the_day_it_is_written(tmp_path):
    import calendar
    import os
    import time

    m = _module()
    cells = []
    for name, day in (("d5_s0", "2026-11-30"), ("d5_s1", "2026-12-02")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text("{}")
        stamp = calendar.timegm(time.strptime(day + " 12", "%Y-%m-%d %H"))
        os.utime(tmp_path / name / "results.json", (stamp, stamp))
        cells.append(tmp_path / name)
    assert m.measured_on(cells) == "2026-12-02" and m.measured_on([tmp_path / "none"]) is None
    rows = [m.cell_row(_results(0.6, 0.8, 0.1, 0.6), 5, 0)]
    machine = {"platform": "Linux", "cpu_count": 2, "cpu": "x", "torch": "2", "mujoco": "3"}
    assert "mujoco 3; 2026-12-02." in m.markdown(rows, "cmd", machine, measured=m.measured_on(cells))


def test_a_start_above_the_bar_needs_no_interval_above_zero():
    m = _module()
    rows = [m.cell_row(_results(0.9, 0.92, -0.02, 0.9), 20, s) for s in range(2)]
    first = m.verdicts(rows)[0]
    assert first[1] is True and first[2].startswith("0 of 0")


def test_table_shows_the_largest_kl_and_a_rewrite_keeps_the_notes(tmp_path):
    """The largest approx KL of the actor's iterations comes from the cell's metrics.csv (warm-up rows and
    a torn last line left out); writing the table again keeps the docs file's notes section."""
    import json

    m = _module()
    cell = tmp_path / "cells" / "d5_s0"
    (cell / "rl").mkdir(parents=True)
    (cell / "results.json").write_text(
        json.dumps(_results(0.5, 0.7, 0.05, 0.5) | {"stages_done": ["eval_rl", "eval_control"]})
    )
    (cell / "rl" / "metrics.csv").write_text("iteration,approx_kl,actor_updated\n1,9.0,0\n2,0.2281,1\n3,0.012,1\n4,5.0")
    docs = tmp_path / "rl-lift.md"
    docs.write_text("# old table\n\n## Notes\n\nkept by hand\n")
    assert (
        m.main(["--out", str(tmp_path / "cells"), "--seeds", "0", "--demos", "5", "--docs", str(docs), "--table-only"])
        == 0
    )
    text = docs.read_text()
    assert "old table" not in text and "| 0.2281 [" not in text and " / 0.228 |" in text
    assert text.endswith("## Notes\n\nkept by hand\n") and text.count("## Notes") == 1
    row = json.loads((tmp_path / "cells" / "rl_lift.json").read_text())["rows"][0]
    assert row["approx_kl_max"] == 0.2281


def _anchor_results(sft: float, rl: float, heldout: tuple[float, float], iterations: int = 80) -> dict:
    """A finished anchor cell: the main job's stages plus the held-out evaluations of rl.init_states=protocol."""

    def paired(before, now):
        return {
            "before": before,
            "now": now,
            "difference": now - before,
            "ci95": [now - before - 0.05, now - before + 0.05],
            "states": 100,
        }

    return _results(sft, rl, rl - sft - 0.05, sft) | {
        "eval_rl_heldout": {"comparison": {"paired": paired(*heldout)}},
        "rl_vs_control_heldout": {"paired": paired(*heldout)},
        "rl": {"iterations": iterations, "updates": {"approx_kl": 0.02, "clip_fraction": 0.1}},
        "stages_done": ["eval_rl", "eval_control", "eval_rl_heldout", "eval_control_heldout"],
    }


def test_states_moved_counts_each_way():
    m = _module()
    sft = {"tasks": [{"task": 1, "state_successes": [[0, 2, 4], [1, 4, 4], [2, 0, 4]]}]}
    rl = {"tasks": [{"task": 1, "state_successes": [[0, 3, 4], [1, 1, 4], [2, 0, 4]]}]}
    assert m.states_moved(sft, rl) == (1, 1) and m.states_moved(rl, sft) == (1, 1)
    assert m.states_moved({}, rl) == (0, 0)


def test_anchor_verdict_needs_a_low_start_and_the_target():
    m = _module()
    assert m.anchor_verdict(m.anchor_row(_anchor_results(0.55, 0.92, (0.5, 0.6))))[1] is True
    _, ok, why = m.anchor_verdict(m.anchor_row(_anchor_results(0.55, 0.85, (0.5, 0.6))))
    assert ok is False and "55.0% -> 85.0%" in why and "held-out states 50.0% -> 60.0%" in why
    _, ok, why = m.anchor_verdict(m.anchor_row(_anchor_results(m.ANCHOR_START, 0.95, (0.5, 0.6))))
    assert ok is False and "not below" in why


def test_anchor_table_from_its_phases(tmp_path):
    """--anchor --table-only reads the anchor's phases (OUT/anchor_spatial, OUT/anchor_spatial_it{N}) beside
    the grid's cells: a row per phase, the last one's table and verdict, the CSV/JSON; while a phase is
    missing the run reports itself incomplete and the table says which phases ran."""
    import json

    m = _module()
    out = tmp_path / "cells"
    grid = _results(0.5, 0.7, 0.05, 0.5) | {"stages_done": ["eval_rl", "eval_control"]}
    (out / "d5_s0").mkdir(parents=True)
    (out / "d5_s0" / "results.json").write_text(json.dumps(grid))
    docs = tmp_path / "rl-lift.md"
    for i, (iterations, _) in enumerate(m.ANCHOR_PHASES):
        cell = m.anchor_folder(out, i)
        cell.mkdir(parents=True)
        res = _anchor_results(0.55, 0.80 + 0.04 * i, (0.52, 0.58 + 0.1 * i), iterations)
        if i:  # a later phase's own stages are its RL and evaluations; the rest were copied
            res |= {"init_from": {"stages": ["sft", "rl_control"]}}
        (cell / "results.json").write_text(json.dumps(res))
        code = m.main(
            ["--out", str(out), "--seeds", "0", "--demos", "5", "--anchor", "--table-only", "--docs", str(docs)]
        )
        assert code == (0 if i == len(m.ANCHOR_PHASES) - 1 else 1)
        text = docs.read_text()
        assert f"After phase {i + 1} of {len(m.ANCHOR_PHASES)}:" in text
        assert text.count("| not run |") == len(m.ANCHOR_PHASES) - 1 - i
    assert cell.name == f"anchor_spatial_it{m.ANCHOR_PHASES[-1][0]}"
    assert "--demos 5 --anchor`" in text and "## The anchor's protocol on `spatial`" in text
    assert "| 1 | 80 | the defaults | 80.0% | 58.0% | +0.250 [+0.200, +0.300] | 0 / 0 | 15.0 |" in text
    assert "| 4 | 880 | `rl.num_envs=80` `rl.algo.minibatch_size=640`" in text
    assert "| protocol (trained on) | 55.0% | 92.0% | 55.0% | +0.370 [+0.320, +0.420] |" in text
    assert "| held-out | 52.0% | 88.0% | 52.0% | +0.360 [+0.310, +0.410] |" in text
    assert "| yes | 55.0% -> 92.0% at 880 iterations; held-out states 52.0% -> 88.0% |" in text
    assert "45.0 minutes in all" in text  # 15 minutes of the first phase, then 10 of RL in each of the 3 others
    saved = json.loads((out / "rl_lift.json").read_text())
    assert saved["anchor"]["rl"] == 0.92 and saved["anchor_verdict"][1] is True and len(saved["anchor_phases"]) == 4
    assert (out / "rl_lift_anchor.csv").read_text().startswith("sft,rl,control,")
    stopped = _anchor_results(0.55, 0.92, (0.52, 0.58)) | {"stages_done": ["eval_rl", "eval_control"]}
    (cell / "results.json").write_text(json.dumps(stopped))  # the last phase's held-out stages not yet run
    assert m.main(["--out", str(out), "--seeds", "0", "--demos", "5", "--anchor", "--table-only"]) == 1
    assert len(json.loads((out / "rl_lift.json").read_text())["anchor_phases"]) == 3


def test_anchor_phases_carry_the_previous_phase_on(tmp_path, monkeypatch):
    """Each anchor phase after the first is a pipeline run from the previous phase's folder with
    continue_rl=true, rl.iterations at the phase's end and its settings; a failed phase stops the chain."""
    import json

    m = _module()
    out = tmp_path / "new"
    commands = []

    def fake_run(cell, cmd, label):  # the grid's cell fails; the anchor's phases 1 and 2 finish
        commands.append(cmd)
        if cell.name.startswith("anchor") and len(commands) <= 3:
            cell.mkdir(parents=True, exist_ok=True)
            (cell / "results.json").write_text(json.dumps(_anchor_results(0.5, 0.8, (0.5, 0.7))))
            return True
        return False

    monkeypatch.setattr(m, "run_cell", fake_run)
    assert m.main(["--out", str(out), "--seeds", "0", "--demos", "5", "--anchor", "--", "eval.workers=1"]) == 1
    grid, first, second, third = commands
    assert first[1] == f"out={out / 'anchor_spatial'}" and "rl.iterations=80" in first and "rl.control=true" in first
    assert not any(a.startswith(("init_from=", "continue_rl=")) for a in first)
    assert second[1] == f"out={out / 'anchor_spatial_it320'}" and "rl.iterations=320" in second
    assert f"init_from={(out / 'anchor_spatial').resolve()}" in second and "continue_rl=true" in second
    assert third[1] == f"out={out / 'anchor_spatial_it640'}" and "rl.algo.lr=5e-6" in third
    assert f"init_from={(out / 'anchor_spatial_it320').resolve()}" in third
    assert all(c[-1] == "eval.workers=1" for c in commands)  # the extra overrides last, for every run
    commands.clear()  # --anchor-only: the phases alone, no grid cell
    assert m.main(["--out", str(tmp_path / "alone"), "--anchor-only"]) == 1
    assert commands and all(c[1].startswith(f"out={tmp_path / 'alone' / 'anchor_spatial'}") for c in commands)


def test_init_from_starts_each_cell_from_the_earlier_runs_cell(tmp_path, monkeypatch):
    """--init-from passes each cell the same cell of the earlier run (embodied-pipeline init_from=); a cell
    the earlier run lacks starts from its first stage."""
    m = _module()
    earlier = tmp_path / "earlier"
    (earlier / "d5_s0").mkdir(parents=True)
    (earlier / "d5_s0" / "results.json").write_text("{}")
    commands = []
    monkeypatch.setattr(m, "run_cell", lambda cell, cmd, label: commands.append(cmd) or False)
    m.main(
        [
            "--out",
            str(tmp_path / "new"),
            "--seeds",
            "0",
            "--demos",
            "5",
            "20",
            "--init-from",
            str(earlier),
            "--",
            "rl.iterations=40",
        ]
    )
    assert [c[1] for c in commands] == [f"out={tmp_path / 'new' / 'd5_s0'}", f"out={tmp_path / 'new' / 'd20_s0'}"]
    assert f"init_from={earlier.resolve() / 'd5_s0'}" in commands[0] and commands[0][-1] == "rl.iterations=40"
    assert not any(a.startswith("init_from=") for a in commands[1])


def test_eval_seeds_evaluate_the_last_phase_again_and_their_mean_decides(tmp_path, monkeypatch):
    """--eval-seeds runs embodied-eval of the last finished phase's RL evaluations again with each seed (the
    same policy, states and attempts; every key one that embodied-eval declares); the table shows each
    reading and the mean, and the mean over the seeds decides the anchor's criterion."""
    import json
    from dataclasses import fields

    from embodied.runners.eval import EvalConfig

    m = _module()
    out = tmp_path / "runs"
    phase = m.anchor_folder(out, 0)

    def write_eval(folder: Path, seed: int, first: int, rate: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval_config.json").write_text(
            json.dumps(
                {
                    "checkpoint": str(phase / "rl/checkpoint/policy"),
                    "suite": "spatial",
                    "tasks": [1, 8],
                    "episodes": 50,
                    "first_state": first,
                    "num_envs": 25,
                    "image_size": 64,
                    "mode": "greedy",
                    "seed": seed,
                    "attempts": 4,
                    "max_steps": None,
                    "device": "cpu",
                    "sha256": "x",
                }
            )
        )
        (folder / "results.json").write_text(
            json.dumps(  # success_rate: the first attempts only
                {"suites": {"spatial": {"success_rate": rate - 0.1, "pass_at_k": [rate, 0.99, 1.0, 1.0]}}}
            )
        )

    (phase / "results.json").parent.mkdir(parents=True)
    (phase / "results.json").write_text(json.dumps(_anchor_results(0.6, 0.92, (0.6, 0.9))))
    write_eval(phase / "eval_rl", 0, 0, 0.92)
    write_eval(phase / "eval_rl_heldout", 0, 50, 0.9)
    readings = {("eval_rl", 1): 0.88, ("eval_rl", 2): 0.87, ("eval_rl_heldout", 1): 0.86, ("eval_rl_heldout", 2): 0.85}
    commands = []

    def fake_run(cell, cmd, label):
        commands.append(cmd)
        if cmd[0].endswith("embodied-pipeline"):
            return False  # phase 2 does not finish
        args = dict(a.split("=", 1) for a in cmd[1:])
        folder = Path(args["out"])
        stage, seed = folder.name.rsplit("_seed", 1)
        write_eval(folder, int(args["seed"]), int(args["first_state"]), readings[(stage, int(seed))])
        return True

    monkeypatch.setattr(m, "run_cell", fake_run)
    m.main(["--out", str(out), "--anchor-only", "--eval-seeds", "1", "2", "--seeds", "0", "--demos", "5"])
    evals = [c for c in commands if c[0].endswith("embodied-eval")]
    assert len(evals) == 4 and all(Path(c[0]).parent == Path(m.sys.executable).parent for c in evals)
    declared = {f.name for f in fields(EvalConfig)}
    for cmd in evals:
        keys = [a.split("=", 1)[0] for a in cmd[1:]]
        assert set(keys) <= declared and "sha256" not in keys and "max_steps" not in keys  # null: left out
        assert "videos=none" in cmd and "tasks=[1,8]" in cmd and f"checkpoint={phase / 'rl/checkpoint/policy'}" in cmd
    assert f"out={phase / 'eval_rl_heldout_seed2'}" in evals[-1] and "first_state=50" in evals[-1]
    saved = json.loads((out / "rl_lift.json").read_text())
    assert saved["anchor"]["rl_seeds"] == {"0": 0.92, "1": 0.88, "2": 0.87}
    assert (
        abs(saved["anchor"]["rl_seed_mean"] - 0.89) < 1e-9
        and abs(saved["anchor"]["heldout_rl_seed_mean"] - 0.87) < 1e-9
    )
    _, ok, why = saved["anchor_verdict"]
    assert ok is False and "92.0% at 80 iterations (89.0% over evaluation seeds 0, 1, 2)" in why
    commands.clear()  # a rerun finds the evaluations done and runs none of them again
    m.main(["--out", str(out), "--anchor-only", "--eval-seeds", "1", "2"])
    assert not [c for c in commands if c[0].endswith("embodied-eval")]
    text = m.anchor_markdown(
        [
            m.anchor_row(json.loads((phase / "results.json").read_text()))
            | m.seed_columns(phase, [1, 2])
            | {"own_minutes": 1.0}
        ],
        None,
    )
    assert "88.0% (seed 1), 87.0% (seed 2); mean **89.0%**" in "\n".join(text)
    assert m.anchor_verdict(m.anchor_row(_anchor_results(0.6, 0.92, (0.6, 0.9))))[1] is True  # one seed: 92% holds


def test_anchor_only_docs_replace_the_anchors_section_alone(tmp_path):
    """--anchor-only --docs rewrites the anchor's section of the docs file (the grid's table above it and
    the notes below kept), with its command and the date its phases finished; without one it goes before
    the notes."""
    import json

    m = _module()
    out = tmp_path / "runs"
    for i, (iterations, _) in enumerate(m.ANCHOR_PHASES):
        cell = m.anchor_folder(out, i)
        cell.mkdir(parents=True)
        res = _anchor_results(0.6, 0.8 + 0.03 * i, (0.6, 0.7), iterations) | {
            "machine": {"platform": "Linux", "cpu_count": 2, "cpu": "AMD"}
        }
        (cell / "results.json").write_text(json.dumps(res))
    docs = tmp_path / "rl-lift.md"
    docs.write_text(f"# grid\n\n| grid table |\n\n{m.ANCHOR_HEADING}\n\nold anchor text\n\n## Notes\n\nby hand\n")
    assert m.main(["--out", str(out), "--anchor-only", "--table-only", "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.startswith("# grid\n\n| grid table |\n\n" + m.ANCHOR_HEADING) and text.endswith("## Notes\n\nby hand\n")
    assert "old anchor text" not in text and text.count(m.ANCHOR_HEADING) == 1
    assert f"Command: `python benchmarks/rl_lift.py --out {out} --anchor-only`" in text
    assert "| yes | 60.0% -> 89.0% at 880 iterations" not in text and "| **no** | 60.0% -> 89.0% at 880" in text
    assert "cores (AMD); " in text  # dated by its phases' results
    assert (
        m.replace_anchor_section("# grid\n\n## Notes\n\nn\n", ["## The anchor's protocol on `spatial`", "", "x"])
        == "# grid\n\n## The anchor's protocol on `spatial`\n\nx\n\n## Notes\n\nn\n"
    )
    assert m.replace_anchor_section("# grid\n", [m.ANCHOR_HEADING, "", "x"]) == f"# grid\n\n{m.ANCHOR_HEADING}\n\nx\n\n"
