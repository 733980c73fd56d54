"""Chunk-level on-policy RL building blocks, free of Ray: batched rollouts of a VecEnv
(:mod:`~embodied.rl.rollout`), training batches with chunk GAE or GRPO groups
(:mod:`~embodied.rl.batch`), the minibatch loss (:mod:`~embodied.rl.loss`) and an in-process
update (:mod:`~embodied.rl.update`). The RLlib integration (:mod:`embodied.rllib`) plugs them into
its EnvRunner and Learner.
"""
