"""Which of a policy's parameters are the actor and which the critic (its value head)."""

from __future__ import annotations

import torch


def split_parameters(module: torch.nn.Module, freeze_prefix: bool = False
                     ) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """``(actor, critic)`` parameters: the critic is the policy's value head (``value_mlp``). With
    ``freeze_prefix`` the observation encoder (``prefix``: vision, language, state, fusion) is left
    out of both and stops requiring gradients."""
    actor, critic = [], []
    for name, p in module.named_parameters():
        if freeze_prefix and ".prefix." in f".{name}":
            p.requires_grad_(False)
            continue
        (critic if ".value_mlp." in f".{name}" else actor).append(p)
    return actor, critic
