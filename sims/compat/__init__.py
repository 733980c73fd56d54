"""Adapters from the sims ``VecEnv`` contract to other libraries' env interfaces.

- :mod:`sims.compat.gymnasium_env`: ``GymVectorEnv`` (``gymnasium.vector.VectorEnv``, numpy,
  same-step autoreset) and ``GymEnv`` (single ``gymnasium.Env``). Importing this package
  registers the gymnasium ids ``embodied/Reach-v0``, ``embodied/PickCube-v0`` and
  ``embodied/PlaceCube-v0`` (:func:`register_gymnasium_envs`).
- :mod:`sims.compat.rsl_rl`: ``RslRlVecEnv`` (``rsl_rl.env.VecEnv``, TensorDict observation
  groups) so that ``rsl_rl``'s ``OnPolicyRunner`` trains on our envs. Imported on first use.

Importing this package loads gymnasium (needed to register the ids) but no simulator: MuJoCo
loads when an env is built.
"""

from __future__ import annotations

from typing import Any

from sims.compat.gymnasium_env import GymEnv, GymVectorEnv, register_gymnasium_envs

_RSL_RL_NAMES = ("RslRlVecEnv", "make_rsl_rl_env", "default_ppo_cfg")


def __getattr__(name: str) -> Any:
    # rsl_rl (and tensordict, GitPython) load only when the RSL-RL adapter is asked for.
    if name in _RSL_RL_NAMES:
        from sims.compat import rsl_rl

        return getattr(rsl_rl, name)
    raise AttributeError(f"module 'sims.compat' has no attribute {name!r}")


register_gymnasium_envs()

__all__ = ["GymEnv", "GymVectorEnv", "register_gymnasium_envs", *_RSL_RL_NAMES]
