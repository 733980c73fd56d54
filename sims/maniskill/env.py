"""ManiSkill3 tasks behind our :class:`~sims.core.VecEnv` contract (backend ``"maniskill"``).

Tasks that need no asset download, with language instructions (``TASKS``), one suite of them
(``suite="maniskill"``). Mapping onto our contract:

- actions: ManiSkill's ``pd_ee_delta_pose`` controller, 7-D in ``[-1, 1]`` (ManiSkill scales
  position deltas to 0.1 m and rotation deltas to 0.1 rad per step; ours to 0.05 m and 0.5 rad);
  the gripper sign is flipped to ours (-1 open, +1 closed);
- ``state`` ``[N, 15]``: tool pose (position 3, quaternion wxyz 4 in the hemisphere of the home
  orientation, as on the MuJoCo backend), finger opening, 7 arm joints,
  as in our scenes; ``privileged`` ``[N, 16]``: the task's extra observations (goal position,
  grasp flag, ...) flattened and zero-padded;
- cameras: ``agentview`` = ManiSkill's ``base_camera``, ``wrist`` = ``hand_camera`` (only on tasks
  that have one: StackCube-v1, PegInsertionSide-v1);
- reward: sparse success (``reward_type="sparse"``) or ManiSkill's normalised dense reward;
  success terminates; ``max_steps`` per task truncates;
- fixed initial states: ``reset(init_ids=...)`` seeds ManiSkill's reset with a hash of
  (task, init id), so an initial state is the same on every machine.

Simulation backend: ``physx_cuda`` (all envs of a task in one GPU-batched scene) when CUDA is
available, the env runs one task and ``sim_backend="auto"``; otherwise ``physx_cpu``, where ManiSkill
allows one env per scene, so this adapter holds N scenes in the process and steps them one after the
other (the suite's several tasks, and ManiSkill's motion planners, :mod:`sims.maniskill.experts`).
Rendering on a machine without a GPU needs a Vulkan driver with ``VK_KHR_external_semaphore_fd``
(Debian 12: ``mesa-vulkan-drivers`` from bookworm-backports; scripts/setup.sh installs it).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from sims.core import Spec, TaskSpec, VecEnv, quat_hemisphere

PRIVILEGED_DIM = 16
#: The tool orientation at ManiSkill's Panda home pose (gripper down), w x y z: quaternions are given
#: with the sign that keeps them in its hemisphere (continuous, unlike ``w >= 0`` with the gripper down).
TCP_HOME_QUAT = torch.tensor([0.0, 1.0, 0.0, 0.0])
CAMERA_MAP = {"agentview": "base_camera", "wrist": "hand_camera"}


@dataclass(frozen=True)
class ManiSkillTask:
    env_id: str
    name: str
    instruction: str
    max_steps: int
    cameras: tuple[str, ...] = ("agentview",)


TASKS = [
    ManiSkillTask("PickCube-v1", "pick_cube", "pick up the red cube and move it to the green goal", 100),
    ManiSkillTask("PushCube-v1", "push_cube", "push the cube onto the red and white target", 80),
    ManiSkillTask(
        "StackCube-v1", "stack_cube", "stack the red cube on top of the green cube", 150, ("agentview", "wrist")
    ),
    ManiSkillTask("PullCube-v1", "pull_cube", "pull the cube back onto the red and white target", 80),
    ManiSkillTask(
        "PegInsertionSide-v1",
        "peg_insertion_side",
        "insert the peg into the hole in the box",
        150,
        ("agentview", "wrist"),
    ),
    ManiSkillTask("PokeCube-v1", "poke_cube", "use the peg to push the cube to the goal", 100),
]
SUITE = "maniskill"


def task_specs() -> list[TaskSpec]:
    return [
        TaskSpec(
            name=t.name,
            suite=SUITE,
            instruction=t.instruction,
            max_steps=t.max_steps,
            extras={"env_id": t.env_id, "cameras": t.cameras},
        )
        for t in TASKS
    ]


def _find(task: str) -> int:
    for i, t in enumerate(TASKS):
        if task in (t.name, t.env_id):
            return i
    raise ValueError(f"unknown ManiSkill task {task!r}; available: {[t.name for t in TASKS]}")


class ManiSkillVecEnv(VecEnv):
    def __init__(
        self,
        task_ids: Sequence[int],
        num_envs: int,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        cameras: Sequence[str] = ("agentview",),
        image_size: int = 128,
        reward_type: str = "sparse",
        max_steps: Optional[int] = None,
        sim_backend: str = "auto",
        **unused: Any,
    ):
        try:
            import gymnasium as gym
            import mani_skill.envs  # noqa: F401  (registers the tasks)
        except ImportError as err:
            raise ImportError("the maniskill backend needs ManiSkill3: pip install mani_skill") from err
        if reward_type not in ("sparse", "dense"):
            raise ValueError(f"reward_type must be sparse or dense for ManiSkill, got {reward_type!r}")
        unknown = [c for c in cameras if c not in CAMERA_MAP]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; ManiSkill tasks offer {list(CAMERA_MAP)}")
        self._gym = gym
        self._task_pool = list(task_ids)
        self.tasks = [task_specs()[i] for i in self._task_pool]
        missing = [t.name for t in self.tasks if not set(cameras) <= set(t.extras["cameras"])]
        if missing:
            raise ValueError(f"tasks {missing} have no camera among {list(cameras)}; use cameras=('agentview',)")
        if sim_backend == "auto":
            gpu = torch.cuda.is_available() and len(self._task_pool) == 1  # a GPU scene holds one task
            sim_backend = "physx_cuda" if gpu else "physx_cpu"
        if sim_backend not in ("physx_cpu", "physx_cuda"):
            raise ValueError(f"sim_backend must be auto, physx_cpu or physx_cuda, got {sim_backend!r}")
        if sim_backend == "physx_cuda" and len(self._task_pool) != 1:
            raise ValueError("the GPU backend batches one task per scene: give task=... (or use physx_cpu)")
        self.sim_backend = sim_backend
        self.num_envs, self.device = num_envs, torch.device(device)
        self.cameras, self.image_size, self.reward_type = tuple(cameras), image_size, reward_type
        self.control_hz = 20.0
        self.action_mode = "ee_delta"
        self._max_steps = np.array([max_steps or TASKS[i].max_steps for i in self._task_pool], np.int64)
        self.action_spec = Spec((7,), torch.float32, -1.0, 1.0, "ee_delta: dx,dy,dz,droll,dpitch,dyaw,gripper")
        self.observation_spec = {
            "state": Spec((15,), torch.float32, doc="tcp pos 3, tcp quat 4, gripper 1, joints 7"),
            "task_id": Spec((), torch.int64),
            "privileged": Spec((PRIVILEGED_DIM,), torch.float32, doc="task extras, zero-padded"),
        }
        if self.cameras:
            self.observation_spec["rgb"] = Spec((len(self.cameras), image_size, image_size, 3), torch.uint8, 0, 255)
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._task_ids = np.arange(num_envs) % len(self._task_pool)
        self._init_ids = np.full(num_envs, -1, np.int64)
        self._episode_seeds = np.zeros(num_envs, np.int64)  # the seed each env's episode was reset with
        self._elapsed = np.zeros(num_envs, np.int64)
        self._return = np.zeros(num_envs)
        self._envs: dict[tuple[int, int], Any] = {}  # (slot, task) -> gym env (cpu backend)
        self._batched: Any = None
        self._last: dict[str, torch.Tensor] = {}
        self._closed = False
        self.num_diverged = 0
        self.reset()

    # ------------------------------------------------------------------ scenes
    def _make(self, task_index: int, n: int) -> Any:
        t = TASKS[self._task_pool[task_index]]
        obs_mode = "rgb" if self.cameras else "state_dict"
        kwargs = dict(
            num_envs=n,
            obs_mode=obs_mode,
            control_mode="pd_ee_delta_pose",
            sim_backend=self.sim_backend,
            reward_mode="normalized_dense" if self.reward_type == "dense" else "sparse",
        )
        if self.cameras:
            kwargs["sensor_configs"] = dict(width=self.image_size, height=self.image_size)
        return self._gym.make(t.env_id, **kwargs)

    def _env(self, slot: int) -> Any:
        key = (slot, int(self._task_ids[slot]))
        if key not in self._envs:
            self._envs[key] = self._make(key[1], 1)
        return self._envs[key]

    def _seed_for(self, slot: int) -> int:
        init_id = int(self._init_ids[slot])
        if init_id >= 0:
            return zlib.crc32(f"{self.tasks[self._task_ids[slot]].name}/{init_id}".encode()) & 0x7FFFFFFF
        return int(self._rng.integers(0, 2**31 - 1))

    # ------------------------------------------------------------------ observation mapping
    def _convert(self, raw: dict[str, Any]) -> dict[str, torch.Tensor]:
        """ManiSkill's obs dict (batch n) -> ``state [n, 15]``, ``privileged [n, P]``, ``rgb``."""
        qpos = torch.as_tensor(raw["agent"]["qpos"]).float().cpu()
        tcp = torch.as_tensor(raw["extra"]["tcp_pose"]).float().cpu()
        n = qpos.shape[0]
        quat = quat_hemisphere(tcp[:, 3:7], TCP_HOME_QUAT)
        state = torch.cat([tcp[:, :3], quat, (qpos[:, 7] + qpos[:, 8])[:, None], qpos[:, :7]], 1)
        extras = [torch.as_tensor(v).float().cpu().reshape(n, -1) for k, v in raw["extra"].items() if k != "tcp_pose"]
        priv = torch.cat(extras, 1) if extras else torch.zeros(n, 0)
        priv = torch.nn.functional.pad(priv, (0, max(PRIVILEGED_DIM - priv.shape[1], 0)))[:, :PRIVILEGED_DIM]
        out = {"state": state, "privileged": priv}
        if self.cameras:
            views = [torch.as_tensor(raw["sensor_data"][CAMERA_MAP[c]]["rgb"]).cpu() for c in self.cameras]
            out["rgb"] = torch.stack(views, 1).to(torch.uint8)
        return out

    def _to_ms_action(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.detach().float().clamp(-1, 1).clone()
        a[:, 6] = -a[:, 6]  # ours: +1 closed; ManiSkill: +1 open
        return a

    # ------------------------------------------------------------------ the contract
    def reset(self, *, seed=None, task_ids=None, init_ids=None) -> dict[str, torch.Tensor]:
        if seed is not None:
            self._rng = np.random.default_rng(int(seed))
        if task_ids is not None:
            tids = np.asarray(task_ids, np.int64).reshape(-1)
            if tids.shape != (self.num_envs,) or (tids < 0).any() or (tids >= len(self.tasks)).any():
                raise ValueError(f"task_ids must be {self.num_envs} indices in [0, {len(self.tasks)})")
            if self.sim_backend == "physx_cuda" and (tids != 0).any():
                raise ValueError("the GPU backend runs one task")
            self._task_ids[:] = tids
        self._init_ids[:] = -1 if init_ids is None else np.asarray(init_ids, np.int64).reshape(-1)
        obs = self._reset_envs(np.arange(self.num_envs))
        self._last = obs
        return {k: v.clone() for k, v in obs.items()}

    def _reset_envs(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        rows: dict[int, dict[str, torch.Tensor]] = {}
        if self.sim_backend == "physx_cuda":
            if self._batched is None:
                self._batched = self._make(0, self.num_envs)
            seeds = [self._seed_for(int(i)) for i in ids]
            self._episode_seeds[ids] = seeds
            raw, _ = self._batched.reset(seed=seeds, options={"env_idx": torch.as_tensor(ids)})
            conv = self._convert(raw)
            for i in ids:
                rows[int(i)] = {k: v[int(i)] for k, v in conv.items()}
        else:
            for i in ids:
                self._episode_seeds[i] = self._seed_for(int(i))
                raw, _ = self._env(int(i)).reset(seed=int(self._episode_seeds[i]))
                rows[int(i)] = {k: v[0] for k, v in self._convert(raw).items()}
        self._elapsed[ids] = 0
        self._return[ids] = 0.0
        base = dict(self._last) if self._last else None
        out: dict[str, torch.Tensor] = {}
        for key in rows[int(ids[0])]:
            col = base[key].clone() if base is not None else torch.stack([rows[int(ids[0])][key]] * self.num_envs)
            for i, r in rows.items():
                col[i] = r[key]
            out[key] = col
        out["task_id"] = torch.as_tensor(self._task_ids.copy())
        return out

    def step(self, actions: torch.Tensor, *, active: torch.Tensor | None = None, render: bool = True):
        # ``render`` is accepted for the contract; ManiSkill renders its observation inside its own step
        if self._closed:
            raise RuntimeError("the env is closed")
        n = self.num_envs
        if tuple(actions.shape) != (n, 7):
            raise ValueError(f"actions must have shape [{n}, 7], got {tuple(actions.shape)}")
        if not torch.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        act = self._to_ms_action(actions)
        mask = np.ones(n, bool) if active is None else active.detach().cpu().numpy().astype(bool)
        ids = np.flatnonzero(mask)
        reward, success = np.zeros(n), np.zeros(n, bool)
        obs = {k: v.clone() for k, v in self._last.items()}
        if self.sim_backend == "physx_cuda":
            # the batched scene steps every env; the inactive ones hold still (zero motion, gripper kept)
            hold = act.clone()
            hold[~torch.as_tensor(mask), :6] = 0
            raw, r, _, _, info = self._batched.step(hold.to(self._batched.unwrapped.device))
            conv = self._convert(raw)
            for k, v in conv.items():
                obs[k][ids] = v[ids]
            reward[ids] = torch.as_tensor(r).float().cpu().numpy()[ids]
            success[ids] = torch.as_tensor(info["success"]).cpu().numpy()[ids]
        else:
            for i in ids:
                raw, r, _, _, info = self._env(int(i)).step(act[i : i + 1])
                for k, v in self._convert(raw).items():
                    obs[k][i] = v[0]
                reward[i] = float(torch.as_tensor(r).reshape(-1)[0])
                success[i] = bool(torch.as_tensor(info["success"]).reshape(-1)[0])
        if self.reward_type == "sparse":
            reward = success.astype(np.float64)
        self._elapsed[ids] += 1
        self._return[ids] += reward[ids]
        terminated = success & mask
        truncated = (self._elapsed >= self._max_steps[self._task_ids]) & mask & ~terminated
        done = terminated | truncated
        final_obs = {k: v.clone() for k, v in obs.items()}
        episode = {
            "return": torch.as_tensor(self._return.astype(np.float32)),
            "length": torch.as_tensor(self._elapsed.copy()),
        }
        self._last = obs
        if done.any():
            fresh = self._reset_envs(np.flatnonzero(done))
            obs = fresh
            self._last = fresh
        info_out = {
            "success": torch.as_tensor(success),
            "done": torch.as_tensor(done),
            "diverged": torch.zeros(n, dtype=torch.bool),
            "final_obs": final_obs,
            "episode": episode,
            "elapsed": torch.as_tensor(self._elapsed.copy()),
        }
        to = lambda x, dt: torch.as_tensor(x, dtype=dt).to(self.device)  # noqa: E731
        return (
            {k: v.to(self.device) for k, v in obs.items()},
            to(reward, torch.float32),
            to(terminated, torch.bool),
            to(truncated, torch.bool),
            info_out,
        )

    def sim_state(self, i: int) -> tuple[str, int, dict[str, Any]]:
        """Env ``i`` as ManiSkill holds it, for a planner that starts from it (:mod:`sims.maniskill.experts`):
        its task's ManiSkill ``env_id``, the seed its episode was reset with and ManiSkill's state dict
        of that env now (actor and articulation states, batch 1, CPU tensors)."""
        if not 0 <= i < self.num_envs:
            raise ValueError(f"env index {i} out of range: this env has {self.num_envs}")
        gpu = self.sim_backend == "physx_cuda"
        whole = (self._batched if gpu else self._env(i)).unwrapped.get_state_dict()
        k = i if gpu else 0  # the CPU backend holds one scene per env

        def row(tree: Any) -> Any:
            return {key: row(v) for key, v in tree.items()} if isinstance(tree, dict) else tree[k : k + 1].cpu()

        state = {key: row(v) for key, v in whole.items() if key != "controller"}
        return self.tasks[int(self._task_ids[i])].extras["env_id"], int(self._episode_seeds[i]), state

    def close(self) -> None:
        if self._closed:
            return
        for env in self._envs.values():
            env.close()
        if self._batched is not None:
            self._batched.close()
        self._envs.clear()
        self._closed = True


def make_maniskill_env(
    *, task: str | None, suite: str | None, num_envs: int, seed: int, device, **kwargs: Any
) -> ManiSkillVecEnv:
    """Factory registered as backend ``"maniskill"``: ``task=`` one task, or ``suite="maniskill"``."""
    if suite is not None and suite != SUITE:
        raise ValueError(f"the maniskill backend has one suite, {SUITE!r}, not {suite!r}")
    ids = list(range(len(TASKS))) if suite is not None else [_find(task)]
    return ManiSkillVecEnv(ids, num_envs, seed=seed, device=device, **kwargs)
