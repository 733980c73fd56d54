"""Chunk-level on-policy RL building blocks: batched rollouts of a VecEnv and the PPO update.

These are what the RLlib integration (``embodied/rllib``) plugs in: the EnvRunner collects a
:class:`~embodied.rl.rollout.Rollout` with :func:`~embodied.rl.rollout.collect_chunks`, the Learner
applies :func:`~embodied.rl.ppo_update.ppo_update`.
"""
