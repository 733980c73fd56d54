"""``VecEnvRunner``: an RLlib ``EnvRunner`` that owns one batched :class:`sims.VecEnv`.

RLlib's stock ``SingleAgentEnvRunner`` loops in Python over gymnasium sub-envs and episodes; this
runner instead steps all its envs as one batch of action chunks (:func:`embodied.algorithms.rollout.collect_chunks`)
and returns a ready training batch (chunk GAE, or GRPO groups) as tensors.

``config.env_config`` keys: ``suite``, ``tasks`` (indices), ``num_envs`` (per runner), ``image_size``,
``reward_type``, ``seed``, ``chunks_per_iter``, ``algo`` (``ppo`` | ``grpo``), ``group_size``,
``gamma``, ``lam``, ``truncation`` (``bootstrap`` | ``fail``: see :func:`embodied.algorithms.batch.ppo_batch`),
``max_steps`` (training step limit or None), ``num_threads`` (MuJoCo threads),
``torch_threads``, ``grpo_weighting`` (:data:`embodied.algorithms.grpo.GRPO_WEIGHTING`), ``grpo_keep``
(:data:`embodied.algorithms.grpo.GRPO_KEEP`), ``grpo_std_norm`` (divide by the group's std),
``init_states`` (``grpo``: cycle the groups through the first N training initial states of each
task; None: a new state for every group), ``init_pool`` (``random``: training states, never the
evaluation protocol's; ``protocol``: the protocol's fixed initial states ``0..NUM_INIT_STATES-1``,
which evaluation scores: the LIBERO RL works' protocol), ``backend`` (a :func:`sims.make` backend, e.g.
``mujoco_gpu``; default the suite's), ``latency_delays`` (latency-aware RL: the envs are wrapped in
:class:`embodied.latency.delay_env.DelayedChunkEnv`), ``inference_device`` (``cuda``: the runner
samples on its GPU when it sees one).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from embodied.algorithms.batch import grpo_batch, ppo_batch
from embodied.algorithms.critic import CriticInputs
from embodied.algorithms.rollout import collect_chunks

#: where training episodes start: ``random`` training states (evaluation's are held out) or the protocol's
INIT_POOLS = ("random", "protocol")


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
    """The runner's ``env_config`` (the keys of this module's docstring); ``algo`` is ``ppo`` (chunk
    GAE batches, episodes continue across iterations) or ``grpo`` (groups reset every iteration).
    ``inference_device="cuda"`` samples the chunks on the runner's GPU when it sees one."""
    if algo not in ("ppo", "grpo"):
        raise ValueError(f"env runner algo must be ppo or grpo, got {algo!r}")
    if init_pool not in INIT_POOLS:
        raise ValueError(f"init_pool must be one of {INIT_POOLS}, got {init_pool!r}")
    return dict(
        suite=suite,
        tasks=list(tasks),
        num_envs=num_envs,
        image_size=image_size,
        reward_type=reward_type,
        chunks_per_iter=chunks_per_iter,
        max_steps=max_steps,
        algo=algo,
        group_size=group_size,
        gamma=gamma,
        lam=lam,
        torch_threads=1,
        latency_delays=list(latency_delays) if latency_delays else None,
        backend=backend,
        truncation=truncation,
        inference_device=inference_device,
        init_states=init_states,
        grpo_weighting=grpo_weighting,
        grpo_keep=grpo_keep,
        grpo_std_norm=grpo_std_norm,
        init_pool=init_pool,
    )


def chunk_spaces(state_dim: int, chunk_size: int, action_dim: int) -> tuple[gym.Space, gym.Space]:
    """Observation space (the proprio state; images and text travel as extra columns) and the
    action space of one chunk ``[H, A]`` in ``[-1, 1]``."""
    obs = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
    return obs, gym.spaces.Box(-1.0, 1.0, (chunk_size, action_dim), np.float32)


