"""``ChunkRL``: an RLlib ``Algorithm`` for chunk-level PPO / GRPO of VLAs.

Its ``training_step`` samples training batches from :class:`~embodied.rllib.env_runner.VecEnvRunner`
(local, or remote Ray actors), updates the :class:`~embodied.rllib.learner.ChunkPPOLearner` (in the
driver or on remote learner actors / GPUs) and syncs the weights back.

Its parts receive their typed configs as they were made, through :class:`ChunkRLConfig`: the env runners
an :class:`~embodied.algorithms.sampling.EnvRunnerSettings`, the schedule and the learners an
:class:`~embodied.algorithms.update.UpdateConfig`, the learners a :class:`~embodied.algorithms.loss.LossConfig`.

The update of an iteration is :func:`embodied.algorithms.update.run_epochs`: ``update.epochs`` passes
over the batch, each a fresh permutation cut into evenly sized minibatches, one ``learner_group.update``
(one gradient step, data parallel over the learners) per minibatch, stopped early when a minibatch's
approx KL exceeds ``update.target_kl`` (with ``update.kl_rollback`` the stop also takes the actor back
to its weights before the step that crossed the target, on every learner alike).

By default (``overlap=False``) every batch is trained on by the weights that sampled it: the
metric ``policy_lag`` (actor updates between sampling a batch and training on it) is 0. With
``overlap=True`` sampling of iteration ``k+1`` runs while the learner updates on iteration ``k`` (in
a thread for the local runner, on the remote actors otherwise): each batch is then collected by
the weights one update old (``policy_lag`` 1), which the PPO ratio against the stored behaviour
log-probabilities importance-corrects (as in asynchronous PPO / RLinf's pipelined mode).

Remote env runners are restarted by Ray when their process or node is lost (RLlib's
``restart_failed_env_runners``); an iteration waits for a lost runner to come back, gives it the
weights the other runners sampled with and has it sample its share again
(:mod:`embodied.rllib.recovery`). ``recoveries`` lists the runners brought back so far.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from embodied.algorithms.batch import ROW, batch_size, concat_batches
from embodied.algorithms.gae import normalize_advantages
from embodied.algorithms.loss import LossConfig
from embodied.algorithms.sampling import EnvRunnerSettings
from embodied.algorithms.update import UpdateConfig, explained_variance, run_epochs
from embodied.rllib.env_runner import VecEnvRunner
from embodied.rllib.learner import ChunkPPOLearner
from embodied.rllib.module import PolicyRLModule
from embodied.rllib.recovery import (
    Recovery,
    RemoteSample,
    Weights,
    dead_nodes,
    runner_place,
    send_weights,
)


class ChunkRLConfig(AlgorithmConfig):
    """RLlib config of :class:`ChunkRL`, carrying its parts' typed configs as they were made (set with
    :meth:`chunk_rl`): ``env_runner_settings`` (:class:`~embodied.algorithms.sampling.EnvRunnerSettings`,
    every env runner's), ``update`` (:class:`~embodied.algorithms.update.UpdateConfig`: the schedule of
    :meth:`ChunkRL.training_step` and the learners' optimizers), ``loss``
    (:class:`~embodied.algorithms.loss.LossConfig`, the learners'), and the driver's ``overlap`` and
    ``runner_restart_timeout_s``. RLlib's own ``lr`` and ``grad_clip`` are copies of ``update.lr`` and
    ``update.max_grad_norm`` made there: RLlib's Learner clips the gradients by ``grad_clip``."""

    def __init__(self, algo_class: type | None = None):
        super().__init__(algo_class=algo_class or ChunkRL)
        self.env_runner_settings: EnvRunnerSettings | None = None
        self.update = UpdateConfig()
        self.loss = LossConfig()
        # sample iteration k+1 while learning on k (policy lag 1); False: on-policy
        self.overlap = False
        # how long an iteration waits for Ray to restart a lost env runner before the run stops
        self.runner_restart_timeout_s = 600.0
        self.grad_clip_by = "global_norm"
        self.env_runner_cls = VecEnvRunner
        self.chunk_rl()

    def chunk_rl(
        self,
        *,
        env_runner_settings: EnvRunnerSettings | None = None,
        update: UpdateConfig | None = None,
        loss: LossConfig | None = None,
        overlap: bool | None = None,
        runner_restart_timeout_s: float | None = None,
    ) -> "ChunkRLConfig":
        """Set the parts' typed configs (those given; RLlib's builder style), each checked for its type."""
        for name, value, kind in (
            ("env_runner_settings", env_runner_settings, EnvRunnerSettings),
            ("update", update, UpdateConfig),
            ("loss", loss, LossConfig),
        ):
            if value is None:
                continue
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be an {kind.__module__}.{kind.__name__}, got {type(value).__name__}")
            setattr(self, name, value)
        if overlap is not None:
            self.overlap = bool(overlap)
        if runner_restart_timeout_s is not None:
            if not runner_restart_timeout_s > 0:
                raise ValueError(f"runner_restart_timeout_s must be > 0, got {runner_restart_timeout_s}")
            self.runner_restart_timeout_s = float(runner_restart_timeout_s)
        self.lr, self.grad_clip = self.update.lr, self.update.max_grad_norm
        return self

    def get_default_learner_class(self) -> type:
        return ChunkPPOLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=PolicyRLModule)


def where_this_runs(*_: Any) -> dict[str, Any]:
    """The Ray node (id and IP address) and process of the caller."""
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


#: statistics of :func:`embodied.algorithms.update.run_epochs` in an iteration's row (0 when nothing was trained)
UPDATE_METRICS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "minibatches",
    "approx_kl_first",
    "clip_fraction_first",
    "approx_kl_max",
    "log_ratio_max",
    "epochs_run",
    "kl_stop",
    "kl_rollback",
)


