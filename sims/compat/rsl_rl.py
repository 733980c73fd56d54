"""RSL-RL adapter: a sims :class:`~sims.core.VecEnv` behind ``rsl_rl.env.VecEnv`` (rsl-rl-lib 5.5).

Usage::

    from rsl_rl.runners import OnPolicyRunner
    from sims.compat.rsl_rl import default_ppo_cfg, make_rsl_rl_env

    env = make_rsl_rl_env(task="reach", num_envs=64, cameras=())
    runner = OnPolicyRunner(env, default_ppo_cfg(), log_dir="runs/reach", device="cpu")
    runner.learn(num_learning_iterations=100)

Observations are a ``tensordict.TensorDict`` (batch size ``[N]``) of *groups*; each group is
built from sims observation keys (``obs_groups`` argument):

- vector keys (``state``, ``privileged``, ``task_id``) are flattened to float32 and concatenated:
  ``[N, D]`` (``task_id`` becomes a one-hot ``[N, len(tasks)]``);
- a group made of ``rgb`` alone becomes float32 ``[N, V*3, H, W]`` in ``[0, 1]`` (views stacked
  on channels, the layout rsl_rl's ``CNNModel`` expects).

Default groups: ``policy`` = ``critic`` = concat(state, privileged), i.e. state-only RL.

``step`` returns ``(obs, rewards [N] float32, dones [N] long, extras)`` where ``obs`` is the
first observation of the new episode for envs that were reset (Isaac-Gym convention),
``extras["time_outs"]`` (bool ``[N]``) is the contract's ``truncated`` (step limit or diverged
physics: PPO bootstraps those), and ``extras["log"]`` holds, on steps where some episode ended,
``/success_rate`` and ``/diverged_rate`` (float ``[k]`` over the k ended episodes; rsl_rl's logger
averages them over an iteration).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from rsl_rl.env import VecEnv as RslVecEnv
from tensordict import TensorDict

import sims
from sims.core import Obs, VecEnv

#: default observation groups: group name -> sims observation keys concatenated into it.
DEFAULT_OBS_GROUPS: dict[str, tuple[str, ...]] = {
    "policy": ("state", "privileged"),
    "critic": ("state", "privileged"),
}


class RslRlVecEnv(RslVecEnv):
    """``rsl_rl.env.VecEnv`` over a batched sims ``VecEnv``.

    Attributes:
        env: the wrapped sims env.
        num_envs: N.
        num_actions: A.
        device: the sims env's device (observations, rewards and dones live there).
        max_episode_length: the tasks' step limit (int; a ``[N]`` long tensor when the envs'
            tasks have different limits).
        episode_length_buf: long ``[N]``, steps taken in each env's current episode (the sims
            env's ``info["elapsed"]``). Assigning it (rsl_rl does, with
            ``learn(init_at_random_ep_len=True)``) moves the envs' step counters, so episodes
            end earlier, as in Isaac Lab.
        cfg: plain dict describing the env (logged by rsl_rl's writers).
    """

    def __init__(
        self,
        env: VecEnv,
        *,
        obs_groups: Mapping[str, Sequence[str]] | None = None,
        clip_actions: bool = True,
        cfg: dict[str, Any] | None = None,
    ):
        """Wrap ``env`` and reset it (rsl_rl reads ``get_observations()`` before any step).

        Args:
            env: a sims ``VecEnv``.
            obs_groups: group name -> observation keys (default :data:`DEFAULT_OBS_GROUPS`).
            clip_actions: clip actions to ``[-1, 1]`` before stepping (rsl_rl's Gaussian policy
                is unbounded). Non-finite actions always raise ``ValueError``.
            cfg: env description stored as ``self.cfg`` (default: task names and sizes).
        """
        if not isinstance(env, VecEnv):
            raise TypeError(f"env must be a sims VecEnv, got {type(env).__name__}")
        if len(env.action_spec.shape) != 1:
            raise ValueError(f"expected a flat [A] action spec, got {env.action_spec.shape}")
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = int(env.action_spec.shape[0])
        self.device = env.device
        self.clip_actions = clip_actions
        self.obs_groups = self._check_groups(DEFAULT_OBS_GROUPS if obs_groups is None else obs_groups)
        self.cfg = (
            cfg
            if cfg is not None
            else {
                "tasks": [t.name for t in env.tasks],
                "num_envs": env.num_envs,
                "control_hz": env.control_hz,
                "obs_groups": {k: list(v) for k, v in self.obs_groups.items()},
            }
        )
        self._limits = torch.tensor([t.max_steps for t in env.tasks], dtype=torch.long, device=self.device)
        self._episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self._obs = self._group(env.reset())
        self._update_max_length(self._last_task_ids)

    # ------------------------------------------------------------------ observation groups
    def _check_groups(self, groups: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
        if not groups:
            raise ValueError("obs_groups must name at least one group")
        spec = self.env.observation_spec
        out: dict[str, tuple[str, ...]] = {}
        for name, keys in groups.items():
            keys = (keys,) if isinstance(keys, str) else tuple(keys)
            if not keys:
                raise ValueError(f"observation group {name!r} is empty")
            missing = [k for k in keys if k not in spec]
            if missing:
                raise ValueError(
                    f"observation group {name!r} uses {missing}, which the env does not observe; "
                    f"available: {sorted(spec)} (rgb needs cameras=...)"
                )
            if "rgb" in keys and keys != ("rgb",):
                raise ValueError(
                    f"observation group {name!r}: 'rgb' must be a group of its own (an image "
                    f"[N, C, H, W] for a CNN), got {list(keys)}"
                )
            out[name] = keys
        return out

    def _group(self, obs: Obs) -> TensorDict:
        """sims ``Obs`` -> TensorDict of groups, batch size ``[N]``."""
        self._last_task_ids = obs["task_id"]
        groups: dict[str, torch.Tensor] = {}
        for name, keys in self.obs_groups.items():
            if keys == ("rgb",):
                rgb = obs["rgb"]  # [N, V, H, W, 3] uint8
                n, v, h, w, c = rgb.shape
                groups[name] = rgb.permute(0, 1, 4, 2, 3).reshape(n, v * c, h, w).float() / 255.0
                continue
            parts = []
            for k in keys:
                x = obs[k]
                if k == "task_id":
                    x = torch.nn.functional.one_hot(x.long(), len(self.env.tasks))
                parts.append(x.reshape(self.num_envs, -1).float())
            groups[name] = torch.cat(parts, dim=1)
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    # ------------------------------------------------------------------ episode lengths
    def _update_max_length(self, task_ids: torch.Tensor) -> None:
        if bool((self._limits == self._limits[0]).all()):
            self.max_episode_length: int | torch.Tensor = int(self._limits[0])
        else:
            self.max_episode_length = self._limits[task_ids.long()]

    @property
    def episode_length_buf(self) -> torch.Tensor:
        """long ``[N]``: steps taken in each env's current episode."""
        return self._episode_length_buf

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        value = torch.as_tensor(value, device=self.device).long()
        if value.shape != (self.num_envs,):
            raise ValueError(f"episode_length_buf must have shape [{self.num_envs}], got {tuple(value.shape)}")
        limit = torch.as_tensor(self.max_episode_length, device=self.device)
        if (value < 0).any() or (value >= limit).any():
            raise ValueError("episode_length_buf values must be in [0, max_episode_length)")
        self._set_env_elapsed(value)
        self._episode_length_buf = value.clone()

    def _set_env_elapsed(self, value: torch.Tensor) -> None:
        """Move the sims env's per-env step counters to ``value`` ``[N]``."""
        setter = getattr(self.env, "set_elapsed", None)
        if callable(setter):
            setter(value)
            return
        raise NotImplementedError(
            f"{type(self.env).__name__} cannot move its episode step counters; use learn(init_at_random_ep_len=False)"
        )

    # ------------------------------------------------------------------ rsl_rl interface
    def get_observations(self) -> TensorDict:
        """Current observation groups (batch size ``[N]``)."""
        return self._obs

    def reset(
        self, *, seed: int | None = None, task_ids: Any = None, init_ids: Any = None
    ) -> tuple[TensorDict, dict[str, Any]]:
        """Reset every env (arguments as :meth:`sims.core.VecEnv.reset`); returns (obs, extras)."""
        self._obs = self._group(self.env.reset(seed=seed, task_ids=task_ids, init_ids=init_ids))
        self._episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self._update_max_length(self._last_task_ids)
        return self._obs, {}

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """Apply ``actions`` ``[N, A]``.

        Returns:
            obs (TensorDict ``[N]``), rewards float32 ``[N]``, dones long ``[N]`` (terminated or
            truncated), extras with ``time_outs`` bool ``[N]`` and ``log`` (module docstring).
        """
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(actions)
        if tuple(actions.shape) != (self.num_envs, self.num_actions):
            raise ValueError(
                f"actions must have shape [{self.num_envs}, {self.num_actions}], got {tuple(actions.shape)}"
            )
        actions = actions.to(self.device, torch.float32)
        if self.clip_actions:
            actions = actions.clamp(-1.0, 1.0)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = terminated | truncated
        self._obs = self._group(obs)
        elapsed = info.get("elapsed")
        if elapsed is None:  # a backend without info["elapsed"]: count here
            elapsed = (self._episode_length_buf + 1) * (~done).to(self.device)
        self._episode_length_buf = elapsed.to(self.device, torch.long).clone()
        self._update_max_length(self._last_task_ids)
        log: dict[str, torch.Tensor] = {}
        if bool(done.any()):
            log["/success_rate"] = info["success"][done].float()
            log["/diverged_rate"] = info["diverged"][done].float()
        extras = {"time_outs": truncated.to(self.device), "log": log}
        return self._obs, reward.to(self.device, torch.float32), done.to(self.device, torch.long), extras

    def close(self) -> None:
        """Close the wrapped sims env."""
        self.env.close()


def make_rsl_rl_env(
    backend: str = "mujoco",
    *,
    obs_groups: Mapping[str, Sequence[str]] | None = None,
    clip_actions: bool = True,
    **make_kwargs: Any,
) -> RslRlVecEnv:
    """``sims.make(backend, **make_kwargs)`` wrapped in :class:`RslRlVecEnv`.

    ``cameras`` defaults to ``()`` here unless an observation group uses ``rgb``.
    """
    uses_rgb = any(
        (keys == "rgb") if isinstance(keys, str) else ("rgb" in keys) for keys in (obs_groups or {}).values()
    )
    if not uses_rgb:
        make_kwargs.setdefault("cameras", ())
    env = sims.make(backend, **make_kwargs)
    cfg = {"backend": backend, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in make_kwargs.items()}}
    return RslRlVecEnv(env, obs_groups=obs_groups, clip_actions=clip_actions, cfg=cfg)


