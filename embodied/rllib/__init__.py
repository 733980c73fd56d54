"""Ray RLlib integration: the policy as a ``TorchRLModule`` (:mod:`.module`), a batched-VecEnv
``EnvRunner`` (:mod:`.env_runner`), the chunk-PPO ``TorchLearner`` (:mod:`.learner`) and the
``Algorithm`` tying them together with optional overlap of sampling and learning (:mod:`.algorithm`);
Ray start-up for a run (:mod:`.startup`), the run's checkpoint folder (:mod:`.checkpoint`), sampling
that survives lost env runners (:mod:`.recovery`) and a multi-node Ray cluster on one machine for
failure drills (:mod:`.local_cluster`).

Each part receives one typed, frozen config as it was made: the env runners an
:class:`~embodied.algorithms.sampling.EnvRunnerSettings`, the schedule and learners an
:class:`~embodied.algorithms.update.UpdateConfig`, the learners a :class:`~embodied.algorithms.loss.LossConfig`
(:func:`build_algorithm`, :class:`ChunkRLConfig`).

Ray is pinned exactly in ``pyproject.toml``: the runner and learner override RLlib internals.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from embodied.algorithms.loss import LossConfig
from embodied.algorithms.sampling import EnvRunnerSettings
from embodied.algorithms.update import UpdateConfig
from embodied.rllib.algorithm import ChunkRL, ChunkRLConfig
from embodied.rllib.env_runner import VecEnvRunner, chunk_spaces, make_env_config, settings_from_env_config
from embodied.rllib.learner import ChunkPPOLearner
from embodied.rllib.module import PolicyRLModule, module_config

#: keys of the ``rl`` dict :func:`build_algorithm` took before the typed configs (deprecated), and the
#: :class:`~embodied.algorithms.update.UpdateConfig` field each is (``loss`` and ``overlap`` pass as they are)
LEGACY_RL_KEYS = {
    "lr": "lr",
    "critic_lr": "critic_lr",
    "freeze_prefix": "freeze_prefix",
    "critic_warmup": "critic_warmup",
    "num_epochs": "epochs",
    "minibatch_size": "minibatch_size",
    "target_kl": "target_kl",
    "kl_rollback": "kl_rollback",
    "grad_clip": "max_grad_norm",
}
#: the keys the deprecated ``rl`` dict of :func:`build_algorithm` accepts
RL_FIELDS = (*LEGACY_RL_KEYS, "loss", "overlap")


def build_algorithm(
    policy: Any,
    *,
    instructions: list[str],
    env_runner: EnvRunnerSettings | None = None,
    update: UpdateConfig | None = None,
    loss: LossConfig | None = None,
    overlap: bool = False,
    num_env_runners: int = 0,
    num_learners: int = 0,
    num_gpus_per_learner: float = 0.0,
    num_gpus_per_env_runner: float = 0.0,
    seed: int = 0,
    critic: dict[str, Any] | None = None,
    runner_restart_timeout_s: float = 600.0,
    env_config: dict[str, Any] | None = None,
    rl: dict[str, Any] | None = None,
) -> ChunkRL:
    """A :class:`ChunkRL` whose learner starts from ``policy``'s weights; each part receives its typed
    config as given: every env runner ``env_runner``, the schedule and learners ``update`` (default:
    :class:`UpdateConfig`'s defaults), the learners ``loss`` (default: :class:`LossConfig`'s).

    ``num_env_runners=0`` samples in this process (``env_runner.num_envs`` envs); ``K > 0`` starts
    K remote runners with ``num_envs`` envs each (Ray must be initialised). ``num_learners=0`` updates
    in this process; ``L > 0`` on L remote learners (data parallel), each with ``num_gpus_per_learner``
    (with ``L = 0`` the driver's learner uses a GPU when ``num_gpus_per_learner > 0``). Remote runners
    get ``num_gpus_per_env_runner`` each (GPU simulators; Ray hides the GPUs from actors that ask for none).
    ``overlap``: sample iteration k+1 while learning on k. ``critic`` (``{"kind": "privileged",
    "input_dim", "hidden"}``, :meth:`embodied.algorithms.critic.CriticConfig.module_entry`) replaces the
    policy's value head by a separate critic on privileged state (:mod:`embodied.algorithms.critic`).

    A remote runner whose process or node is lost is restarted by Ray on a node with a free CPU; an
    iteration waits up to ``runner_restart_timeout_s`` for it, then re-samples its share with the
    current weights (:mod:`embodied.rllib.recovery`).

    ``env_config`` (:func:`make_env_config`'s dict) and ``rl`` (:data:`RL_FIELDS`) are the arguments of
    before the typed configs: deprecated, converted here (a wrong key raises here), removed in the next
    release.
    """
    if env_config is not None or rl is not None:
        env_runner, update, loss, overlap = _from_legacy(env_config, rl, env_runner, update, loss, overlap)
    if env_runner is None:
        raise TypeError("build_algorithm needs env_runner=EnvRunnerSettings(...)")
    config = _rllib_config(policy, instructions, env_runner, num_env_runners, num_gpus_per_env_runner, critic)
    config.learners(num_learners=num_learners, num_gpus_per_learner=num_gpus_per_learner)
    config.debugging(seed=seed, log_level="WARN")
    config.chunk_rl(
        env_runner_settings=env_runner,
        update=update or UpdateConfig(),
        loss=loss or LossConfig(),
        overlap=overlap,
        runner_restart_timeout_s=runner_restart_timeout_s,
    )
    algo = config.build_algo()
    algo.load_policy_state({k: v.detach().cpu() for k, v in policy.state_dict().items()})
    return algo


def _rllib_config(
    policy: Any,
    instructions: list[str],
    env_runner: EnvRunnerSettings,
    num_env_runners: int,
    num_gpus_per_env_runner: float,
    critic: dict[str, Any] | None,
) -> ChunkRLConfig:
    """The RLlib side of the config: spaces, env runners and their fault tolerance, the RLModule."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    obs_space, act_space = chunk_spaces(policy.config.state_dim, policy.chunk_size, policy.action_dim)
    return (
        ChunkRLConfig()
        .framework("torch")
        .environment(observation_space=obs_space, action_space=act_space, disable_env_checking=True)
        .env_runners(
            env_runner_cls=VecEnvRunner,
            num_env_runners=num_env_runners,
            create_local_env_runner=num_env_runners == 0,
            num_cpus_per_env_runner=1,
            num_gpus_per_env_runner=num_gpus_per_env_runner,
            num_envs_per_env_runner=env_runner.num_envs,
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
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=PolicyRLModule,
                observation_space=obs_space,
                action_space=act_space,
                model_config=module_config(policy, instructions, critic),
            )
        )
    )


def _from_legacy(
    env_config: dict[str, Any] | None,
    rl: dict[str, Any] | None,
    env_runner: EnvRunnerSettings | None,
    update: UpdateConfig | None,
    loss: LossConfig | None,
    overlap: bool,
) -> tuple[EnvRunnerSettings | None, UpdateConfig | None, LossConfig | None, bool]:
    """The typed configs of :func:`build_algorithm`'s deprecated ``env_config`` / ``rl`` arguments."""
    warnings.warn(
        "build_algorithm(env_config=..., rl=...) is deprecated: pass env_runner=EnvRunnerSettings(...), "
        "update=UpdateConfig(...), loss=LossConfig(...), overlap=...",
        DeprecationWarning,
        stacklevel=3,
    )
    if env_config is not None:
        if env_runner is not None:
            raise TypeError("pass env_runner or the deprecated env_config, not both")
        env_runner = settings_from_env_config(env_config)
    rl = dict(rl or {})
    unknown = sorted(set(rl) - set(RL_FIELDS))
    if unknown:
        raise ValueError(f"unknown RL field(s) {unknown}; known: {list(RL_FIELDS)}")
    fields = {new: rl.pop(old) for old, new in LEGACY_RL_KEYS.items() if old in rl}
    if fields:
        if update is not None:
            raise TypeError("pass update or the deprecated rl's update fields, not both")
        update = dataclasses.replace(UpdateConfig(), **fields)
    if "loss" in rl:
        if loss is not None:
            raise TypeError("pass loss or the deprecated rl['loss'], not both")
        loss = rl.pop("loss")
    return env_runner, update, loss, bool(rl.pop("overlap", overlap))


__all__ = [
    "ChunkPPOLearner",
    "ChunkRL",
    "ChunkRLConfig",
    "EnvRunnerSettings",
    "LossConfig",
    "PolicyRLModule",
    "RL_FIELDS",
    "UpdateConfig",
    "VecEnvRunner",
    "build_algorithm",
    "chunk_spaces",
    "make_env_config",
    "module_config",
]
