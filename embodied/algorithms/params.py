"""Which of a policy's parameters are the actor and which the critic (its value head, or a
separate critic module named ``critic``)."""

from __future__ import annotations

import torch


def split_parameters(
    module: torch.nn.Module, freeze_prefix: bool = False
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """``(actor, critic)`` parameters: the critic is the policy's value head (``value_mlp``), or the
    separate critic (``critic.*``, see :mod:`embodied.algorithms.critic`) when the module has one; the
    value head then takes no part and stops requiring gradients. With ``freeze_prefix`` the
    observation encoder (``prefix``: vision, language, state, fusion) is left out of both and stops
    requiring gradients (a policy names its encoder's submodules in ``prefix_modules``: a LeRobot VLA's
    VLM; ``("prefix",)`` by default). A policy whose ``rl_trainable`` names a submodule (a steered flow policy:
    ``steer``, DSRL) trains that submodule alone, its ``value_mlp`` as the critic; every other weight
    stops requiring gradients."""
    policy = getattr(module, "policy", module)
    only = getattr(policy, "rl_trainable", None)
    named = list(module.named_parameters())
    marks = tuple(f".{m}." for m in getattr(policy, "prefix_modules", ("prefix",)))
    separate = any(name.startswith("critic.") for name, _ in named)
    actor, critic = [], []
    for name, p in named:
        dotted = f".{name}"
        if separate and name.startswith("critic."):
            critic.append(p)
            continue
        if only is not None and f".{only}." not in dotted:
            p.requires_grad_(False)
            continue
        if (freeze_prefix and any(m in dotted for m in marks)) or (separate and ".value_mlp." in dotted):
            p.requires_grad_(False)
            continue
        (critic if ".value_mlp." in dotted else actor).append(p)
    return actor, critic
