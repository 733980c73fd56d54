"""The installed wheel ships the packages and the Hydra configs (not only an editable checkout); the
console scripts refuse command-line keys that no schema declares."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_wheel_contains_packages_and_configs(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "sims/core.py",
        "sims/mujoco/env.py",
        "embodied/runners/pipeline.py",
        "configs/pipeline.yaml",
        "configs/sim/mujoco.yaml",
        "policies/__init__.py",
        "real_robot/__init__.py",
        "benchmarks/cli.py",
    ):
        assert required in names, required
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "embodied-pipeline" in text and "embodied-bench" in text


#: command -> (arguments with a mistyped key and one added with '+' / '++', the keys they should name)
TYPOS = {
    "collect": (["num_env=2", "+episodes_per_tsk=1"], ["num_envs", "episodes_per_task"]),
    "sft": (["data=demos", "policy.num_step=2", "+eval.num_env=2"], ["policy.num_steps", "eval.num_envs"]),
    "train": (["algo.clipp=0.1", "+runtime.num_env_runner=2"], ["algo.clip", "runtime.num_env_runners"]),
    "eval": (["num_env=4", "+episode=3"], ["num_envs", "episodes"]),
    "pipeline": (["sim.num_env=2", "++sft.step=3"], ["sim.num_envs", "sft.steps"]),
    "bench": (["bench=sim", "num_env=[1]", "+repeat=1"], ["num_envs", "repeats"]),
    "serve": (["checkpoint=ckpt", "prot=1", "+max_batc=2"], ["port", "max_batch"]),
    "deploy": (["sim.tsk=1", "+episode=2"], ["sim.task", "episodes"]),
}


@pytest.mark.parametrize("command", sorted(TYPOS))
def test_commands_refuse_unknown_keys(tmp_path, command):
    """A mistyped key, plain or with '+', stops the command (status 2) before anything runs, naming the
    closest valid key instead of Hydra's "To append to your config use +key=..." hint."""
    args, expected = TYPOS[command]
    out = tmp_path / "out"
    where = f"hydra.run.dir={out}" if command == "serve" else f"out={out}"  # serve has no run folder
    proc = subprocess.run(
        [str(BIN / f"embodied-{command}"), *args, where],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=120,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    wrong = [
        a.split("=")[0].lstrip("+") for a in args if a.split("=")[0].lstrip("+") not in ("data", "bench", "checkpoint")
    ]
    for key, closest in zip(wrong, expected):
        assert f"embodied-{command}: unknown key '{key}'; did you mean '{closest}'?" in proc.stderr, proc.stderr
    assert "To append" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder (nor Hydra's outputs/ in the working directory)


def _composed(config_name: str, overrides: list[str]):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides)


def test_valid_overrides_pass_the_key_check():
    """Group selections, typed fields at every depth, dict fields ('+' adds their keys) and Hydra's
    own keys pass both checks: the command line's (before Hydra) and the composed config's."""
    import benchmarks.cli  # noqa: F401  (each app module stores its schemas)
    import embodied.runners.collect  # noqa: F401
    import embodied.runners.eval  # noqa: F401
    import embodied.runners.pipeline  # noqa: F401
    import embodied.runners.sft  # noqa: F401
    import embodied.runners.train  # noqa: F401
    import real_robot.cli  # noqa: F401
    from embodied.config import command_line_problems, unknown_keys

    hydra_keys = ["hydra.run.dir=/tmp/somewhere", "hydra/job_logging=disabled", "hydra.job.chdir=false"]
    valid = [
        (
            "train",
            [
                "algo=flow_sde",
                "algo.clip=0.3",
                "policy=flow",
                "policy.num_steps=4",
                "runtime=cluster",
                "runtime.num_env_runners=2",
                "suite=goal",
                "tasks=[1,2]",
                "out=/tmp/x",
                *hydra_keys,
            ],
        ),
        ("train", ["algo=grpo", "algo.group_size=2", "runtime=local", "++seed=3", "iterations=3"]),
        ("sft", ["policy=autoregressive", "policy.d_model=32", "eval.suite=goal", "data=d", "out=o"]),
        ("sft", ["policy=diffusion", "++policy.chunk_size=3", "steps=3"]),
        ("eval", ["policy=expert", "num_envs=4", "suite=goal", "out=o"]),
        ("collect", ["num_envs=2", "suite=goal", "out=o"]),
        (
            "pipeline",
            [
                "sim=mujoco",
                "sim.num_envs=2",
                "policy=flow",
                "policy.d_model=32",
                "sft.steps=3",
                "algo@rl.algo=flow_noise",
                "rl.algo.lr=1e-5",
                "runtime@rl.runtime=local",
                "eval.attempts=1",
            ],
        ),
        ("bench", ["bench=sim", "num_envs=[1,2]", "repeats=1", "out=o", *hydra_keys]),
        ("bench", ["bench=policy", "families=[flow]", "+policy_overrides.d_model=64", "out=o"]),
        ("bench", ["bench=train", "num_envs=2", "out=o"]),
        ("serve", ["checkpoint=c", "port=8001", "max_batch=2"]),
        ("deploy", ["sim.task=3", "sim.suite=goal", "episodes=2", "out=o"]),
    ]
    for config_name, overrides in valid:
        assert command_line_problems(config_name, overrides) == [], (config_name, overrides)
        assert unknown_keys(_composed(config_name, overrides)) == [], (config_name, overrides)
    # and the same checks do catch the '+' forms, at the top and nested, which Hydra itself accepts
    for config_name, overrides, path in [
        ("train", ["+algo.clipp=1"], "algo.clipp"),
        ("train", ["policy=flow", "++policy.num_step=1"], "policy.num_step"),
        ("eval", ["+num_env=4"], "num_env"),
        ("bench", ["bench=latency", "+delay=[1]"], "delay"),
    ]:
        assert [p.path for p in command_line_problems(config_name, overrides)] == [path]
        assert [p.path for p in unknown_keys(_composed(config_name, overrides))] == [path]
    # a key of a group that nothing selects (policy: null): Hydra's hint would be '+', which builds no policy
    problems = command_line_problems("train", ["policy.num_steps=4"])
    assert [(p.path, p.unselected) for p in problems] == [("policy.num_steps", True)]
    assert "select one first: policy=" in problems[0].message("embodied-train")


def test_schemas_are_no_options_of_their_groups(tmp_path):
    """The typed schemas the group members extend are not themselves options of the groups (Hydra
    lists the options for an unknown one, and in --help), and the members stay typed."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    import benchmarks.cli  # noqa: F401
    import embodied.runners.train  # noqa: F401

    with initialize_config_module(config_module="configs", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        options = {g: loader.get_group_options(g) for g in ("algo", "runtime", "policy", "bench")}
    assert "flow_sde" in options["algo"] and "cluster" in options["runtime"] and "flow" in options["policy"]
    assert [o for opts in options.values() for o in opts if "schema" in o] == []
    for bad in (["algo.lr=abc"], ["runtime=cluster", "runtime.overlap=maybe"], ["policy=flow", "policy.num_steps=x"]):
        with pytest.raises(ConfigCompositionException):
            _composed("train", bad)
    proc = subprocess.run(
        [str(BIN / "embodied-train"), "algo=nosuch", f"out={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode != 0 and "Could not find 'algo/nosuch'" in proc.stderr
    assert "\tflow_sde\n" in proc.stderr and "_schema" not in proc.stderr