def runner_envs(env_config: dict[str, Any], worker_index: int) -> tuple[int, int]:
    """``(first global env index, env count)`` of runner ``worker_index`` (0 = the local runner)."""
    n = int(env_config["num_envs"])
    return max(worker_index - 1, 0) * n, n


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
    """Samples ``chunks_per_iter`` chunks in each of its envs per :meth:`sample` call."""

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        ec = self.config.env_config
        torch.set_num_threads(int(ec.get("torch_threads", 1)))
        self.env = None
        self.obs: dict[str, torch.Tensor] | None = None
        self.critic_inputs: CriticInputs | None = None
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

        ec = self.config.env_config
        if self.env is not None:
            self.env.close()
        first, n = runner_envs(ec, self.worker_index or 0)
        self.first_env = first
        self.env = sims.make(
            ec.get("backend") or sims.suites.backend(ec["suite"]),
            suite=ec["suite"],
            num_envs=n,
            seed=int(ec["seed"]) + 7919 * first,
            cameras=tuple(self.module.policy.config.cameras),
            image_size=int(ec["image_size"]),
            reward_type=ec.get("reward_type", "sparse"),
            num_threads=ec.get("num_threads") or None,
            max_steps=ec.get("max_steps"),
            state_obs=self.module.policy.config.state_obs,
        )
        if ec.get("latency_delays"):
            from embodied.latency.delay_env import DelayedChunkEnv

            self.env = DelayedChunkEnv(
                self.env, self.module.policy.chunk_size, ec["latency_delays"], seed=int(ec["seed"]) + first
            )
        self.module.policy.check_env(self.env)
        if ec.get("init_pool", "random") == "protocol" and ec["algo"] != "grpo":  # grpo sets each group's state
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
            limits = [int(ec.get("max_steps") or t.max_steps) for t in self.env.tasks]
            self.critic_inputs = CriticInputs(self.module.critic, self.env.num_envs, limits)

    def make_module(self) -> None:
        spec = self.config.rl_module_spec
        self.module = spec.module_class(
            observation_space=spec.observation_space,
            action_space=spec.action_space,
            inference_only=False,
            model_config=spec.model_config,
        )
        if self.config.env_config.get("inference_device") == "cuda" and torch.cuda.is_available():
            self.module.to("cuda")  # weights arrive as CPU arrays and are copied in; batches leave on the CPU
        self.module.eval()

    # -- sampling -----------------------------------------------------------------------------
    def _reset(self, iteration: int) -> dict[str, torch.Tensor]:
        ec = self.config.env_config
        tasks = list(ec["tasks"])
        n = self.env.num_envs
        if ec["algo"] == "grpo":  # each group of G envs starts from one (training) initial state
            g = int(ec["group_size"])
            total_groups = int(ec["num_envs_total"]) // g
            first_group = self.first_env // g
            task_ids, init_ids = group_initial_states(
                iteration,
                total_groups,
                first_group,
                n // g,
                tasks,
                ec["init_states"],
                ec.get("init_pool") == "protocol",
                suite=ec["suite"],
            )
            return self.env.reset(task_ids=np.repeat(task_ids, g).tolist(), init_ids=np.repeat(init_ids, g).tolist())
        return self.env.reset(
            seed=int(ec["seed"]) + 104729 * iteration + self.first_env,
            task_ids=[tasks[(self.first_env + i) % len(tasks)] for i in range(n)],
        )

    def sample(self, iteration: int = 0, **kwargs: Any) -> dict[str, Any]:
        """One rollout of ``chunks_per_iter`` chunks per env as a training batch plus episode stats.

        PPO keeps episodes running across calls (a fresh reset only on the first call); GRPO
        resets every call to new groups. Sampling noise is seeded by (seed, runner, iteration).
        """
        if self.env is None:
            raise RuntimeError("this EnvRunner has no envs (the driver's local runner in a cluster)")
        ec = self.config.env_config
        start = time.perf_counter()
        if self.obs is None or ec["algo"] == "grpo":
            self.obs = self._reset(iteration)
            if self.critic_inputs is not None:
                self.critic_inputs.clock.reset()
        gen = torch.Generator().manual_seed(int(ec["seed"]) * 1_000_003 + 9973 * (self.worker_index or 0) + iteration)
        rollout, self.obs = collect_chunks(
            self.env, self.module.policy, self.obs, int(ec["chunks_per_iter"]), generator=gen, critic=self.critic_inputs
        )
        info: dict[str, float] = {}
        if ec["algo"] == "grpo":
            batch, info = grpo_batch(
                rollout,
                int(ec["group_size"]),
                str(ec["grpo_weighting"]),
                str(ec["grpo_keep"]),
                bool(ec["grpo_std_norm"]),
            )
        else:
            batch = ppo_batch(
                rollout, float(ec["gamma"]), float(ec["lam"]), normalize=False, truncation=str(ec["truncation"])
            )
        self.num_env_steps_sampled_lifetime += rollout.env_steps
        # GRPO trains on each env's first episode: its statistics are those episodes' (PPO's, every ended one)
        returns, lengths, success = (
            rollout.first_episodes()
            if ec["algo"] == "grpo"
            else (rollout.episode_returns, rollout.episode_lengths, rollout.episode_success)
        )
        return {
            "batch": batch,
            "env_steps": rollout.env_steps,
            "episode_returns": returns,
            "episode_lengths": lengths,
            "episode_success": success,
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