def update_metrics(stats: dict[str, float]) -> dict[str, float]:
    """An iteration's update statistics (:data:`UPDATE_METRICS`) and ``grad_cos_first``: the cosine between
    the first two minibatches' actor gradients, how much of a step is signal (NaN when not measured)."""
    out = {key: float(stats.get(key, 0.0)) for key in UPDATE_METRICS}
    out["grad_cos_first"] = float(stats.get("grad_cos_first", float("nan")))
    return out


def group_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
    """GRPO's group counts over the runners (none for chunk GAE)."""
    if "groups" not in results[0]:
        return {}
    return {
        "groups": float(sum(r["groups"] for r in results)),
        "groups_kept": float(sum(r["groups_kept"] for r in results)),
    }


class ChunkRL(Algorithm):
    """Call :meth:`run_iteration` (or ``training_step`` after setting ``iteration``)."""

    @classmethod
    def get_default_config(cls) -> ChunkRLConfig:
        return ChunkRLConfig()

    def setup(self, config: Any) -> None:
        super().setup(config)
        self.iteration_index = 0
        self.stop_iteration: int | None = None
        self._pending: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._weights_dirty = False
        self._actor_version = 0  # actor updates so far
        self._pending_version = 0  # the actor version that sampled the pending batch
        self._runner_weights: Weights | None = None  # what the remote runners were sent last
        self._runner_nodes: dict[int, str] = {}  # remote runner's worker index -> its Ray node id
        self.recoveries: list[Recovery] = []
        self._iteration_recoveries: list[Recovery] = []
        if self.remote_runners:
            self._runner_nodes = {p["worker_index"]: p["node_id"] for p in self._runner_places()}

    # -- sampling -----------------------------------------------------------------------------
    @property
    def remote_runners(self) -> bool:
        return self.env_runner_group.num_remote_env_runners() > 0

    def _launch(self, iteration: int) -> Any:
        if self.remote_runners:
            if self._runner_weights is None:
                self._weights_dirty = True
                self._sync_weights()
            return RemoteSample(
                self.env_runner_group,
                iteration,
                self._runner_weights,
                self._runner_nodes,
                float(self.config.runner_restart_timeout_s),
            ).start()
        runner = self.env_runner_group.local_env_runner
        if self.config.overlap:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
            return self._pool.submit(runner.sample, iteration)
        return [runner.sample(iteration)]

    def _wait(self, handle: Any) -> list[dict[str, Any]]:
        if isinstance(handle, Future):
            return [handle.result()]
        if isinstance(handle, list):
            return handle
        results = handle.collect()
        self._iteration_recoveries = handle.recoveries
        self.recoveries.extend(handle.recoveries)
        return results

    def _sync_weights(self) -> None:
        if not self._weights_dirty:
            return
        weights = self.learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])
        if self.remote_runners:
            version = 1 + (self._runner_weights.version if self._runner_weights else 0)
            # kept (not only sent): a runner Ray restarts before the next sync gets these same weights
            self._runner_weights = Weights(ray.put(weights), version)
            send_weights(self.env_runner_group, self._runner_weights)
        else:
            self.env_runner_group.local_env_runner.set_weights(weights)
        self._weights_dirty = False

    def mark_weights_changed(self) -> None:
        """After loading weights into the learner from outside (init, resume)."""
        self._weights_dirty = True

    def placement(self) -> dict[str, Any]:
        """Where the parts run: the driver, each env runner and each learner (Ray node id, IP, pid)."""
        if self.remote_runners:
            runners = self._runner_places()
        else:
            runners = [where_this_runs()]
        return {"driver": where_this_runs(), "env_runners": runners, "learners": self._on_learners(where_this_runs)}

    def _runner_places(self) -> list[dict[str, Any]]:
        places = self.env_runner_group.foreach_env_runner(runner_place, local_env_runner=False)
        return sorted(places, key=lambda p: p["worker_index"])

    def _on_learners(self, func: Any) -> list[Any]:
        """``func(learner)`` on every learner (local or remote); errors re-raised here."""
        return self.learner_group._get_results(self.learner_group.foreach_learner(func))

    # -- one iteration ------------------------------------------------------------------------
    def training_step(self) -> dict[str, float]:
        """One iteration: collect the runners' batches, normalise their advantages together (with a
        critic), update the learners (:meth:`_update`) and report the iteration's row."""
        it = self.iteration_index
        t0 = time.perf_counter()
        results, sampled_by, wait_s = self._collect(it)
        batch = concat_batches([r["batch"] for r in results])
        rows = batch_size(batch)
        raw_adv_std = float(batch["advantages"].std()) if rows > 1 else 0.0
        if self.config.loss.use_critic and rows:
            batch["advantages"] = normalize_advantages(batch["advantages"])
        t1 = time.perf_counter()
        frozen = it < self.config.update.critic_warmup
        trained_by = self._actor_version  # the actor version that takes this batch's first step
        stats = self._update(batch, it, frozen, sum(r["env_steps"] for r in results)) if rows else {}
        learn_s = time.perf_counter() - t1
        if not self.config.overlap:
            self._sync_weights()
        out = self._episode_metrics(results)
        out.update(
            rows=float(rows),
            actor_updated=float(bool(rows) and not frozen),
            # actor updates between the weights that sampled this batch and those that trained on it
            policy_lag=float(trained_by - sampled_by),
            advantage_std=raw_adv_std,  # before normalisation: ~0 means the normalised advantages are noise
            explained_variance=explained_variance(batch["old_values"], batch["value_targets"])
            if self.config.loss.use_critic and rows
            else 0.0,
            sim_s=float(sum(r["sim_s"] for r in results)),
            inference_s=float(sum(r["inference_s"] for r in results)),
            sample_s=float(max(r["sample_s"] for r in results)),
            learn_s=learn_s,
            wait_s=wait_s,
            iteration_s=time.perf_counter() - t0,
            # env runners lost while sampling this batch and brought back, and the seconds they were away
            runner_restarts=float(len(self._iteration_recoveries)),
            recovery_s=float(sum(r.wait_s for r in self._iteration_recoveries)),
        )
        return out | update_metrics(stats) | group_metrics(results)

    def _collect(self, it: int) -> tuple[list[dict[str, Any]], int, float]:
        """The runners' results for iteration ``it`` (sampled now, or while the previous iteration learned),
        the actor version that sampled them and the seconds waited for them; with ``overlap``, the next
        iteration's sampling starts here, with the weights synced after this one's."""
        t0 = time.perf_counter()
        self._iteration_recoveries = []
        if self._pending is None:
            self._sync_weights()
            self._pending, self._pending_version = self._launch(it), self._actor_version
        results = self._wait(self._pending)
        sampled_by = self._pending_version
        self._pending = None
        wait_s = time.perf_counter() - t0
        self._sync_weights()
        if self.config.overlap and (self.stop_iteration is None or it + 1 < self.stop_iteration):
            self._pending, self._pending_version = self._launch(it + 1), self._actor_version
        return results, sampled_by, wait_s

    def _update(self, batch: dict[str, torch.Tensor], it: int, frozen: bool, env_steps: int) -> dict[str, float]:
        """The learners' update on ``batch`` (:func:`embodied.algorithms.update.run_epochs` with
        ``config.update``), seeded by the run seed and ``it``; ``frozen``: the critic warm-up (the actor
        keeps its weights). Returns the schedule's statistics."""
        u = self.config.update
        seed = int(self.config.seed or 0) * 1_000_003 + it
        critic_obs = batch.get("critic_obs")  # the separate critic's inputs, for its running statistics
        rollback = bool(u.kl_rollback and u.target_kl is not None and not frozen)

        def prepare(learner: Any) -> None:
            learner.seed_update(seed)
            learner.set_actor_frozen(frozen)
            learner.keep_undo(rollback)
            learner.keep_prefix_tokens(True)
            if critic_obs is not None:
                learner.update_critic_norm(DEFAULT_MODULE_ID, critic_obs)

        self._on_learners(prepare)
        steps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps}

        def step(rows_idx: torch.Tensor) -> dict[str, float]:
            mb = {k: v[rows_idx] for k, v in batch.items()}
            mb[ROW] = rows_idx  # the learner keeps each row's frozen prefix tokens by it
            self.learner_group.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(mb)}, env_steps=len(rows_idx)),
                timesteps=steps,
                num_epochs=1,
                minibatch_size=None,
                shuffle_batch_per_epoch=False,
            )
            return self._on_learners(lambda learner: learner.pop_stats())[0]

        def undo() -> None:
            self._on_learners(lambda learner: learner.undo_actor_steps())

        stats = run_epochs(
            step,
            batch_size(batch),
            epochs=u.epochs,
            minibatch_size=u.minibatch_size,
            target_kl=u.target_kl,
            generator=torch.Generator().manual_seed(seed),
            undo=undo if rollback else None,
        )
        self._on_learners(lambda learner: learner.keep_prefix_tokens(False))  # the batch's tokens go
        self._weights_dirty = True
        if not frozen and u.lr > 0:
            self._actor_version += 1
        return stats

    @staticmethod
    def _episode_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
        """Env steps and the episodes that ended in the runners' rollouts (GRPO: each env's first)."""
        returns = [x for r in results for x in r["episode_returns"]]
        success = [x for r in results for x in r["episode_success"]]
        lengths = [x for r in results for x in r["episode_lengths"]]
        fresh = [x for r in results for x in r.get("fresh_success", [])]
        return {
            "env_steps": float(sum(r["env_steps"] for r in results)),
            "episodes": float(len(success)),
            "success_rate": float(np.mean(success)) if success else float("nan"),
            # each env's first episode since a reset (VecEnvRunner: fresh_episodes), unbiased by the cuts
            "fresh_episodes": float(len(fresh)),
            "fresh_success_rate": float(np.mean(fresh)) if fresh else float("nan"),
            "return": float(np.mean(returns)) if returns else float("nan"),
            "episode_length": float(np.mean(lengths)) if lengths else float("nan"),
        }

    def run_iteration(self, iteration: int) -> dict[str, float]:
        self.iteration_index = iteration
        return self.training_step()

    # -- the greedy probe ---------------------------------------------------------------------
    def greedy_episodes(self, *, tasks: list[int], states: int, first_state: int, seed: int) -> list[dict] | None:
        """The greedy probe with the current weights in the env runners' own envs
        (:meth:`VecEnvRunner.greedy_episodes`), the waves shared among the runners: no second copy of
        the envs (a LIBERO suite's scenes take GBs). None where they cannot run it (a sample in flight
        with ``overlap``, a runner lost or restarted meanwhile, envs unlike the evaluation's): the
        caller then probes in envs of its own."""
        if self.config.overlap:
            return None
        self._sync_weights()
        probe = {"tasks": list(tasks), "states": int(states), "first_state": int(first_state), "seed": int(seed)}
        if not self.remote_runners:
            return self.env_runner_group.local_env_runner.greedy_episodes(None, shard=(0, 1), **probe)
        if self._runner_weights is None:
            return None
        version, count = self._runner_weights.version, self.env_runner_group.num_remote_env_runners()

        def run(runner: Any) -> list[dict] | None:
            return runner.greedy_episodes(version, shard=((runner.worker_index or 1) - 1, count), **probe)

        try:
            shares = self.env_runner_group.foreach_env_runner(run, local_env_runner=False)
        except Exception:  # noqa: BLE001 - a runner lost here is brought back by the next sample
            return None
        if len(shares) != count or any(share is None for share in shares):
            return None
        return [record for share in shares for record in share]

    # -- weights and optimizer state (checkpoints) -------------------------------------------
    def policy_state(self) -> dict[str, torch.Tensor]:
        return self._on_learners(lambda learner: learner.policy_state(DEFAULT_MODULE_ID))[0]

    def load_policy_state(self, state: dict[str, torch.Tensor]) -> None:
        self._on_learners(lambda learner: learner.load_policy_state(DEFAULT_MODULE_ID, state))
        self._weights_dirty = True

    def critic_state(self) -> dict[str, torch.Tensor]:
        """The separate critic's weights and input statistics (empty without one)."""
        return self._on_learners(lambda learner: learner.critic_state(DEFAULT_MODULE_ID))[0]

    def load_critic_state(self, state: dict[str, torch.Tensor]) -> None:
        self._on_learners(lambda learner: learner.load_critic_state(DEFAULT_MODULE_ID, state))
        self._weights_dirty = True

    def optimizer_states(self) -> dict[str, dict[str, Any]]:
        return self._on_learners(lambda learner: learner.optimizer_states())[0]

    def load_optimizer_states(self, states: dict[str, dict[str, Any]]) -> None:
        self._on_learners(lambda learner: learner.load_optimizer_states(states))

    def cleanup(self) -> None:
        if isinstance(self._pending, Future):  # the sampler thread ends before its runner does
            try:
                self._wait(self._pending)
            except Exception:  # noqa: BLE001 - shutting down: a failed last sample changes nothing
                pass
        self._pending = None  # remote requests end with their runners
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._end_lost_runners()
        super().cleanup()

    def _end_lost_runners(self) -> None:
        """Kill the runners still marked lost, for good: RLlib's stop() waits on every runner, and one
        that Ray cannot restart (no free CPU left) would hold the run's end forever."""
        group = getattr(self, "env_runner_group", None)
        if group is None or not self.remote_runners:
            return
        healthy = set(group.healthy_env_runner_ids())
        gone = dead_nodes()  # a runner there may wait for a restart that cannot happen, unseen by RLlib
        for worker, actor in group._worker_manager.actors().items():  # RLlib has no public handle
            if worker not in healthy or self._runner_nodes.get(worker) in gone:
                ray.kill(actor, no_restart=True)
