"""benchmarks/failure_modes.py: the classification, a real run of the scripted expert and of an
untrained policy in the spatial suite, and its refusals."""

import json

import pytest

from benchmarks import failure_modes as fm


def test_classify_every_mode():
    assert fm.classify(True, 0.0, 0.0, 1.0, False) == "success"
    assert fm.classify(False, 0.10, 0.00, 0.01, False) == "dropped"
    assert fm.classify(False, 0.10, 0.08, 0.01, True) == "held"  # the plan's object first
    assert fm.classify(False, 0.01, 0.00, 0.01, True) == "other_object"
    assert fm.classify(False, 0.01, 0.00, 0.02, False) == "missed_grasp"
    assert fm.classify(False, 0.00, 0.00, 0.30, False) == "elsewhere"


def test_summary_counts_modes_and_states():
    rows = [
        {"task": 1, "init_id": 3, "mode": "dropped"},
        {"task": 1, "init_id": 3, "mode": "dropped"},
        {"task": 1, "init_id": 4, "mode": "success"},
        {"task": 8, "init_id": 3, "mode": "held"},
    ]
    s = fm.summarise(rows)
    assert s["episodes"] == 4 and s["modes"]["dropped"] == 2 and s["modes"]["held"] == 1
    assert s["tasks"]["1"]["states"] == {"dropped": {3: 2}}
    assert s["tasks"]["8"]["modes"]["held"] == 1 and "success" not in s["tasks"]["8"]["states"]


def test_grasp_precision_and_its_table_from_episodes_csv(tmp_path, capsys):
    """The share of off-centre lifts and the success of those against centred ones; episodes that never
    lifted the object do not count; --grasp-table reads the CSVs back."""
    rows = [
        {"mode": "success", "grasp_offset": 0.002},
        {"mode": "success", "grasp_offset": 0.008},
        {"mode": "dropped", "grasp_offset": 0.009},
        {"mode": "dropped", "grasp_offset": 0.020},
        {"mode": "success", "grasp_offset": 0.030},
        {"mode": "missed_grasp", "grasp_offset": ""},
    ]
    g = fm.grasp_precision(rows)
    assert g["lifted"] == 5 and g["offset_p50"] == 0.009 and g["far"] == 2 and g["far_share"] == 0.4
    assert g["far_success"] == 0.5 and g["near"] == 3 and g["near_success"] == round(2 / 3, 4)
    assert fm.grasp_precision(rows[-1:]) == {"lifted": 0}
    assert fm.summarise([r | {"task": 1, "init_id": 0, "grasp_width": 0.04} for r in rows])["grasp_precision"] == g
    path = tmp_path / "episodes.csv"
    path.write_text("mode,grasp_offset\n" + "\n".join(f"{r['mode']},{r['grasp_offset']}" for r in rows) + "\n")
    assert fm.main(["--grasp-table", str(path)]) == 0
    assert f"| {path} | 5 | 0.90 / 2.00 / 2.60 | 40% | 50% (2) | 67% (3) |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not found"):
        fm.main(["--grasp-table", str(tmp_path / "none.csv")])


def test_expert_succeeds_and_an_untrained_policy_fails(tmp_path):
    import policies
    import sims

    assert (
        fm.main(
            [
                "--expert",
                "--tasks",
                "1",
                "--episodes",
                "2",
                "--attempts",
                "1",
                "--gripper-sign",
                "--out",
                str(tmp_path / "expert"),
            ]
        )
        == 0
    )
    got = json.loads((tmp_path / "expert" / "failure_modes.json").read_text())
    assert got["checkpoint"] == "expert" and got["states"] == [0, 1] and got["gripper_sign"]
    assert got["modes"]["success"] == 2 and got["episodes"] == 2
    grasp = got["grasp"]["success"]  # the expert closes on the cube (4 cm) near its centre
    assert grasp["episodes"] == 2 and grasp["offset_median"] < 0.01 and 0.035 < grasp["width_median"] < 0.05

    env = sims.make("mujoco", suite="spatial", num_envs=1, cameras=(), state_obs="privileged")
    state_dim = env.observation_spec["state"].shape[0]
    env.close()
    ckpt = policies.save(
        policies.make(
            "flow",
            cameras=[],
            state_obs="privileged",
            state_dim=state_dim,
            d_model=32,
            prefix_layers=1,
            expert_layers=1,
        ),
        tmp_path / "ckpt",
    )
    assert (
        fm.main(
            [
                "--checkpoint",
                str(ckpt),
                "--tasks",
                "8",
                "--episodes",
                "1",
                "--first-state",
                "50",
                "--attempts",
                "2",
                "--num-envs",
                "2",
                "--out",
                str(tmp_path / "untrained"),
            ]
        )
        == 0
    )
    got = json.loads((tmp_path / "untrained" / "failure_modes.json").read_text())
    assert got["episodes"] == 2 and got["modes"]["success"] == 0
    assert sum(got["modes"].values()) == 2
    rows = (tmp_path / "untrained" / "episodes.csv").read_text().splitlines()
    assert rows[0].split(",") == fm.FIELDS and len(rows) == 3
    assert all(r.split(",")[4] == "220" for r in rows[1:])  # the task's step limit


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "libero_spatial", "--tasks", "0"], "only our MuJoCo suites"),
        (["--suite", "goal", "--tasks", "0"], "no pick_place step"),
        (["--suite", "spatial", "--tasks", "10"], "has tasks 0..9"),
        (["--suite", "nope", "--tasks", "0"], "unknown suite"),
    ],
)
def test_refusals(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        fm.main(["--expert", *argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_refuses_a_folder_without_a_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fm.main(["--checkpoint", str(tmp_path / "nothing"), "--tasks", "1", "--out", str(tmp_path / "out")])
    assert "--checkpoint: no checkpoint bundle" in capsys.readouterr().err
