"""The policy families by name, and a fresh policy of one: :func:`make`.

Families are imported lazily: importing this module loads no model code.
"""

from __future__ import annotations

import importlib
from typing import Any

_FAMILIES: dict[str, str] = {
    "flow": "policies.flow.modeling_flow:FlowPolicy",
    "autoregressive": "policies.autoregressive.modeling_autoregressive:AutoregressivePolicy",
    "diffusion": "policies.diffusion.modeling_diffusion:DiffusionPolicy",
}


def families() -> list[str]:
    return list(_FAMILIES)


def policy_class(family: str) -> Any:
    if family not in _FAMILIES:
        raise ValueError(f"unknown policy family {family!r}; choose one of {families()}")
    module, _, attr = _FAMILIES[family].partition(":")
    return getattr(importlib.import_module(module), attr)


def make(family: str, **overrides: Any) -> Any:
    """A fresh policy of ``family`` with its default config updated by ``overrides``."""
    cls = policy_class(family)
    base = cls.config_class().to_dict()
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise ValueError(f"unknown {family} config key(s) {unknown}; known: {sorted(base)}")
    base.update(overrides)
    return cls(cls.config_class.from_dict(base))
