"""Losses and advantage estimators as pure functions on tensors (chunk-level MDP)."""

from embodied.algorithms.gae import chunk_gae, normalize_advantages
from embodied.algorithms.grpo import (GRPO_KEEP, GRPO_WEIGHTING, episode_weighted_advantages,
                                      grpo_advantages, grpo_group_filter, grpo_return_filter)
from embodied.algorithms.ppo import PPOStats, ppo_loss

__all__ = ["GRPO_KEEP", "GRPO_WEIGHTING", "PPOStats", "chunk_gae", "episode_weighted_advantages",
           "grpo_advantages", "grpo_group_filter", "grpo_return_filter", "normalize_advantages", "ppo_loss"]
