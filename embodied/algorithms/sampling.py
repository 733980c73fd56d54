"""What an env runner samples every iteration and how it makes its training batch: the runner's one
typed config, :class:`EnvRunnerSettings`.

``embodied-train`` builds it from its YAML keys of the same names (``suite``, ``num_envs``,
``max_episode_steps``, ... and the ``algo.*`` keys of :class:`~embodied.algorithms.batch.AdvantageConfig`);
:class:`embodied.rllib.env_runner.VecEnvRunner` receives it as it was made, in the driver or inside a
Ray actor. Frozen, and checked when made: a bad value stops the run before Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from embodied.algorithms.batch import TRUNCATION, AdvantageConfig
from embodied.algorithms.registry import GROUP_ALGORITHMS

#: where training episodes start: ``random`` training states (evaluation's are held out) or the protocol's
INIT_POOLS = ("random", "protocol")
#: where a runner samples: ``cuda`` where it sees a GPU, else the CPU
INFERENCE_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class EnvRunnerSettings:
    """One env runner's envs and rollouts. Every runner of a run gets the same settings; the seed is
    the run's (the RLlib config's ``seed``), offset by each runner's first env.

    Attributes:
        suite: task suite (:func:`sims.suites.env_names`).
        num_envs: envs of this runner (in total ``num_envs`` times the number of runners).
        image_size: rendered image size.
        chunks_per_iter: chunks each env samples per iteration.
        advantages: how the rollout becomes advantages (chunk GAE or GRPO's groups).
        tasks: indices into the suite's tasks (None: all of them; made a tuple).
        backend: :func:`sims.make` backend (None: the suite's own).
        reward_type: ``sparse`` (success), ``shaped`` (progress made + success) or ``dense``.
        max_episode_steps: training step limit (truncation); None: each task's own.
        truncation: an episode ended by a step limit: ``bootstrap`` (from its final value) or ``fail``
            (it ends there: see :func:`embodied.algorithms.batch.ppo_batch`).
        init_states: GRPO: draw the groups' initial states from the first N training states of each
            task, in turn (None: a new state for every group).
        init_pool: ``random`` (training states, never the evaluation protocol's) or ``protocol`` (the
            protocol's fixed initial states ``0..NUM_INIT_STATES-1``, which evaluation scores).
        latency_delays: latency-aware RL: each episode's chunk delay d is drawn from these (the envs
            are wrapped in :class:`embodied.latency.delay_env.DelayedChunkEnv`); None: off.
        inference_device: ``cuda``: sample the chunks on the runner's GPU when it sees one.
        torch_threads: torch threads of the runner.
        num_threads: MuJoCo threads of its batched env (None: the backend's default).
    """

    suite: str
    num_envs: int
    image_size: int
    chunks_per_iter: int
    advantages: AdvantageConfig
    tasks: Optional[tuple[int, ...]] = None
    backend: Optional[str] = None
    reward_type: str = "sparse"
    max_episode_steps: Optional[int] = None
    truncation: str = "bootstrap"
    init_states: Optional[int] = None
    init_pool: str = "random"
    latency_delays: Optional[tuple[int, ...]] = None
    inference_device: str = "cpu"
    torch_threads: int = 1
    num_threads: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.advantages, AdvantageConfig):
            raise TypeError(f"advantages must be an AdvantageConfig, got {type(self.advantages).__name__}")
        self._check_envs()
        self._check_episodes()

    def _check_envs(self) -> None:
        import sims

        if self.suite not in sims.suites.env_names():
            raise ValueError(f"unknown suite {self.suite!r}; choose from {sims.suites.env_names()}")
        n_tasks = len(sims.suites.tasks(self.suite))
        tasks = tuple(range(n_tasks)) if self.tasks is None else tuple(int(t) for t in self.tasks)
        object.__setattr__(self, "tasks", tasks)
        if not tasks or any(not 0 <= t < n_tasks for t in tasks):
            raise ValueError(f"tasks {list(tasks)} out of range for suite {self.suite!r} (0..{n_tasks - 1})")
        if self.backend is not None and self.backend not in sims.backends():
            raise ValueError(f"unknown backend {self.backend!r}; choose from {sims.backends()}")
        if self.backend is not None and (self.backend == "maniskill") != (self.suite == "maniskill"):
            raise ValueError(f"backend={self.backend} cannot simulate suite {self.suite!r}")
        for key in ("num_envs", "image_size", "chunks_per_iter", "torch_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.inference_device not in INFERENCE_DEVICES:
            raise ValueError(f"inference_device={self.inference_device!r}: choose {' or '.join(INFERENCE_DEVICES)}")

    def _check_episodes(self) -> None:
        a = self.advantages
        if self.truncation not in TRUNCATION:
            raise ValueError(f"truncation={self.truncation!r}: choose {' or '.join(TRUNCATION)}")
        if self.init_pool not in INIT_POOLS:
            raise ValueError(f"init_pool={self.init_pool!r}: choose {' or '.join(INIT_POOLS)}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps={self.max_episode_steps} must be >= 1 (null: the task's)")
        if self.latency_delays is not None:
            delays = tuple(int(d) for d in self.latency_delays)
            object.__setattr__(self, "latency_delays", delays or None)
            if delays and min(delays) < 0:
                raise ValueError(f"latency_delays {list(delays)} must be >= 0")
        if self.init_states is not None:
            if not a.grouped:
                raise ValueError(
                    f"init_states={self.init_states} sets GRPO's group initial states; algo={a.name} continues "
                    f"episodes across iterations: use one of {list(GROUP_ALGORITHMS)}, or leave it unset"
                )
            if self.init_states < 1:
                raise ValueError(f"init_states must be >= 1 (states per task), got {self.init_states}")
        if a.grouped and self.num_envs % a.group_size:
            raise ValueError(
                f"{a.name} needs num_envs ({self.num_envs}) to be a multiple of its group_size ({a.group_size}): "
                "each group of envs starts from one initial state"
            )

    @property
    def grouped(self) -> bool:
        """GRPO's groups: every iteration resets the envs, group by group (else episodes run on)."""
        return self.advantages.grouped
