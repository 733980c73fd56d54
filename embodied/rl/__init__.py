"""Chunk-level on-policy RL, free of Ray: the maths and the data path of ``embodied-train``.

- advantages: chunk GAE with truncations (:mod:`~embodied.rl.gae`) and GRPO's group-relative
  advantages and dynamic sampling (:mod:`~embodied.rl.grpo`), pure functions on tensors;
- losses: the PPO loss (:mod:`~embodied.rl.ppo`, a pure function) and the chunk PPO / GRPO loss of
  a policy on a minibatch with its one typed config, :class:`~embodied.rl.loss.LossConfig`
  (:mod:`~embodied.rl.loss`);
- rollout: batched chunk rollouts of a VecEnv (:mod:`~embodied.rl.rollout`);
- batch: training batches (chunk GAE, or GRPO groups) and their minibatches (:mod:`~embodied.rl.batch`);
- critic: the separate critic on privileged state (:mod:`~embodied.rl.critic`);
- params: the actor / critic split of a policy's parameters (:mod:`~embodied.rl.params`);
- algorithm registry: the algorithms ``embodied-train`` knows (:mod:`~embodied.rl.registry`);
- update schedule: epochs of evenly cut minibatches with an early stop at a target KL, and its
  defaults, :class:`~embodied.rl.update.UpdateConfig` (:mod:`~embodied.rl.update`).

The RLlib adapter (:mod:`embodied.rllib`) plugs them into its EnvRunner, Learner and Algorithm.
"""
