"""VLA policies behind one contract (:class:`policies.base.Policy`).

    import policies
    policy = policies.make("flow", action_dim=7, chunk_size=5)   # "autoregressive", "diffusion"
    policies.save(policy, "run/ckpt")        # model.safetensors, config.json, stats.json
    policy = policies.load("run/ckpt")

Families are imported lazily: ``import policies`` loads no model code.
"""

from __future__ import annotations

from policies.checkpoint import CheckpointError, SpecMismatchError, load, save
from policies.registry import FAMILIES, Family, config_class, families, make, policy_class

__all__ = [
    "CheckpointError",
    "FAMILIES",
    "Family",
    "SpecMismatchError",
    "config_class",
    "families",
    "load",
    "make",
    "policy_class",
    "save",
]
