"""The RL algorithms ``embodied-train`` knows: for each, the policy family it trains, the sampler
its rollouts use and whether it has a critic (PPO) or scores groups of episodes (GRPO-style)."""

from __future__ import annotations

from typing import NamedTuple, Optional

from sims.registry import Registry


class AlgoSpec(NamedTuple):
    family: str  # the policy family it trains (flow | autoregressive)
    sampler: Optional[str]  # the flow sampler of its rollouts (sde | sde_full | noise | fpo | steer), or None
    critic: bool  # True: PPO with a value function; False: group-relative advantages, no critic


ALGORITHMS: Registry[AlgoSpec] = Registry(
    "algo",
    {
        "flow_sde": AlgoSpec("flow", "sde", True),
        "flow_sde_full": AlgoSpec("flow", "sde_full", True),
        "flow_noise": AlgoSpec("flow", "noise", True),
        "ppo": AlgoSpec("autoregressive", None, True),
        "grpo": AlgoSpec("autoregressive", None, False),
        "flow_grpo": AlgoSpec("flow", "sde", False),
        "flow_fpo": AlgoSpec("flow", "fpo", False),
        "flow_dsrl": AlgoSpec("flow", "steer", True),
        "flow_dsrl_grpo": AlgoSpec("flow", "steer", False),
    },
    sort=True,
)

#: the critic-free ones: group-relative advantages (whole episodes from shared initial states)
GROUP_ALGORITHMS = tuple(name for name, spec in ALGORITHMS.items() if not spec.critic)


#: flow-matching families beyond ``flow`` and the samplers they have (LeRobot's pi0, pi0.5, SmolVLA:
#: Flow-SDE, one step or all, and Flow-Noise): the flow algorithms with those samplers train them too
FLOW_MATCHING_FAMILIES = {fam: ("sde", "sde_full", "noise") for fam in ("pi0", "pi05", "smolvla")}


def trains(spec: AlgoSpec, family: str) -> bool:
    """Whether the algorithm ``spec`` trains a policy of ``family``."""
    if spec.family == family:
        return True
    return spec.family == "flow" and spec.sampler in FLOW_MATCHING_FAMILIES.get(family, ())


def algorithms_for(family: str) -> list[str]:
    """The algorithms that train a policy of ``family``."""
    return [name for name, spec in ALGORITHMS.items() if trains(spec, family)]
