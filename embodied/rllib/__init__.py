"""Ray RLlib integration: the policy as a ``TorchRLModule`` (:mod:`.module`), a batched-VecEnv
``EnvRunner`` (:mod:`.env_runner`), the chunk-PPO ``TorchLearner`` (:mod:`.learner`) and the
``Algorithm`` tying them together with optional overlap of sampling and learning (:mod:`.algorithm`);
Ray start-up for a run (:mod:`.startup`), the run's checkpoint folder (:mod:`.checkpoint`), sampling
that survives lost env runners (:mod:`.recovery`) and a multi-node Ray cluster on one machine for
failure drills (:mod:`.local_cluster`).

Ray is pinned exactly in ``pyproject.toml``: the runner and learner override RLlib internals.
"""

from __future__ import annotations

from typing import Any

from embodied.algorithms.loss import LossConfig
from embodied.rllib.algorithm import ChunkRL, ChunkRLConfig
from embodied.rllib.env_runner import VecEnvRunner, chunk_spaces, make_env_config
from embodied.rllib.learner import ChunkPPOLearner
from embodied.rllib.module import PolicyRLModule, module_config

#: fields of :class:`ChunkRLConfig` that :func:`build_algorithm` accepts in ``rl`` (``loss``: a
#: :class:`embodied.algorithms.loss.LossConfig`)
RL_FIELDS = (
    "lr",
    "critic_lr",
    "loss",
    "freeze_prefix",
    "critic_warmup",
    "num_epochs",
    "minibatch_size",
    "target_kl",
    "kl_rollback",
    "grad_clip",
    "overlap",
)


def build_algorithm(
    policy: Any,
    *,
    instructions: list[str],
    env_config: dict[str, Any],
    rl: dict[str, Any],
    num_env_runners: int = 0,
    num_learners: int = 0,
    num_gpus_per_learner: float = 0.0,
    num_gpus_per_env_runner: float = 0.0,
    seed: int = 0,
    critic: dict[str, Any] | None = None,
    runner_restart_timeout_s: float = 600.0,
) -> ChunkRL:
    """A :class:`ChunkRL` whose learner starts from ``policy``'s weights.

    ``num_env_runners=0`` samples in this process (``env_config["num_envs"]`` envs); ``K > 0`` starts
    K remote runners with ``num_envs`` envs each (Ray must be initialised). ``num_learners=0`` updates
    in this process; ``L > 0`` on L remote learners (data parallel), each with ``num_gpus_per_learner``
    (with ``L = 0`` the driver's learner uses a GPU when ``num_gpus_per_learner > 0``). Remote runners
    get ``num_gpus_per_env_runner`` each (GPU simulators; Ray hides the GPUs from actors that ask for none).
    ``critic`` (``{"kind": "privileged", "input_dim", "hidden"}``) replaces the policy's value head by a
    separate critic on privileged state (:mod:`embodied.algorithms.critic`).

    A remote runner whose process or node is lost is restarted by Ray on a node with a free CPU; an
    iteration waits up to ``runner_restart_timeout_s`` for it, then re-samples its share with the
    current weights (:mod:`embodied.rllib.recovery`).
    """
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    unknown = sorted(set(rl) - set(RL_FIELDS))
    if unknown:
        raise ValueError(f"unknown RL field(s) {unknown}; known: {list(RL_FIELDS)}")
    if "loss" in rl and not isinstance(rl["loss"], LossConfig):
        raise TypeError(f"rl['loss'] must be an embodied.algorithms.loss.LossConfig, got {type(rl['loss']).__name__}")
    obs_space, act_space = chunk_spaces(policy.config.state_dim, policy.chunk_size, policy.action_dim)
    env_config = dict(env_config, num_envs_total=int(env_config["num_envs"]) * max(num_env_runners, 1), seed=seed)
    config = (
        ChunkRLConfig()
        .framework("torch")
        .environment(
            observation_space=obs_space, action_space=act_space, env_config=env_config, disable_env_checking=True
        )
        .env_runners(
            env_runner_cls=VecEnvRunner,
            num_env_runners=num_env_runners,
            create_local_env_runner=num_env_runners == 0,
            num_cpus_per_env_runner=1,
            num_gpus_per_env_runner=num_gpus_per_env_runner,
            num_envs_per_env_runner=int(env_config["num_envs"]),
        )
        # restarts by Ray (the actors' max_restarts); never carry on without a runner: its envs' share
        # of every iteration would be missing. Errors inside sample() come back as values
        # (VecEnvRunner.sample_checked), so the delay before an erroring actor exits only holds other calls.
        .fault_tolerance(
            restart_failed_env_runners=True,
            ignore_env_runner_failures=False,
            max_num_env_runner_restarts=1000,
            delay_between_env_runner_restarts_s=5.0,
        )
        .learners(num_learners=num_learners, num_gpus_per_learner=num_gpus_per_learner)
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=PolicyRLModule,
                observation_space=obs_space,
                action_space=act_space,
                model_config=module_config(policy, instructions, critic),
            )
        )
        .debugging(seed=seed, log_level="WARN")
    )
    for key, value in rl.items():
        setattr(config, key, value)
    if not runner_restart_timeout_s > 0:
        raise ValueError(f"runner_restart_timeout_s must be > 0, got {runner_restart_timeout_s}")
    config.runner_restart_timeout_s = float(runner_restart_timeout_s)
    algo = config.build_algo()
    algo.load_policy_state({k: v.detach().cpu() for k, v in policy.state_dict().items()})
    return algo


__all__ = [
    "ChunkPPOLearner",
    "ChunkRL",
    "ChunkRLConfig",
    "PolicyRLModule",
    "RL_FIELDS",
    "VecEnvRunner",
    "build_algorithm",
    "chunk_spaces",
    "make_env_config",
    "module_config",
]
