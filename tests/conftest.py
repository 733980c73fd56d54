"""Test session set-up: pick MuJoCo's offscreen GL platform before any test module imports
mujoco (MuJoCo fixes its GL backend at import time)."""

import os

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