def default_ppo_cfg(
    *,
    num_steps_per_env: int = 24,
    save_interval: int = 50,
    hidden_dims: Sequence[int] = (256, 256, 128),
    actor_groups: Sequence[str] = ("policy",),
    critic_groups: Sequence[str] = ("critic",),
    init_std: float = 1.0,
    **algorithm: Any,
) -> dict[str, Any]:
    """A train config for rsl-rl-lib 5.5's ``OnPolicyRunner`` with PPO and MLP actor/critic.

    The 5.5 schema: top-level ``num_steps_per_env``, ``save_interval``, ``obs_groups`` (observation
    *set* -> env groups; the sets PPO uses are ``actor`` and ``critic``), ``algorithm`` (``PPO``
    keyword arguments plus ``class_name``), ``actor`` / ``critic`` (model ``class_name`` plus its
    keyword arguments; the actor's ``distribution_cfg`` makes it stochastic), ``logger``.

    Args:
        num_steps_per_env: rollout length per env and iteration.
        save_interval: iterations between checkpoints (with a ``log_dir``).
        hidden_dims: MLP hidden sizes of actor and critic.
        actor_groups / critic_groups: env observation groups fed to each model.
        init_std: initial action standard deviation.
        **algorithm: overrides of the PPO arguments (``learning_rate``, ``num_mini_batches``, ...).
    """
    algo = {
        "class_name": "PPO",
        "num_learning_epochs": 5,
        "num_mini_batches": 4,
        "clip_param": 0.2,
        "gamma": 0.99,
        "lam": 0.95,
        "value_loss_coef": 1.0,
        "entropy_coef": 0.005,
        "learning_rate": 1.0e-3,
        "max_grad_norm": 1.0,
        "use_clipped_value_loss": True,
        "schedule": "adaptive",
        "desired_kl": 0.01,
    }
    unknown = (
        set(algorithm)
        - set(algo)
        - {
            "optimizer",
            "normalize_advantage_per_mini_batch",
            "use_mixed_precision",
            "rnd_cfg",
            "symmetry_cfg",
            "share_cnn_encoders",
            "grad_reduce_bucket_mb",
        }
    )
    if unknown:
        raise ValueError(f"unknown PPO argument(s) {sorted(unknown)}")
    algo.update(algorithm)
    model = {"class_name": "MLPModel", "hidden_dims": list(hidden_dims), "activation": "elu", "obs_normalization": True}
    return {
        "num_steps_per_env": num_steps_per_env,
        "save_interval": save_interval,
        "obs_groups": {"actor": list(actor_groups), "critic": list(critic_groups)},
        "algorithm": algo,
        "actor": {
            **model,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": init_std, "std_type": "scalar"},
        },
        "critic": dict(model),
        "logger": "tensorboard",
        "check_for_nan": True,
    }
