"""The policy families by name, and a fresh policy of one: :func:`make`.

One table, :data:`FAMILIES`: each family's policy class and config class as ``"module:attr"``
strings, imported on use, so importing this module loads no model code.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

from sims.registry import Registry, closest_key, load_attr


class Family(NamedTuple):
    """Where a policy family's code lives (``"module:attr"``, imported on use)."""

    policy: str  # the :class:`policies.base.Policy` subclass
    config: str  # its config dataclass, importable without the model code (the Hydra schemas need only it)


FAMILIES: Registry[Family] = Registry(
    "policy family",
    {
        "flow": Family("policies.flow.modeling_flow:FlowPolicy", "policies.flow.configuration_flow:FlowConfig"),
        "autoregressive": Family(
            "policies.autoregressive.modeling_autoregressive:AutoregressivePolicy",
            "policies.autoregressive.configuration_autoregressive:AutoregressiveConfig",
        ),
        "diffusion": Family(
            "policies.diffusion.modeling_diffusion:DiffusionPolicy",
            "policies.diffusion.configuration_diffusion:DiffusionConfig",
        ),
        # LeRobot's pretrained VLAs (in .venv-lerobot: LeRobot needs CPython >= 3.12, torch < 2.12)
        "pi0": Family(
            "policies.lerobot.modeling_lerobot:Pi0Policy", "policies.lerobot.configuration_lerobot:Pi0Config"
        ),
        "pi05": Family(
            "policies.lerobot.modeling_lerobot:Pi05Policy", "policies.lerobot.configuration_lerobot:Pi05Config"
        ),
        "smolvla": Family(
            "policies.lerobot.modeling_lerobot:SmolVLAPolicy", "policies.lerobot.configuration_lerobot:SmolVLAConfig"
        ),
    },
)


def families() -> list[str]:
    return FAMILIES.names()


def policy_class(family: str) -> Any:
    return load_attr(FAMILIES.lookup(family).policy)


def config_class(family: str) -> Any:
    """The config dataclass of ``family`` (imports no model code)."""
    return load_attr(FAMILIES.lookup(family).config)


def config_with(family: str, values: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None) -> Any:
    """The config of ``family`` from ``values`` (its fields as a dict) updated by ``overrides``, validated
    by the config itself; an override the config has no field for is refused, naming the closest."""
    from policies.errors import ConfigOverrideError

    cls = config_class(family)
    known = set(cls().to_dict())
    for key in sorted(set(overrides or {}) - known):
        near = closest_key(key, known)
        raise ConfigOverrideError(
            f"unknown {family} config key {key!r}"
            + (f": did you mean {near!r}?" if near else f"; known: {sorted(known)}")
        )
    try:
        return cls.from_dict({**values, **(overrides or {})})
    except ValueError as err:
        if not overrides:
            raise
        raise ConfigOverrideError(f"{family} config with {dict(overrides)}: {err}") from None


def make(family: str, **overrides: Any) -> Any:
    """A fresh policy of ``family`` with its default config updated by ``overrides``."""
    return policy_class(family)(config_with(family, config_class(family)().to_dict(), overrides))
