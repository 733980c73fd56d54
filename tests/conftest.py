"""Test session set-up: pick MuJoCo's offscreen GL platform before any test module imports
mujoco (MuJoCo fixes its GL backend at import time). The helpers tests import (``from conftest
import compose``) and the fixtures of more than one test file live here, the only conftest.py."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sims.mujoco  # noqa: E402,F401  (selects EGL, or OSMesa where EGL is missing)


def compose(config_name: str, *overrides: str):
    """The typed config an ``embodied-*`` command builds from ``overrides``, composed in-process
    (checks of bad input without a process start-up each). Import the command's module first: it
    registers the config schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="configs", version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name=config_name, overrides=list(overrides)))


# The real_robot tests (tests/real_robot/): a tiny flow policy behind a live websocket server, and the
# openpi-style observation its clients send. Shared here rather than in a tests/real_robot/conftest.py:
# a second conftest module would shadow this one for ``from conftest import compose``.

#: the tiny flow policy those tests serve (their ``TINY``)
SERVED_TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1)


def openpi_obs(size: int = 32) -> dict:
    """One request as an openpi client sends it: state, two camera images of ``size``, prompt."""
    import numpy as np

    return {
        "observation/state": np.zeros(15, np.float32),
        "observation/images/agentview": np.zeros((size, size, 3), np.uint8),
        "observation/images/wrist": np.zeros((size, size, 3), np.uint8),
        "prompt": "lift the can",
    }


@pytest.fixture(scope="module")
def tiny_server():
    import torch

    import policies
    from real_robot.server import PolicyServer, ServerThread

    torch.manual_seed(0)
    server = PolicyServer(
        policies.make("flow", chunk_size=6, **SERVED_TINY), api_key="s3cret", max_message_bytes=1 << 20
    )
    with ServerThread(server) as port:
        yield server, port


def _have_libero_venv() -> bool:
    import sims.libero as libero

    return libero.VENV.joinpath("bin", "python").is_file() or bool(os.environ.get(libero.PYTHON_ENV))


#: the tests that run the reference LIBERO env (or export its scenes) skip without its venv
needs_libero_venv = pytest.mark.skipif(
    not _have_libero_venv(), reason="the reference LIBERO venv .venv-libero is missing: run bash scripts/setup.sh"
)


def _exported_once(tmp_path_factory, name: str, suite: str, tasks: list[int], timeout: int) -> tuple[Path, str]:
    """``tasks`` of ``suite`` exported by the reference venv into a fresh cache ``name``: ``(root, stdout)``.

    Under pytest-xdist the workers share one export (a folder beside their own, under a lock): the
    first exports, the others wait and reuse it."""
    import fcntl
    import subprocess

    from sims.libero import scenes

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    base = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    root, log = base / name, base / f"{name}.stdout"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not log.is_file():
            root.mkdir(exist_ok=True)
            argv, env = scenes.export_command(root, [suite], tasks)
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            log.write_text(proc.stdout)
    return root, log.read_text()


@pytest.fixture(scope="session")
def libero_exported(tmp_path_factory):
    """Task 0 of libero_spatial exported by the reference venv into a fresh cache: ``(root, stdout)``
    (the LIBERO scene and controller tests; they skip without ``.venv-libero``)."""
    return _exported_once(tmp_path_factory, "libero_cache", "libero_spatial", [0], 300)


@pytest.fixture(scope="session")
def libero_goal_exported(tmp_path_factory):
    """Tasks 0 (open the middle drawer), 3 (open the top drawer and put the bowl inside), 5 (push the
    plate to the front of the stove), 7 (turn on the stove) and 9 (the wine bottle onto the rack) of
    libero_goal exported by the reference venv into a fresh cache: its root."""
    return _exported_once(tmp_path_factory, "libero_goal_cache", "libero_goal", [0, 3, 5, 7, 9], 600)[0]


# The LeRobot family tests (tests/lerobot_families/, run in .venv-lerobot by scripts/test.sh): tiny,
# randomly initialised models (policies.lerobot.tiny), so nothing is downloaded. Here rather than in a
# tests/lerobot_families/conftest.py, for the reason above.


@pytest.fixture(scope="session")
def lerobot_tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot_tiny")


@pytest.fixture(scope="session")
def tiny_pi0_kwargs(lerobot_tiny_dir) -> dict:
    from policies.lerobot.tiny import tiny_config

    return tiny_config("pi0", lerobot_tiny_dir)


@pytest.fixture(scope="session")
def tiny_pi05_kwargs(lerobot_tiny_dir) -> dict:
    from policies.lerobot.tiny import tiny_config

    return tiny_config("pi05", lerobot_tiny_dir)


@pytest.fixture(scope="session")
def tiny_smolvla_kwargs(lerobot_tiny_dir) -> dict:
    from policies.lerobot.tiny import tiny_config

    return tiny_config("smolvla", lerobot_tiny_dir)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Two goal tasks' scripted demonstrations, one episode each at 32 px (the SFT tests' dataset)."""
    from embodied.data.collect import collect_suite

    root = tmp_path_factory.mktemp("demos") / "ds"
    collect_suite("goal", root, episodes_per_task=1, task_ids=[2, 3], num_envs=2, image_size=32)
    return root
