"""``VecEnvRunner``: an RLlib ``EnvRunner`` that owns one batched :class:`sims.VecEnv`.

RLlib's stock ``SingleAgentEnvRunner`` loops in Python over gymnasium sub-envs and episodes; this
runner instead steps all its envs as one batch of action chunks (:func:`embodied.algorithms.rollout.collect_chunks`)
and returns a ready training batch (chunk GAE, or GRPO groups) as tensors.

What it samples is one typed, frozen config, :class:`~embodied.algorithms.sampling.EnvRunnerSettings`
(checked when made, in the driver), which the runner receives as ``config.env_runner_settings``
(:func:`embodied.rllib.build_algorithm` puts it there); its seed is the RLlib config's ``seed``.
"""

from __future__ import annotations

import time
import traceback
import warnings
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from embodied.algorithms.batch import AdvantageConfig, training_batch
from embodied.algorithms.critic import CriticInputs
from embodied.algorithms.rollout import collect_chunks
from embodied.algorithms.sampling import INIT_POOLS, EnvRunnerSettings

__all__ = [
    "INIT_POOLS",
    "EnvRunnerSettings",
    "VecEnvRunner",
    "chunk_spaces",
    "env_tasks",
    "fresh_episodes",
    "group_initial_states",
    "make_env_config",
    "runner_envs",
    "settings_from_env_config",
]

#: keys of the env-config dict of before :class:`EnvRunnerSettings` (:func:`make_env_config`) that went
#: into its :class:`~embodied.algorithms.batch.AdvantageConfig` (old key -> field), and those renamed
LEGACY_ADVANTAGE_KEYS = {"algo": "name"} | {
    key: key for key in ("gamma", "lam", "group_size", "grpo_weighting", "grpo_keep", "grpo_std_norm")
}
LEGACY_RENAMED_KEYS = {"max_steps": "max_episode_steps"}


