"""The LIBERO lift benchmark's phases, criteria and table (benchmarks/libero_lift.py) from run results."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    return importlib.import_module("benchmarks.libero_lift")


def _paired(before: float, now: float, lo: float) -> dict:
    return {"before": before, "now": now, "difference": now - before, "ci95": [lo, now - before + 0.05]}


def _states(rate: float) -> list:
    return [[i, int(i < rate * 10), 1] for i in range(10)]  # [init id, successes, attempts]


def _task(rate: float) -> dict:
    return {"task": 0, "name": "pick", "success_rate": rate, "state_successes": _states(rate)}


def _results(sft: float, rl: float, control: float | None) -> dict:
    res = {
        "eval_sft": {"success_rate": sft, "tasks": [_task(sft)]},
        "eval_rl": {
            "success_rate": rl,
            "comparison": {"paired": _paired(sft, rl, rl - sft - 0.05)},
            "tasks": [_task(rl)],
        },
        "rl": {"iterations": 40, "env_steps": 128000, "updates": {"approx_kl": 0.01, "clip_fraction": 0.1}},
        "stage_seconds": {"rl": 600, "eval_rl": 60},
        "config": {"rl": {"num_envs": 40, "chunks_per_iter": 16, "algo": {"minibatch_size": 64}}},
        "stages_done": ["eval_rl", "eval_control"],
    }
    if control is not None:
        res["eval_control"] = {"success_rate": control}
        res["rl_vs_control"] = {"paired": _paired(control, rl, rl - control - 0.05)}
    return res


def test_phases_chain_from_the_sft_start_and_only_seed_0_runs_the_control(tmp_path):
    m = _module()
    first = m.phase_command(tmp_path, 0, 0, 20, ["x=1"])
    assert f"init_from={(tmp_path / 'sft').resolve()}" in first and "rl.control=true" in first
    assert "continue_rl=true" not in first and first[-1] == "x=1" and "rl.init_states=protocol" in first
    later = m.phase_command(tmp_path, 1, 2, 20, [])
    assert f"out={tmp_path / 'rl_s1_it120'}" in later and "rl.control=false" in later and "continue_rl=true" in later
    assert f"init_from={(tmp_path / 'rl_s1_it80').resolve()}" in later and "rl.iterations=120" in later
    assert "stages=[collect,sft,eval_sft]" in m.sft_command(tmp_path, 20, [])
    # two runners share the tasks' envs
    assert "rl.runtime.num_env_runners=2" in first and "rl.runtime.num_env_runners=2" in later
    # another recipe: its own cells, its overrides after the common ones, no control of its own
    large = m.RECIPES["large"]
    big = m.phase_command(tmp_path, 0, 1, 20, [], large)
    assert f"out={tmp_path / 'rl_large_s0_it80'}" in big and f"init_from={(tmp_path / 'rl_large_s0').resolve()}" in big
    assert "rl.control=false" in big and "rl.chunks_per_iter=64" in big
    assert big.index("rl.chunks_per_iter=64") > big.index("rl.runtime.num_env_runners=2")
    assert m.seed_label(large, 1) == "1 large" and m.seed_label(m.RECIPES["small"], 1) == "1"
    sde2 = m.phase_command(tmp_path, 1, 0, 20, [], m.RECIPES["sde2"])
    assert "rl.algo.sde_steps=2" in sde2 and f"out={tmp_path / 'rl_sde2_s1'}" in sde2 and "rl.iterations=40" in sde2


def test_verdicts_and_table_from_the_last_phase_of_each_seed(tmp_path):
    m = _module()
    for name in ("rl", "rl_control"):
        (tmp_path / name).mkdir()
    head = "iteration,success_rate,greedy_success_rate,approx_kl,clip_fraction,explained_variance,grad_cos_first,greedy_episodes\n"
    (tmp_path / "rl" / "metrics.csv").write_text(
        head + "1,0.6,,0.01,0.1,0.2,nan,\n2,0.7,,0.02,0.1,0.4,0.01,\n5,0.8,0.55,0.03,0.1,0.6,0.03,20\n"
    )
    (tmp_path / "rl_control" / "metrics.csv").write_text(head + "5,0.6,0.5,0,0,0.5,0.0,20\n")
    # the probes' episodes at iteration 5: of 4 states, RL and the frozen control end 3 alike, 1 otherwise
    for name, wins in (("rl", [1, 1, 0, 0]), ("rl_control", [1, 0, 0, 0])):
        episodes = [{"iteration": 5, "task": 0, "init_id": i, "success": bool(w)} for i, w in enumerate(wins)]
        (tmp_path / name / "greedy_episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    good = m.phase_row(_results(0.6, 0.92, 0.61), tmp_path)
    assert good["states_better"] == 4 and good["probe"] == [
        {"iteration": 5, "sampled": 0.8, "greedy": 0.55, "control": 0.5, "episodes": 20}
    ]
    assert good["probe_flips"] == {"iteration": 5, "states": 4, "differ": 1}
    # the phase's update signal: mean cosine 0.02 between 64-chunk minibatches, noise scale 64 x (1/0.02 - 1)
    signal = good["signal"]
    assert good["chunks_per_update"] == 640 and signal["iterations"] == 3 and abs(signal["grad_cos"] - 0.02) < 1e-12
    assert abs(signal["noise_scale"] - 64 * 49) < 1e-6 and abs(signal["approx_kl"] - 0.02) < 1e-12
    later = m.phase_row(_results(0.6, 0.92, 0.61), tmp_path, since=1, previous=_results(0.6, 0.8, 0.61))
    # what the phase changed on the same states: states 8 and 9 now succeed, 0.2 over the 10
    assert (later["vs_previous"]["better"], later["vs_previous"]["worse"]) == (2, 0)
    assert later["vs_previous"]["states"] == 10 and abs(later["vs_previous"]["difference"] - 0.2) < 1e-12
    assert later["signal"]["iterations"] == 2 and abs(later["signal"]["explained_variance"] - 0.5) < 1e-12
    assert m.update_signal(tmp_path, 3, 5, 64) is None  # one cosine: no spread to judge it by
    seed1 = m.phase_row(_results(0.6, 0.88, None), tmp_path)
    reference = {"states": 10, "sft": 0.5, "rl": 0.85, "ours_rl": 0.9, "paired": _paired(0.5, 0.85, 0.2)}
    held = {c: ok for c, ok, _ in m.verdicts(0.6, {0: good, 1: seed1}, reference)}
    assert all(held.values()) and len(held) == 5
    # above SFT's in the reference env means a paired interval above 0, not a higher rate alone
    unsure = {**reference, "paired": _paired(0.5, 0.85, -0.01)}
    (evidence,) = [ev for c, ok, ev in m.verdicts(0.6, {0: good}, unsure) if c.startswith("the reference") and not ok]
    assert evidence == "reference 85.0% against SFT 50.0%, paired +0.350 [-0.010, +0.400]; ours 90.0%"
    low_seed = m.phase_row(_results(0.6, 0.80, None), tmp_path)
    held = {c.split(" ")[1]: ok for c, ok, _ in m.verdicts(0.75, {0: good, 1: low_seed}, {**reference, "rl": 0.7})}
    assert held["below"] is False and held["RL"] is False and held["reference"] is False
    report = {
        "sft": 0.6,
        "phases": {"0": [good], "1": [seed1]},
        "reference": reference,
        "pro": {},
        "verdicts": m.verdicts(0.6, {0: good, 1: seed1}, reference),
    }
    table = m.markdown(report, "python benchmarks/libero_lift.py --out X")
    assert "| 0 | 40 | - | 128000 | 92.0% |" in table and "| 5 | 80% | 55% | 50% |" in table and "**no**" not in table
    assert "its 95% interval is about ±22%. At iteration 5, 1 of its 4 states already ended otherwise" in table
    assert "| 0 | 40 (3 in the phase) | 640 | 0.0200 | 0.100 | 0.40 | +0.020 ± 0.010 | 3,136 |" in table
    assert m.ours_on(_results(0.6, 0.92, None)["eval_rl"], 5) == 1.0
    two_phases = m.markdown(
        {**report, "phases": {"0": [good | {"runners": 1}, later | {"runners": 2}]}, "pro": {"lan": {"sft": None}}},
        "python benchmarks/libero_lift.py --out X",
    )
    assert "(phases ending at 40 iterations: 1, 40 iterations: 2 runner(s))" in two_phases
    seeds_apart = m.markdown({**report, "phases": {"0": [good | {"runners": 1}], "1": [seed1 | {"runners": 2}]}}, "X")
    assert "At 40 iterations the seeds sampled on different env-runner counts (seed 0: 1, seed 1: 2)" in seeds_apart
    assert "LIBERO-PRO's variants: not scored yet." in two_phases and "RL recipes" not in two_phases
    both = m.markdown({**report, "recipes": {"small": "a", "large": "b"}, "recipe": "large"}, "X")
    assert "`small`: a; `large`: b. The criteria below judge `large`" in both
    assert "paired on the official pairs: seed 0 from 40 to 40 iterations: +0.200 [" in two_phases
    assert "seed 0, SFT to 40: 4 better, 0 worse (z = +2.0); seed 0, 40 iterations to 40: 2 better" in two_phases


def test_a_finished_cell_is_kept_in_the_records_and_restored_from_them(tmp_path):
    """A cell's record keeps its results, evaluations and checkpoints (RL's optimizer state included), not
    its dataset, videos, logs or the optimizer state of SFT and of the frozen control; a fresh OUT gets the cell back before anything runs."""
    lift = _module()
    cell = tmp_path / "out" / "rl_s0"
    files = {
        "results.json": "{}",
        "eval_rl/episodes.jsonl": "{}\n",
        "eval_rl/videos/libero_spatial/a.mp4": "v",
        "eval_rl/plots/libero_spatial.png": "p",
        "rl/checkpoint/policy/model.safetensors": "w",
        "rl/checkpoint/train_state/state.safetensors": "o",
        "rl_control/checkpoint/policy/model.safetensors": "w",
        "rl_control/checkpoint/train_state/state.safetensors": "o",
        "rl/metrics.csv": "iteration\n",
        "rl/tb/events": "e",
        "rl/ray/session/log": "r",
        "data/meta/info.json": "{}",
        "sft/ckpt/model.safetensors": "w",
        "sft/train_state/state.safetensors": "o",
        "cell.log": "l",
        "pipeline.log": "l",
    }
    for rel, text in files.items():
        (cell / rel).parent.mkdir(parents=True, exist_ok=True)
        (cell / rel).write_text(text)
    records = tmp_path / "records"
    kept = lift.archive(cell, records)
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "eval_rl/episodes.jsonl",
        "results.json",
        "rl/checkpoint/policy/model.safetensors",
        "rl/checkpoint/train_state/state.safetensors",
        "rl/metrics.csv",
        "rl_control/checkpoint/policy/model.safetensors",
        "sft/ckpt/model.safetensors",
    ]
    fresh = tmp_path / "fresh" / "rl_s0"
    assert lift.restore(fresh, records) and (fresh / "rl/checkpoint/train_state/state.safetensors").read_text() == "o"
    assert not lift.restore(fresh, records)  # a cell already there is left as it is
    assert not lift.restore(tmp_path / "fresh" / "rl_s1", records)  # no record: nothing to restore


def test_the_sampled_success_counts_each_envs_first_episode_after_a_reset():
    m = _module()

    def row(it, fresh, fresh_rate, ended, rate, updated="1"):
        return {
            "iteration": str(it),
            "fresh_episodes": str(fresh),
            "fresh_success_rate": fresh_rate,
            "episodes": str(ended),
            "success_rate": str(rate),
            "actor_updated": updated,
        }

    rows = [
        row(4, 2, "1.0", 2, 1.0, updated="0"),  # the critic's warm-up: the phase's starting policy
        row(5, 20, "0.5", 30, 0.6),
        row(6, 10, "0.8", 10, 1.0),
        row(7, 0, "", 10, 0.5),  # no env's first episode ended: only the biased count
    ]
    assert m.sampled_rate(rows, 5, 7) == {"rate": 0.6, "episodes": 30.0, "ended_rate": 0.66, "ended_episodes": 50.0}
    assert m.sampled_rate(rows, 1, 7, frozen=True)["episodes"] == 2.0
    assert m.sampled_rate(rows, 7, 9) is None
    assert m.sampled_rate([row(5, 0, "", 20, 0.7)], 1, 9) is None
    phase = {"iterations": 40, "rl": 0.64, "sampled_start": m.sampled_rate(rows, 1, 7, frozen=True)}
    table = "\n".join(m.sampled_lines({"sft": 0.57, "phases": {1: [phase | {"sampled": m.sampled_rate(rows, 5, 7)}]}}))
    assert "| 1 | 40 | 100% of 2 (100%) | 57% | 60% of 30 (66%) | 64% |" in table


def test_the_table_names_the_rl_phase_its_reference_cells_scored(tmp_path):
    """``--table-only`` over finished cells: the reference env's cells of seed 0's last finished phase
    (``reference_rl_it40`` after 40 iterations; a later phase gets its own) are the ones reported."""
    m = _module()
    out, records = tmp_path / "out", tmp_path / "records"
    task = {"task": 0, "name": "pick", "success_rate": 0.6, "state_successes": _states(0.6)}
    sft = {
        "eval_sft": {"success_rate": 0.6, "tasks": [task]},
        "stages_done": list(m.SFT_DONE),
        "collect": {"episodes": 20, "frames": 2000, "expert_success_rate": 0.97},
        "sft": {"steps": 100, "final_loss": 0.1, "parameters": 1000},
    }
    rl = _results(0.6, 0.92, 0.61) | {"stages_done": list(m.RL_DONE + m.CONTROL_DONE)}
    for cell, results in (("sft", sft), ("rl_s0", rl)):
        (out / cell).mkdir(parents=True)
        (out / cell / "results.json").write_text(json.dumps(results))

    def scored(name: str, rate: float) -> None:
        (out / name).mkdir()
        suite = {"success_rate": rate, "tasks": [{"task": 0, "state_successes": _states(rate)}]}
        (out / name / "results.json").write_text(json.dumps({"suites": {m.SUITE: suite}}))

    scored("reference_sft", 0.5)
    scored("reference_rl_it40", 0.8)
    scored("reference_rl_it80", 0.1)  # a later phase's, not finished here: not this table's
    assert m.main(["--out", str(out), "--records", str(records), "--table-only", "--docs", str(tmp_path / "t.md")]) == 1
    report = json.loads((out / "libero_lift.json").read_text())
    assert (report["reference"]["rl"], report["reference"]["rl_iterations"], report["reference"]["sft"]) == (
        0.8,
        40,
        0.5,
    )
    table = (tmp_path / "t.md").read_text()
    assert "| 0 pick | 60% -> 92% | - -> - |" in table  # per task: SFT, then RL's last finished phase
    assert "RL at 40 iterations 80.0%; ours on the same states: SFT 60.0%, RL 100.0%." in table
    # state by state: ours ends states 0-5 (SFT) and 0-9 (RL) in success, the reference 0-4 and 0-7
    assert report["reference"]["agree_sft"] == {"states": 10, "agree": 9, "ours_only": 1, "reference_only": 0}
    assert "RL: the two simulators end 8 of 10 states alike (2 succeed in ours only, 0 in the reference only)" in table
    # seed 0's second phase finished, its reference cells not run yet: the table keeps the first phase's
    shutil.rmtree(out / "reference_rl_it80")
    second = {**rl, "rl": {**rl["rl"], "iterations": 80}}
    (out / "rl_s0_it80").mkdir()
    (out / "rl_s0_it80" / "results.json").write_text(json.dumps(second))
    assert m.main(["--out", str(out), "--records", str(records), "--table-only"]) == 1
    report = json.loads((out / "libero_lift.json").read_text())
    assert report["reference"]["rl_iterations"] == 40 and report["phases"]["0"][-1]["iterations"] == 80
    shutil.rmtree(out / "rl_s0_it80")
    shutil.rmtree(records / "rl_s0_it80")
    # --rl-iterations 40: seed 0's first phase is finished, so nothing runs (no second phase starts)
    assert (
        m.main(
            ["--out", str(out), "--records", str(records), "--until", "rl", "--rl-seeds", "0", "--rl-iterations", "40"]
        )
        == 1
    )
    assert not (out / "rl_s0_it80").exists()
    # the finished cells are kept in the records; the later phase's cell is not this table's
    assert sorted(p.name for p in records.iterdir()) == ["reference_rl_it40", "reference_sft", "rl_s0", "sft"]


def test_update_agreement_reads_the_share_of_two_actor_updates_that_points_the_same_way():
    import torch

    m = _module()
    start = {
        "expert.w": torch.zeros(4),
        "prefix.frozen": torch.ones(3),
        "value_mlp.mlp.0.weight": torch.zeros(2),
        "steps": torch.tensor([7]),
    }
    # a shared step (1, 0, 0, 0) plus noise the runs do not share: (0, 1, 0, 0) and (0, 0, 1, 0)
    a = {**start, "expert.w": torch.tensor([1.0, 1.0, 0.0, 0.0]), "value_mlp.mlp.0.weight": torch.ones(2)}
    b = {**start, "expert.w": torch.tensor([1.0, 0.0, 1.0, 0.0]), "value_mlp.mlp.0.weight": -torch.ones(2)}
    out = m.update_agreement(start, {"0": a, "1": b})
    # the critic's opposite moves and the weights no run moved take no part
    (pair,) = out["cosine"]
    assert pair[:2] == ["0", "1"] and abs(pair[2] - 0.5) < 1e-12
    assert out["relative"] == {"0": None, "1": None}  # moved from zero weights: no scale to read them on
    scaled = m.update_agreement(
        {**start, "expert.w": torch.full((4,), 2.0)}, {"0": {**a, "expert.w": torch.full((4,), 3.0)}, "1": b}
    )
    assert abs(scaled["relative"]["0"] - 0.5) < 1e-12
    opposite = {**start, "expert.w": torch.tensor([-1.0, -1.0, 0.0, 0.0])}
    assert abs(m.update_agreement(start, {"0": a, "1": opposite})["cosine"][0][2] + 1) < 1e-12
    assert m.update_agreement(start, {"0": a}) is None and m.update_agreement(start, {"0": start, "1": start}) is None


def test_a_blend_is_the_start_plus_a_share_of_the_mean_update():
    import torch

    m = _module()
    start = {"expert.w": torch.tensor([1.0, 1.0]), "steps": torch.tensor([3])}
    a = {"expert.w": torch.tensor([3.0, 1.0]), "steps": torch.tensor([5]), "new.w": torch.ones(1)}
    b = {"expert.w": torch.tensor([1.0, -3.0]), "steps": torch.tensor([9]), "new.w": torch.zeros(1)}
    mean = m.blend_weights(start, [a, b], 1.0)
    assert torch.equal(mean["expert.w"], torch.tensor([2.0, -1.0]))
    # integer weights and those the start lacks come from the first run
    assert torch.equal(mean["steps"], torch.tensor([5])) and torch.equal(mean["new.w"], torch.ones(1))
    assert torch.equal(m.blend_weights(start, [a], 0.5)["expert.w"], torch.tensor([2.0, 1.0]))
    assert torch.equal(m.blend_weights(start, [a], 0.0)["expert.w"], start["expert.w"])


def test_blend_specs_name_their_cells_and_refuse_unknown_runs():
    import pytest

    m = _module()
    cells = {"rl_s0": ("0", 0), "rl_s0_it80": ("0", 1), "rl_s1": ("1", 0), "rl_sde2_s1": ("1 sde2", 0)}
    every = m.parse_blend("all", cells)  # every run's first phase
    assert every.runs == ("rl_s0", "rl_s1", "rl_sde2_s1") and every.alpha == 1.0
    assert every.cell == "blend_rl_s0+rl_s1+rl_sde2_s1"
    half = m.parse_blend("rl_sde2_s1@0.5", cells)
    assert half.cell == "blend_rl_sde2_s1_x0.5"
    for b in (every, half, m.parse_blend("rl_s0_it80+rl_s1", cells)):
        assert m.blend_of_cell(b.cell) == b
    assert m.blend_of_cell("rl_s0") is None
    with pytest.raises(SystemExit, match="rl_s7"):
        m.parse_blend("rl_s7", cells)
    with pytest.raises(SystemExit, match="not a number"):
        m.parse_blend("rl_s0@half", cells)


def test_a_written_blend_is_a_bundle_whose_hash_matches_its_weights(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from policies.checkpoint import read_meta
    from policies.files import sha256_file

    m = _module()

    def bundle(name: str, w: list[float]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        save_file({"expert.w": torch.tensor(w)}, str(folder / "model.safetensors"))
        (folder / "stats.json").write_text("{}")
        meta = {"format_version": 1, "family": "flow", "config": {}, "files": {"model.safetensors": "x"}}
        (folder / "config.json").write_text(json.dumps(meta))
        return folder

    start, end = bundle("sft", [0.0, 2.0]), bundle("rl", [4.0, 2.0])
    dest = m.write_blend(start, [end], 0.25, tmp_path / "blend" / "policy")
    meta = read_meta(dest)
    assert meta["files"]["model.safetensors"] == sha256_file(dest / "model.safetensors")
    assert meta["extra"]["blend"]["alpha"] == 0.25
    assert torch.equal(load_file(str(dest / "model.safetensors"))["expert.w"], torch.tensor([1.0, 2.0]))


def test_finished_blends_are_paired_with_sft_and_tabled(tmp_path):
    m = _module()
    out = tmp_path / "out"
    cell = out / "blend_rl_s0_it80+rl_s1"
    cell.mkdir(parents=True)
    task = {"task": 0, "name": "pick", "success_rate": 0.8, "state_successes": _states(0.8)}
    (cell / "results.json").write_text(json.dumps({"suites": {m.SUITE: {"success_rate": 0.8, "tasks": [task]}}}))
    sft = {"eval_sft": {"success_rate": 0.5, "tasks": [_task(0.5)]}}
    phases = {
        "0": [{"rl_minus_sft": 0.1, "iterations": 40}, {"rl_minus_sft": 0.2, "iterations": 80}],
        "1": [{"rl_minus_sft": -0.4, "iterations": 40}],
    }
    cells = {"rl_s0": ("0", 0), "rl_s0_it80": ("0", 1), "rl_s1": ("1", 0)}
    (row,) = m.blend_rows(out, tmp_path / "records", sft, cells, phases, [], run=False)
    assert row["runs"] == ["0 at 80", "1 at 40"] and row["alpha"] == 1.0 and row["states"] == 10
    assert abs(row["difference"] - 0.3) < 1e-12 and abs(row["full_step"] + 0.1) < 1e-12
    # the cell went to the records, and a blend of a run that has not finished is not reported
    assert (tmp_path / "records" / cell.name / "results.json").is_file()
    assert m.blend_rows(out, tmp_path / "records", sft, {"rl_s0": ("0", 0)}, phases, [], run=False) == []
    table = "\n".join(m.blend_lines([row]))
    assert "| mean of seeds 0 at 80, 1 at 40 | 1 | 80.0% | +0.300 [" in table and "| -0.100 |" in table
