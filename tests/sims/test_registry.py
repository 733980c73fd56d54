"""The shared registry: lookups, the "did you mean" error, and the tables built on it."""

from __future__ import annotations

import pytest

from sims.registry import Registry, load_attr


def test_lookup_names_and_unknown_error():
    reg = Registry("colour", {"red": 1, "green": 2})
    assert reg.lookup("red") == 1 and reg["green"] == 2 and "red" in reg and len(reg) == 2
    assert reg.names() == ["red", "green"] and Registry("colour", {"b": 0, "a": 1}, sort=True).names() == ["a", "b"]
    with pytest.raises(
        ValueError, match=r"unknown colour 'gren'; did you mean 'green'\? choose one of \['red', 'green'\]"
    ):
        reg.lookup("gren")
    with pytest.raises(ValueError, match=r"^unknown colour 'blue'; choose one of"):
        reg.lookup("blue")
    with pytest.raises(ValueError, match="colour 'red' is already registered"):
        reg.register("red", 3)


def test_load_attr_imports_module_attr_strings():
    import os.path

    assert load_attr("os.path:join") is os.path.join
    assert load_attr(len) is len


def test_policy_families_are_one_table():
    """Each family's config entry is the config class of its policy class."""
    import policies

    assert policies.families() == ["flow", "autoregressive", "diffusion", "pi0", "pi05", "smolvla"]
    for family in policies.families():
        try:
            cls = policies.policy_class(family)
        except ImportError:  # LeRobot's families outside .venv-lerobot: their configs still load
            assert family in ("pi0", "pi05", "smolvla")
            cls = None
        assert cls is None or policies.config_class(family) is cls.config_class
    with pytest.raises(ValueError, match="unknown policy family 'flwo'; did you mean 'flow'"):
        policies.make("flwo")


def test_backends_and_algorithms_use_the_registry():
    import sims
    from embodied.algorithms.registry import ALGORITHMS

    with pytest.raises(ValueError, match="unknown simulation backend 'mujoko'; did you mean 'mujoco'"):
        sims.make("mujoko", task="pick_cube")
    assert "unknown algo 'flow_sd'; did you mean 'flow_sde'" in ALGORITHMS.unknown("flow_sd")
