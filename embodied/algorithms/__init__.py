"""Chunk-level on-policy RL, free of Ray: the maths and the data path of ``embodied-train``.

- advantages: chunk GAE with truncations (:mod:`~embodied.algorithms.gae`) and GRPO's group-relative
  advantages and dynamic sampling (:mod:`~embodied.algorithms.grpo`), pure functions on tensors;
- losses: the PPO loss (:mod:`~embodied.algorithms.ppo`, a pure function) and the chunk PPO / GRPO loss of
  a policy on a minibatch with its one typed config, :class:`~embodied.algorithms.loss.LossConfig`
  (:mod:`~embodied.algorithms.loss`);
- rollout: batched chunk rollouts of a VecEnv (:mod:`~embodied.algorithms.rollout`);
- batch: training batches (chunk GAE, or GRPO groups, as its typed config
  :class:`~embodied.algorithms.batch.AdvantageConfig` says) and their minibatches (:mod:`~embodied.algorithms.batch`);
- sampling: an env runner's one typed config, :class:`~embodied.algorithms.sampling.EnvRunnerSettings`
  (:mod:`~embodied.algorithms.sampling`);
- critic: the separate critic on privileged state and which critic a run trains,
  :class:`~embodied.algorithms.critic.CriticConfig` (:mod:`~embodied.algorithms.critic`);
- params: the actor / critic split of a policy's parameters (:mod:`~embodied.algorithms.params`);
- algorithm registry: the algorithms ``embodied-train`` knows (:mod:`~embodied.algorithms.registry`);
- update schedule: epochs of evenly cut minibatches with an early stop at a target KL, and the
  update's typed config, :class:`~embodied.algorithms.update.UpdateConfig` (:mod:`~embodied.algorithms.update`).

Each typed config is frozen, holds its settings' defaults, has the names of ``embodied-train``'s YAML keys
and checks itself when made. The RLlib adapter (:mod:`embodied.rllib`) plugs them into its EnvRunner,
Learner and Algorithm.
"""