def settings_from_env_config(env_config: Mapping[str, Any]) -> EnvRunnerSettings:
    """The settings of an env-config dict of before :class:`EnvRunnerSettings` (:func:`make_env_config`'s
    keys; ``seed`` and ``num_envs_total`` are dropped: the runner takes them from its RLlib config). A
    key of neither kind raises here, in the driver. Deprecated: build the settings; removed in the
    next release."""
    rest = {k: v for k, v in env_config.items() if k not in ("seed", "num_envs_total")}
    advantages = {new: rest.pop(old) for old, new in LEGACY_ADVANTAGE_KEYS.items() if old in rest}
    advantages.setdefault("name", "ppo")
    for old, new in LEGACY_RENAMED_KEYS.items():
        if old in rest:
            rest[new] = rest.pop(old)
    unknown = sorted(set(rest) - set(EnvRunnerSettings.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown env_config key(s) {unknown}; build an EnvRunnerSettings instead")
    return EnvRunnerSettings(advantages=AdvantageConfig(**advantages), **rest)


def make_env_config(
    *,
    suite: str,
    tasks: list[int],
    num_envs: int,
    image_size: int,
    chunks_per_iter: int,
    reward_type: str = "sparse",
    max_steps: int | None = None,
    algo: str = "ppo",
    group_size: int = 2,
    gamma: float = 0.99,
    lam: float = 0.95,
    latency_delays: list[int] | None = None,
    backend: str | None = None,
    truncation: str = "bootstrap",
    inference_device: str = "cpu",
    init_states: int | None = None,
    grpo_weighting: str = "chunk",
    grpo_keep: str = "success",
    grpo_std_norm: bool = True,
    init_pool: str = "random",
) -> dict[str, Any]:
    """Deprecated (removed in the next release): the env-config dict that ``build_algorithm(env_config=...)``
    took before :class:`EnvRunnerSettings`, checked as those settings (:func:`settings_from_env_config`)."""
    env_config = dict(locals(), tasks=list(tasks))
    warnings.warn(
        "make_env_config is deprecated: pass build_algorithm(env_runner=EnvRunnerSettings(...))",
        DeprecationWarning,
        stacklevel=2,
    )
    settings_from_env_config(env_config)
    return env_config


def chunk_spaces(state_dim: int, chunk_size: int, action_dim: int) -> tuple[gym.Space, gym.Space]:
    """Observation space (the proprio state; images and text travel as extra columns) and the
    action space of one chunk ``[H, A]`` in ``[-1, 1]``."""
    obs = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
    return obs, gym.spaces.Box(-1.0, 1.0, (chunk_size, action_dim), np.float32)


def runner_envs(num_envs: int, worker_index: int) -> tuple[int, int]:
    """``(first global env index, env count)`` of runner ``worker_index`` (0 = the local runner), each
    runner holding ``num_envs`` envs."""
    return max(worker_index - 1, 0) * num_envs, num_envs


def env_tasks(first: int, count: int, total: int, tasks: list[int]) -> list[int]:
    """The tasks of envs ``first .. first + count - 1`` of ``total`` envs over all runners: env ``g`` runs
    ``tasks[g * T // total]``, so each task has ``total // T`` or one more envs, and each runner's envs run
    a contiguous share of the tasks (a runner then builds simulators for its share only: with 2 runners of
    20 envs over LIBERO's 10 tasks, 5 each instead of all 10)."""
    if total < 1 or not tasks or not 0 <= first <= first + count <= total:
        raise ValueError(f"envs {first}..{first + count - 1} of {total} over tasks {tasks}: out of range")
    return [tasks[g * len(tasks) // total] for g in range(first, first + count)]


def fresh_episodes(ended_since_reset: np.ndarray, envs: list[int], success: list[bool]) -> list[bool]:
    """The successes of the episodes (ended by ``envs``, in order of ending) that are their env's first since
    the last reset; counts them into ``ended_since_reset [N]`` (in place).

    Every ended episode is a biased sample whenever training episodes are cut (a reset for the greedy probe,
    a new phase): an env that succeeds fast ends several episodes in a window where a failing one, which runs
    to the step limit, is more often cut and never counted, so the share of successes among the ended
    episodes reads high. An env's first episode after a reset starts from a fresh draw and ends before the
    next cut when resets are further apart than the step limit: its success is the sampled policy's, unbiased."""
    fresh = []
    for env, ok in zip(envs, success):
        if ended_since_reset[env] == 0:
            fresh.append(bool(ok))
        ended_since_reset[env] += 1
    return fresh


def group_initial_states(
    iteration: int,
    total_groups: int,
    first_group: int,
    num_groups: int,
    tasks: list[int],
    pool: int | None = None,
    protocol: bool = False,
    suite: str = "spatial",
) -> tuple[list[int], list[int]]:
    """``(task ids, init ids)`` of a runner's ``num_groups`` GRPO groups in ``iteration``.

    Group ``i`` (counted over all runners and iterations) runs task ``tasks[i % T]``; its initial
    state is training state ``i`` (a new one for every group) or, with a ``pool`` of N, that task's
    training state ``(i // T) % N``. Training states are the suite's (:func:`sims.suites.training_init_id`:
    ``TRAIN_INIT_OFFSET + k`` for ours), never the evaluation protocol's; with ``protocol`` they are the
    protocol's states ``k`` (``pool`` defaults to all ``NUM_INIT_STATES`` of them). A suite with a
    limited number of training states (real LIBERO) caps ``pool`` at that number.
    """
    import sims
    from sims.protocol import NUM_INIT_STATES

    if protocol:
        pool = min(int(pool or NUM_INIT_STATES), NUM_INIT_STATES)
    else:
        available = sims.suites.num_training_states(suite)
        if available is not None:
            pool = min(int(pool or available), available)
    gids = [iteration * total_groups + first_group + j for j in range(num_groups)]
    states = gids if pool is None else [(i // len(tasks)) % int(pool) for i in gids]
    ids = states if protocol else [sims.suites.training_init_id(suite, k) for k in states]
    return [tasks[i % len(tasks)] for i in gids], ids


class VecEnvRunner(EnvRunner):
    """Samples ``chunks_per_iter`` chunks in each of its envs per :meth:`sample` call, as its
    :class:`EnvRunnerSettings` (``config.env_runner_settings``) say."""

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        settings = getattr(self.config, "env_runner_settings", None)
        if not isinstance(settings, EnvRunnerSettings):
            raise TypeError(
                "VecEnvRunner needs config.env_runner_settings, an EnvRunnerSettings (see "
                f"embodied.rllib.build_algorithm), got {type(settings).__name__}"
            )
        self.settings: EnvRunnerSettings = settings
        self.seed = int(self.config.seed or 0)
        torch.set_num_threads(settings.torch_threads)
        self.env = None
        self.obs: dict[str, torch.Tensor] | None = None
        self.critic_inputs: CriticInputs | None = None
        # episodes each env ended since the last reset (its first is a fresh, unbiased draw: see sample)
        self.ended_since_reset: np.ndarray | None = None
        self.module = None
        # the driver's count of the weights it sent (:meth:`set_weights`); None until the first arrive, as
        # in a runner Ray has just restarted, whose module holds random weights
        self.weights_version: int | None = None
        self.make_module()
        # In a cluster the driver keeps a local runner only for bookkeeping: it gets no envs.
        if not (self.worker_index == 0 and (self.num_workers or 0) > 0):
            self.make_env()

    # -- construction -------------------------------------------------------------------------
    def make_env(self) -> None:
        import sims

        s = self.settings
        if self.env is not None:
            self.env.close()
        first, n = runner_envs(s.num_envs, self.worker_index or 0)
        self.first_env = first
        policy = self.module.policy
        self.env = sims.make(
            s.backend or sims.suites.backend(s.suite),
            suite=s.suite,
            num_envs=n,
            seed=self.seed + 7919 * first,
            cameras=tuple(policy.config.cameras),
            image_size=s.image_size,
            reward_type=s.reward_type,
            num_threads=s.num_threads or None,
            max_steps=s.max_episode_steps,
            state_obs=policy.config.state_obs,
        )
        if s.latency_delays:
            from embodied.latency.delay_env import DelayedChunkEnv

            self.env = DelayedChunkEnv(self.env, policy.chunk_size, s.latency_delays, seed=self.seed + first)
        policy.check_env(self.env)
        if s.init_pool == "protocol" and not s.grouped:  # GRPO sets each group's state
            from sims.protocol import NUM_INIT_STATES

            if not hasattr(self.env, "set_init_pool"):
                raise ValueError(
                    f"init_pool=protocol needs a backend with fixed initial states ({type(self.env).__name__} "
                    "has none): use init_pool=random"
                )
            self.env.set_init_pool(range(NUM_INIT_STATES))
        self.obs = None
        self.critic_inputs = None
        if self.module.critic is not None:
            limits = [int(s.max_episode_steps or t.max_steps) for t in self.env.tasks]
            self.critic_inputs = CriticInputs(self.module.critic, self.env.num_envs, limits)

    def make_module(self) -> None:
        spec = self.config.rl_module_spec
        self.module = spec.module_class(
            observation_space=spec.observation_space,
            action_space=spec.action_space,
            inference_only=False,
            model_config=spec.model_config,
        )
        if self.settings.inference_device == "cuda" and torch.cuda.is_available():
            self.module.to("cuda")  # weights arrive as CPU arrays and are copied in; batches leave on the CPU
        self.module.eval()

    # -- sampling -----------------------------------------------------------------------------
    def _reset(self, iteration: int) -> dict[str, torch.Tensor]:
        s = self.settings
        tasks = list(s.tasks)
        n = self.env.num_envs
        if s.grouped:  # each group of G envs starts from one (training) initial state
            g = s.advantages.group_size
            total_groups = s.num_envs * max(self.config.num_env_runners, 1) // g
            task_ids, init_ids = group_initial_states(
                iteration,
                total_groups,
                self.first_env // g,
                n // g,
                tasks,
                s.init_states,
                s.init_pool == "protocol",
                suite=s.suite,
            )
            return self.env.reset(task_ids=np.repeat(task_ids, g).tolist(), init_ids=np.repeat(init_ids, g).tolist())
        return self.env.reset(
            seed=self.seed + 104729 * iteration + self.first_env,
            task_ids=env_tasks(self.first_env, n, s.num_envs * max(self.config.num_env_runners, 1), tasks),
        )

    def sample(self, iteration: int = 0, **kwargs: Any) -> dict[str, Any]:
        """One rollout of ``chunks_per_iter`` chunks per env as a training batch plus episode stats.

        PPO keeps episodes running across calls (a fresh reset only on the first call); GRPO
        resets every call to new groups. Sampling noise is seeded by (seed, runner, iteration).
        """
        if self.env is None:
            raise RuntimeError("this EnvRunner has no envs (the driver's local runner in a cluster)")
        s = self.settings
        start = time.perf_counter()
        if self.obs is None or s.grouped:
            self.obs = self._reset(iteration)
            self.ended_since_reset = np.zeros(self.env.num_envs, np.int64)
            if self.critic_inputs is not None:
                self.critic_inputs.clock.reset()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 9973 * (self.worker_index or 0) + iteration)
        rollout, self.obs = collect_chunks(
            self.env, self.module.policy, self.obs, s.chunks_per_iter, generator=gen, critic=self.critic_inputs
        )
        batch, info = training_batch(rollout, s.advantages, s.truncation)
        self.num_env_steps_sampled_lifetime += rollout.env_steps
        # GRPO trains on each env's first episode: its statistics are those episodes' (PPO's, every ended one)
        returns, lengths, success = (
            rollout.first_episodes()
            if s.grouped
            else (rollout.episode_returns, rollout.episode_lengths, rollout.episode_success)
        )
        return {
            "batch": batch,
            "env_steps": rollout.env_steps,
            "episode_returns": returns,
            "episode_lengths": lengths,
            "episode_success": success,
            "fresh_success": fresh_episodes(self.ended_since_reset, rollout.episode_envs, rollout.episode_success),
            "sim_s": rollout.timing["sim_s"],
            "inference_s": rollout.timing["inference_s"],
            "sample_s": time.perf_counter() - start,
            "worker_index": self.worker_index or 0,
            **info,
        }

    def sample_checked(self, iteration: int, weights_version: int) -> dict[str, Any]:
        """:meth:`sample` for the driver's remote calls, which never raises.

        Refuses to sample (``{"stale_weights": True}``) unless this runner holds the driver's
        ``weights_version``: a runner that Ray restarted after its process or node was lost holds
        none, and its batch would be sampled by random weights. An error comes back as its
        traceback (``{"error": ...}``): raised, it would end the actor, and RLlib would restart it
        into the same error.
        """
        import ray

        where = {"worker_index": self.worker_index or 0, "node_id": ray.get_runtime_context().get_node_id()}
        if self.weights_version != weights_version:
            return {**where, "stale_weights": True, "weights_version": self.weights_version}
        try:
            return {**self.sample(iteration), **where}
        except Exception:  # noqa: BLE001 - reported to the driver, which stops the run with it
            return {**where, "error": traceback.format_exc()}

    def greedy_episodes(
        self,
        weights_version: int | None,
        *,
        tasks: list[int],
        states: int,
        first_state: int,
        seed: int,
        shard: tuple[int, int],
    ) -> list[dict[str, Any]] | None:
        """The greedy probe (:mod:`embodied.eval.greedy_probe`) in this runner's own envs, with the
        evaluation's harness, seeds and waves: its ``shard`` of the waves of ``states`` states per task
        from ``first_state``; the episodes' records. None where these envs cannot stand in for the
        evaluation's (a training step limit, latency delays, fewer episodes than envs, or not the
        driver's current ``weights_version``): the driver then probes in its own envs. Training
        episodes in progress end here (the next :meth:`sample` resets)."""
        from embodied.eval.greedy_probe import greedy_records

        s = self.settings
        env = self.env
        if (
            env is None
            or s.latency_delays
            or s.max_episode_steps is not None
            or len(tasks) * states < env.num_envs
            or (weights_version is not None and self.weights_version != weights_version)
        ):
            return None
        self.obs = None
        return greedy_records(
            self.module.policy,
            s.suite,
            tasks=list(tasks),
            episodes=states,
            num_envs=env.num_envs,
            image_size=s.image_size,
            seed=seed,
            first_state=first_state,
            shard=shard,
            env=env,
        )

    # -- RLlib plumbing -----------------------------------------------------------------------
    def set_weights(self, weights: dict[str, Any], version: int | None = None) -> None:
        """Module weights (numpy or torch state dict, or an ObjectRef of one) and the driver's count
        of them (see :meth:`sample_checked`)."""
        import ray

        if isinstance(weights, ray.ObjectRef):
            weights = ray.get(weights)
        if DEFAULT_MODULE_ID in weights:
            weights = weights[DEFAULT_MODULE_ID]
        self.module.set_state(weights)
        self.weights_version = version

    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        return {
            COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: self.module.get_state()},
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if COMPONENT_RL_MODULE in state:
            self.set_weights(state[COMPONENT_RL_MODULE])
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = int(state[NUM_ENV_STEPS_SAMPLED_LIFETIME])

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        policy = self.module.policy
        spaces = chunk_spaces(policy.config.state_dim, policy.chunk_size, policy.action_dim)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    def get_metrics(self) -> dict[str, Any]:
        return {}

    def assert_healthy(self) -> None:
        assert self.module is not None, "VecEnvRunner has no module"

    def ping(self) -> str:
        return "ok"

    def stop(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
