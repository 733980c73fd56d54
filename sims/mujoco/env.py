"""``MujocoVecEnv``: N tabletop envs on one ``MjModel``, stepped by ``mujoco.batch`` C threads.

Per control step: the controller turns actions into servo targets (batched numpy), one
``Batch.step(nstep=substeps)`` call advances every active env on MuJoCo's thread pool, then
success, reward, divergence and observations are computed from arrays bound to the batch.
Results are bit-identical at any thread count (each env is its own state row).

With MuJoCo Warp physics (``physics="warp"``, backend ``mujoco_gpu``) the same task logic runs on
torch views of the Warp device's arrays (``task_logic="device"``, :mod:`sims.mujoco.arrays`): a
control step moves only the actions in and the ``[N]`` success/divergence/reward columns out; the
state crosses to the host only when an episode is reset (initial states are drawn on the host),
for GL rendering, or when host code reads a field (``env.qpos`` outside a step).

Observation keys (per env):
- ``state`` float32 ``[15]``: TCP position (3), TCP quaternion w,x,y,z (4, sign chosen in the home
  orientation's hemisphere: continuous, unlike ``w >= 0`` with the gripper down), gripper width in
  metres (1), arm joint angles in the real Panda convention (7);
- ``rgb`` uint8 ``[V, H, W, 3]`` for the requested cameras (absent when ``cameras=()``);
- ``task_id`` int64 scalar;
- ``privileged`` float32 ``[P]``: object poses and goals, named by ``TaskSpec.privileged_keys``
  (for scripted experts, critics and state-only RL; a VLA must not read it).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Sequence

import mujoco
import numpy as np
import torch
from mujoco import batch as mjbatch

from sims.core import Obs, Spec, VecEnv, env_index_array
from sims.episodes import EpisodeBook
from sims.mujoco import controller as ctl
from sims.mujoco.arrays import like, to_numpy, torch_namespace
from sims.mujoco.robot import (
    ACTION_NAMES,
    ARM_JOINTS,
    FINGER_JOINTS,
    FINGER_MAX,
    STATE_NAMES,
    TCP_SITE,
    home_qpos_sim,
    to_real_joints,
)
from sims.mujoco.scene import CAMERAS, SceneOptions, build_tabletop
from sims.mujoco.task import MujocoTask
from sims.protocol import ROBOT_INIT_NOISE

STATE_DIM = len(STATE_NAMES)
#: a joint speed above this (rad/s or m/s) is treated as a diverged simulation.
MAX_QVEL = 200.0
ACTION_MODES = ("ee_delta", "joint_pos")
#: sparse: 1 at success; dense: the task's progress in [0, 1] every step (1 at success);
#: shaped: potential-based, the progress made this step plus 1 at success (an episode's return is
#: final progress - initial progress + success, so lingering near the goal earns nothing)
REWARD_TYPES = ("sparse", "dense", "shaped")
#: gl: MuJoCo's OpenGL renderer, one env and camera at a time (sims/mujoco/render.py); warp: MuJoCo
#: Warp's batched ray tracer over all worlds (sims/mujoco/warp_render.py, physics="warp" only);
#: auto: warp when the physics is warp on a cuda device, else gl
RENDERERS = ("auto", "gl", "warp")
#: where the controller, observations, success predicates and rewards are computed: host (numpy on
#: the host arrays; always so for the C backend), device (torch on the Warp device, physics="warp"
#: only: the state stays on the device during a control step), auto (device for physics="warp")
TASK_LOGIC = ("auto", "host", "device")
#: how finely the GL renderer tessellates the round primitives (capsules, cylinders, spheres): the
#: (slices, stacks) of MuJoCo's built-in meshes. ``fast`` draws 2.5x fewer triangles, which is most
#: of a camera render's cost on a software rasteriser (llvmpipe): capsule silhouettes move by a
#: pixel at 64 px, the rest of the image is unchanged. ``full`` is MuJoCo's default.
RENDER_QUALITY = {"fast": (12, 6), "full": (28, 16)}
#: the simulation fields the env and its tasks read or write, ``[N, ...]`` per env
FIELDS = ("qpos", "qvel", "ctrl", "time", "mocap_pos", "xpos", "xquat", "site_xpos", "site_xmat", "xanchor", "xaxis")


def _state_field(name: str) -> property:
    """A simulation field of every env: the torch view on the Warp device while the task logic runs
    there (``task_logic="device"``), else the host numpy array (pulled from the device first when the
    device has moved on since the last pull)."""

    def get(self: "MujocoVecEnv") -> Any:
        if self._on_device:
            return self._device_fields[name]
        if self._host_stale:
            self._pull_host()
        return self._host_fields[name]

    return property(get, doc=f"``{name}`` of every env ``[N, ...]`` (see :func:`_state_field`)")


class MujocoVecEnv(VecEnv):
    """Batched tabletop envs on CPU MuJoCo. Build with ``sims.make("mujoco", task=...)``."""

    qpos = _state_field("qpos")
    qvel = _state_field("qvel")
    ctrl = _state_field("ctrl")
    time = _state_field("time")
    mocap_pos = _state_field("mocap_pos")
    xpos = _state_field("xpos")
    xquat = _state_field("xquat")
    site_xpos = _state_field("site_xpos")
    site_xmat = _state_field("site_xmat")
    xanchor = _state_field("xanchor")
    xaxis = _state_field("xaxis")

    def __init__(
        self,
        tasks: Sequence[MujocoTask],
        num_envs: int,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        cameras: Sequence[str] = CAMERAS,
        image_size: int = 128,
        control_hz: float = 20.0,
        physics_dt: float = 0.002,
        action_mode: str = "ee_delta",
        reward_type: str = "sparse",
        num_threads: int | None = None,
        controller: ctl.EEDeltaConfig = ctl.EEDeltaConfig(),
        init_noise: float = ROBOT_INIT_NOISE,
        max_steps: int | None = None,
        scene_builder: Callable[[mujoco.MjSpec], None] | None = None,
        physics: str = "mujoco",
        warp_device: str | None = None,
        renderer: str = "auto",
        task_logic: str = "auto",
        warp_copy_mirrors: bool = False,
        render_quality: str = "fast",
    ):
        """Args beyond :func:`sims.make`'s:

        tasks: the tasks envs can run; env i starts on task ``i % len(tasks)``.
        scene_builder: adds the objects of a scene shared by all ``tasks`` (a suite's scene);
            None for one stand-alone task that builds its own.
        max_steps: overrides every task's step limit.
        physics: ``mujoco`` (MuJoCo's C batch, multi-threaded) or ``warp`` (MuJoCo Warp worlds on
            ``warp_device``: ``cuda`` when available, else ``cpu``; see sims/mujoco/warp_batch.py).
        renderer: camera renderer, one of :data:`RENDERERS` (``warp`` needs ``physics="warp"``);
            the choice made is ``self.renderer``.
        task_logic: one of :data:`TASK_LOGIC` (``device`` needs ``physics="warp"``); the choice
            made is ``self.task_logic``.
        warp_copy_mirrors: keep the Warp batch's host arrays as copies even on Warp's CPU device
            (where they are otherwise the device memory): runs the host <-> device copies of a CUDA
            device without one (tests).
        render_quality: a key of :data:`RENDER_QUALITY` (GL renderer; datasets, training and
            evaluation must use the same one, as they must the same image size).
        """
        if physics not in ("mujoco", "warp"):
            raise ValueError(f"physics must be 'mujoco' or 'warp', got {physics!r}")
        if renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
        if task_logic not in TASK_LOGIC:
            raise ValueError(f"task_logic must be one of {TASK_LOGIC}, got {task_logic!r}")
        if task_logic == "device" and physics != "warp":
            raise ValueError(
                "task_logic='device' runs the task logic on the MuJoCo Warp device and needs "
                "physics='warp' (backend 'mujoco_gpu'); the mujoco backend computes it on the host"
            )
        if renderer == "warp" and physics != "warp":
            raise ValueError(
                "renderer='warp' ray-traces MuJoCo Warp worlds and needs physics='warp' (backend "
                "'mujoco_gpu'); with the mujoco backend use renderer='gl' or 'auto'"
            )
        if render_quality not in RENDER_QUALITY:
            raise ValueError(f"render_quality must be one of {list(RENDER_QUALITY)}, got {render_quality!r}")
        if not tasks:
            raise ValueError("at least one task is needed")
        if scene_builder is None and len(tasks) != 1:
            raise ValueError("several tasks need a shared scene_builder")
        if action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {action_mode!r}")
        if reward_type not in REWARD_TYPES:
            raise ValueError(f"reward_type must be one of {REWARD_TYPES}, got {reward_type!r}")
        substeps = round(1.0 / (control_hz * physics_dt))
        if substeps < 1 or abs(substeps * physics_dt * control_hz - 1.0) > 1e-6:
            raise ValueError(
                f"control period 1/{control_hz} s is not a whole number of physics steps of {physics_dt} s"
            )
        views = [parse_camera(c) for c in cameras]  # (base camera, lag in control steps)
        dims = {t.privileged_dim for t in tasks}
        if len(dims) != 1:
            raise ValueError(f"tasks of one env must share the privileged layout, got sizes {dims}")
        self.task_objs = list(tasks)
        self.task = self.task_objs[0]
        if max_steps is not None:
            if max_steps < 1:
                raise ValueError(f"max_steps must be >= 1, got {max_steps}")
            for t in self.task_objs:
                t.max_steps = int(max_steps)
        self.tasks = [t.spec for t in self.task_objs]
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.control_hz = control_hz
        self.substeps = substeps
        self.action_mode = action_mode
        self.reward_type = reward_type
        self.cameras = tuple(cameras)
        self.image_size = image_size
        self.controller = controller
        self.init_noise = init_noise

        spec = build_tabletop(
            SceneOptions(image_size=image_size, timestep=physics_dt, table_top_plane=physics == "warp")
        )
        (scene_builder or self.task.build)(spec)
        self.model = spec.compile()
        self.render_quality = render_quality
        self.model.vis.quality.numslices, self.model.vis.quality.numstacks = RENDER_QUALITY[render_quality]
        threads = num_threads if num_threads is not None else (os.cpu_count() or 1)
        self.num_threads = max(1, min(int(threads), num_envs))
        self.physics = physics
        self.task_logic = "device" if physics == "warp" and task_logic != "host" else "host"
        self._on_device = False  # True while the task logic runs on the device views
        self._host_stale = False  # the device state moved on since the host arrays were pulled
        if physics == "warp":
            from sims.mujoco.warp_batch import WarpBatch

            self.sim = WarpBatch(
                self.model,
                num_envs,
                device=warp_device,
                auto_sync=self.task_logic == "host",
                copy_mirrors=warp_copy_mirrors,
            )
        else:
            self.sim = mjbatch.Batch(self.model, num_envs, nthread=self.num_threads)
        self.renderer = self._pick_renderer(renderer)
        self._bind()
        for t in self.task_objs:
            t.bind(self)

        action_dim = 7 if action_mode == "ee_delta" else 8
        self.action_spec = Spec(
            (action_dim,),
            torch.float32,
            -1.0,
            1.0,
            "ee_delta: " + ",".join(ACTION_NAMES)
            if action_dim == 7
            else "joint_pos: 7 real-convention joints, gripper",
        )
        self.observation_spec = {
            "state": Spec((STATE_DIM,), torch.float32, doc="tcp pos 3, tcp quat 4, gripper 1, joints 7"),
            "task_id": Spec((), torch.int64),
            "privileged": Spec((self.task.privileged_dim,), torch.float32, doc=str(self.task.privileged_keys)),
        }
        if self.cameras:
            self.observation_spec["rgb"] = Spec((len(self.cameras), image_size, image_size, 3), torch.uint8, 0, 255)
            bases = list(dict.fromkeys(b for b, _ in views))  # each camera rendered once per step
            self._view_src = [(bases.index(b), lag) for b, lag in views]
            self._renderer = self._make_renderer(tuple(bases))
            self._history = any(lag for _, lag in views) or len(bases) != len(views)
            if self._history:
                # frames of the last max-lag + 1 control steps, newest first: [N, L, B, H, W, 3]
                self._frames = np.zeros(
                    (num_envs, max(lag for _, lag in views) + 1, len(bases), image_size, image_size, 3), np.uint8
                )
                self._rendered = np.zeros((num_envs, len(bases), image_size, image_size, 3), np.uint8)
            # the warp renderer without history makes rgb on the device: no host buffer then
            self._device_rgb = self.renderer == "warp" and not self._history
            self._last_device_rgb: torch.Tensor | None = None
            if not self._device_rgb:
                self._rgb = np.zeros((num_envs, len(self.cameras), image_size, image_size, 3), np.uint8)
        else:
            self._renderer = None
            self._history = False

        self._state: Any = None  # [N, STATE_DIM] float32, numpy or on the Warp device (task_logic)
        self._task_ids = np.arange(num_envs, dtype=np.int64) % len(self.task_objs)
        # steps, returns and step limits of the episodes; how a step ends them (sims/episodes.py)
        self._book = EpisodeBook(num_envs, [t.max_steps for t in self.task_objs])
        self._potential = np.zeros(num_envs, np.float64)
        self._init_ids = np.full(num_envs, -1, np.int64)
        self._rngs = self._make_rngs(seed)
        self.init_pool: np.ndarray | None = None  # see set_init_pool
        self._closed = False
        self.reset()

    def _pick_renderer(self, renderer: str) -> str:
        """``auto`` -> ``warp`` for Warp physics on a cuda device (one launch for all worlds), else ``gl``."""
        if renderer != "auto":
            return renderer
        if self.physics == "warp" and self.sim.wp.get_device(self.sim.device).is_cuda:
            return "warp"
        return "gl"

    def _make_renderer(self, cameras: tuple[str, ...]) -> Any:
        size = self.image_size
        if self.renderer == "warp":
            from sims.mujoco.warp_render import WarpBatchRenderer

            return WarpBatchRenderer(self.sim, cameras, size, size)
        from sims.mujoco.render import BatchRenderer

        return BatchRenderer(self.model, cameras, size, size)

    # ------------------------------------------------------------------ binding and accessors
    def _bind(self) -> None:
        m, sim = self.model, self.sim
        bound = [name for name in FIELDS if name != "mocap_pos" or m.nmocap]
        self._host_fields = {name: sim.bind(name) for name in bound}
        self._host_fields.setdefault("mocap_pos", np.zeros((self.num_envs, 0, 3)))
        if self.task_logic == "device":
            import torch

            self._device_fields = {name: sim.torch_view(name) for name in bound}
            self._device_fields.setdefault(
                "mocap_pos", torch.zeros((self.num_envs, 0, 3), device=self._device_fields["qpos"].device)
            )
        self.arm_qpos = np.array([m.joint(j).qposadr[0] for j in ARM_JOINTS])
        self.arm_qvel = np.array([m.joint(j).dofadr[0] for j in ARM_JOINTS])
        self.arm_jnt = np.array([m.joint(j).id for j in ARM_JOINTS])
        self.finger_qpos = np.array([m.joint(j).qposadr[0] for j in FINGER_JOINTS])
        self.arm_act = np.array([m.actuator(j).id for j in ARM_JOINTS])
        self.grip_act = m.actuator("gripper").id
        self.tcp_site = m.site(TCP_SITE).id
        self.tcp_body = int(m.site_bodyid[self.tcp_site])
        self.tcp_site_quat = m.site_quat[self.tcp_site].copy()  # TCP frame in its body's frame
        self.q_low = m.jnt_range[self.arm_jnt, 0] + 1e-3
        self.q_high = m.jnt_range[self.arm_jnt, 1] - 1e-3
        self.q_home = home_qpos_sim()

    @property
    def _elapsed(self) -> np.ndarray:
        """Steps of each env's current episode ``[N]`` (the book's array: tasks read it in ``before_step``)."""
        return self._book.elapsed

    @property
    def num_diverged(self) -> int:
        """Steps that diverged, over all envs, since the env was made."""
        return self._book.num_diverged

    @num_diverged.setter
    def num_diverged(self, value: int) -> None:
        self._book.num_diverged = int(value)

    # ------------------------------------------------------------------ where the task logic runs
    @property
    def xp(self) -> Any:
        """The array namespace of the fields right now: numpy, or torch's while the logic runs on the device."""
        return torch_namespace() if self._on_device else np

    @contextlib.contextmanager
    def _logic(self) -> Iterator[None]:
        """The task logic inside runs where ``task_logic`` says: with ``device``, fields read as torch
        views on the Warp device (the host arrays go stale once the device state moves on)."""
        if self.task_logic != "device" or self._on_device:
            yield
            return
        self._on_device = True
        try:
            yield
        finally:
            self._on_device = False

    def _pull_host(self) -> None:
        """Host arrays <- device state (``task_logic="device"`` only; free on Warp's CPU device)."""
        self._host_stale = False
        self.sim.download()

    def _device_moved(self) -> None:
        """Note that a physics call changed the device state (the host arrays are behind it)."""
        if self.task_logic == "device":
            self._host_stale = True

    # ------------------------------------------------------------------ accessors (numpy or torch)
    def tcp_pos(self) -> Any:
        """``[N, 3]`` TCP position (world)."""
        return self.site_xpos[:, self.tcp_site]

    def tcp_quat(self, sel: Any = slice(None)) -> Any:
        """``[N, 4]`` TCP orientation (w, x, y, z) in the hemisphere of the home orientation
        (:func:`sims.core.quat_hemisphere`; body quaternion x fixed site offset)."""
        body = self.xquat[sel, self.tcp_body]
        q = ctl.quat_mul(body, like(self.tcp_site_quat, body))
        return ctl.quat_hemisphere(q, like(ctl.TCP_HOME_QUAT, q))

    def tcp_mat(self) -> Any:
        """``[N, 9]`` TCP orientation matrix (row-major)."""
        return self.site_xmat[:, self.tcp_site]

    def gripper_width(self) -> Any:
        """``[N]`` distance between the fingers (m)."""
        return self.xp.sum(self.qpos[:, self.finger_qpos], axis=1)

    def arm_joints_real(self) -> Any:
        """``[N, 7]`` arm angles in the real Panda convention."""
        return to_real_joints(self.qpos[:, self.arm_qpos])

    # ------------------------------------------------------------------ reset
    def set_init_pool(self, init_ids: Any | None) -> None:
        """Draw every reset without an explicit init id (auto-resets included) from these fixed initial
        states (each env picks one with its own random stream); None: fresh random states again."""
        self.init_pool = None if init_ids is None else np.asarray(list(init_ids), np.int64)
        if self.init_pool is not None and (len(self.init_pool) == 0 or (self.init_pool < 0).any()):
            raise ValueError(f"an init pool needs non-negative init ids, got {list(init_ids)}")

    def _make_rngs(self, seed: int) -> list[np.random.Generator]:
        return [np.random.default_rng([seed, i]) for i in range(self.num_envs)]

    def _reset_envs(self, ids: np.ndarray) -> None:
        """Reset envs ``ids`` to a fresh initial state (their own random stream or init id)."""
        if len(ids) == 0:
            return
        self.sim.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        if self.task_logic == "device":
            # The initial states are drawn and written on the host arrays: only these envs' state rows
            # cross (both ways). The other rows may lag the device until the flag is set again below;
            # the code in between reads and writes rows ``ids`` only.
            self.sim.download_rows(ids)
            self._host_stale = False
        inits: dict[int, list[dict[str, np.ndarray]]] = {}
        for i in ids:
            init_id = int(self._init_ids[i])
            if init_id < 0 and self.init_pool is not None:
                init_id = int(self.init_pool[self._rngs[i].integers(len(self.init_pool))])
            task = self.task_objs[self._task_ids[i]]
            rng = self._rngs[i] if init_id < 0 else task.init_rng(init_id)
            offsets, init = task.draw_init(rng, self.init_noise)
            q = self.q_home + offsets
            self.qpos[i, self.arm_qpos] = q
            self.qpos[i, self.finger_qpos] = FINGER_MAX
            self.ctrl[i, self.arm_act] = q
            self.ctrl[i, self.grip_act] = FINGER_MAX
            inits.setdefault(int(self._task_ids[i]), []).append(init)
        for t, task_inits in inits.items():
            task_env_ids = ids[self._task_ids[ids] == t]
            self.task_objs[t].apply_init(task_env_ids, task_inits)
        self.sim.warning[ids] = 0
        if self.task_logic == "device":
            self.sim.upload_rows(ids)
        self.sim.forward(ids, stage=mujoco.mjtStage.mjSTAGE_POS)
        self._device_moved()
        self._book.reset(ids)
        if self.reward_type == "shaped":
            with self._logic():
                for t, g in self._task_groups(ids):
                    self._potential[g] = np.nan_to_num(to_numpy(self.task_objs[t].dense_reward(g)))

    def reset(self, *, seed=None, task_ids=None, init_ids=None) -> Obs:
        self._check_open()
        if seed is not None:
            self._rngs = self._make_rngs(int(seed))
        tids = env_index_array(task_ids, self.num_envs, "task_ids", high=len(self.tasks))
        if tids is not None:
            self._task_ids[:] = tids
        iids = env_index_array(init_ids, self.num_envs, "init_ids")
        self._init_ids[:] = -1 if iids is None else iids
        all_ids = np.arange(self.num_envs)
        self._reset_envs(all_ids)
        with self._logic():
            return self._observe(all_ids, fresh=True)

    # ------------------------------------------------------------------ step
    def _apply_actions(self, actions: Any, ids: np.ndarray) -> None:
        """Servo targets of envs ``ids`` from their actions ``[len(ids), A]`` (numpy, or torch on the
        device with ``task_logic="device"``)."""
        sel = slice(None) if len(ids) == self.num_envs else ids
        xp = self.xp

        def f64(x: Any) -> Any:  # the controller runs in float64 on either side (Warp's fields are float32)
            return xp.astype(x, xp.float64, copy=False)

        q = f64(self.qpos[sel][:, self.arm_qpos])
        if self.action_mode == "ee_delta":
            jac = ctl.geometric_jacobian(
                f64(self.xaxis[sel][:, self.arm_jnt]),
                f64(self.xanchor[sel][:, self.arm_jnt]),
                f64(self.site_xpos[sel, self.tcp_site]),
            )
            target = ctl.ee_delta_targets(actions, q, jac, self.q_home, self.q_low, self.q_high, self.controller)
            grip = actions[:, 6]
        else:
            target = ctl.joint_position_targets(actions)
            target = xp.clip(target, like(self.q_low, target), like(self.q_high, target))
            grip = actions[:, 7]
        ctrl = self.ctrl
        target, grip = xp.astype(target, ctrl.dtype), xp.astype(ctl.gripper_target(grip), ctrl.dtype)
        if isinstance(sel, slice):
            ctrl[:, self.arm_act] = target
        else:
            ctrl[np.ix_(ids, self.arm_act)] = target
        ctrl[sel, self.grip_act] = grip

    def step(self, actions: torch.Tensor, *, active: torch.Tensor | None = None, render: bool = True):
        self._check_open()
        n = self.num_envs
        act = self._checked_actions(actions)
        ids = np.arange(n)
        if active is not None:
            ids = ids[active.detach().cpu().numpy().astype(bool)]
        success, diverged, terminal = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        reward = np.zeros(n)
        if len(ids):
            with self._logic():
                groups = self._task_groups(ids)
                diverged = self._advance(act[ids], ids, groups)
                for t, g in groups:
                    task = self.task_objs[t]
                    success[g] = to_numpy(task.success(g)) & ~diverged[g]
                    reward[g] = self._reward(task, g, success[g])
                    terminal[g] = task.terminate_on_success
        out = self._book.record(
            ids, self._task_ids, success=success, diverged=diverged, reward=reward, terminal=terminal
        )
        # Observe every active env; for the ones that ended this is the final observation. Without
        # ``render`` only those are drawn (a frame history needs every frame).
        if len(ids):
            drawn = ids if render or self._history else ids[out.done[ids]]
            with self._logic():
                obs = self._observe(ids, drawn=drawn)
        else:
            obs = self._last_obs
        # _observe builds fresh tensors, so the automatic reset leaves the final observation intact
        return self._book.finish(out, obs, self._restart, self.device)

    def _checked_actions(self, actions: Any) -> Any:
        """``actions [N, A]`` clipped to ``[-1, 1]`` in float64 where the controller runs: numpy, or torch on
        the Warp device with ``task_logic="device"``; NaN, inf or a wrong shape raise."""
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(actions)
        if tuple(actions.shape) != (self.num_envs, *self.action_spec.shape):
            raise ValueError(
                f"actions must have shape [{self.num_envs}, {self.action_spec.shape[0]}], got {tuple(actions.shape)}"
            )
        if self.task_logic == "device":  # the actions go to the Warp device
            act = actions.detach().to(self._device_fields["qpos"].device, torch.float64)
            finite = bool(torch.isfinite(act).all())
        else:
            act = actions.detach().to("cpu", torch.float64).numpy()
            finite = bool(np.isfinite(act).all())
        if not finite:
            raise ValueError("actions contain NaN or inf")
        return act.clip(-1.0, 1.0)

    def _advance(self, actions: Any, ids: np.ndarray, groups: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """One control step of envs ``ids`` (grouped by task: ``groups``): servo targets from ``actions``, the
        tasks' own motions, the physics substeps. bool ``[N]``: the envs whose physics diverged (a MuJoCo
        warning, a state out of bounds, or an error that MuJoCo raised in it)."""
        n = self.num_envs
        self._apply_actions(actions, ids)
        for t, g in groups:
            self.task_objs[t].before_step(g)
        sel = slice(None) if len(ids) == n else ids
        warn_before = self.sim.warning[sel, :, 1].sum(axis=1)
        try:
            self.sim.step(None if len(ids) == n else ids, nstep=self.substeps, stage=mujoco.mjtStage.mjSTAGE_POS)
            failed = np.zeros(0, np.int64)
        except mjbatch.SimulationError as err:  # an env raised: treat as diverged
            failed = np.asarray(err.ids)
        self._device_moved()
        bad = (self.sim.warning[sel, :, 1].sum(axis=1) > warn_before) | to_numpy(self._unstable(sel))
        diverged = np.zeros(n, bool)
        diverged[ids[bad]] = True
        diverged[failed] = True
        return diverged

    def _reward(self, task: MujocoTask, ids: np.ndarray, success: np.ndarray) -> np.ndarray:
        """The rewards ``[len(ids)]`` of envs ``ids`` of ``task`` after a step (``success``: theirs), by
        ``reward_type``; the shaped reward moves their potential on."""
        if self.reward_type == "sparse":
            return success
        phi = np.nan_to_num(to_numpy(task.dense_reward(ids)))
        if self.reward_type == "dense":
            return phi
        reward = phi - self._potential[ids] + success  # potential-based: progress made + 1 at success
        self._potential[ids] = phi
        return reward

    def _restart(self, ids: np.ndarray) -> Obs:
        """Automatic reset of envs ``ids`` (their episode ended); every env's observation after it."""
        self._reset_envs(ids)
        with self._logic():
            return self._observe(ids, fresh=True)

    def _unstable(self, sel: Any) -> Any:
        """bool ``[len(sel)]``: a joint speed or position out of bounds (a comparison with NaN is False,
        so these also catch non-finite values)."""
        xp = self.xp
        return ~xp.all(xp.abs(self.qvel[sel]) <= MAX_QVEL, axis=1) | ~xp.all(xp.abs(self.qpos[sel]) < 1e6, axis=1)

    def _task_groups(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Envs ``ids`` grouped by the task they run: ``[(task index, env ids), ...]``."""
        if len(self.task_objs) == 1:
            return [(0, ids)]
        tids = self._task_ids[ids]
        return [(int(t), ids[tids == t]) for t in np.unique(tids)]

    def success_mask(self) -> np.ndarray:
        """bool ``[N]``: each env's task predicate at the current state."""
        out = np.zeros(self.num_envs, bool)
        with self._logic():
            for t, g in self._task_groups(np.arange(self.num_envs)):
                out[g] = to_numpy(self.task_objs[t].success(g))
        return out

    # ------------------------------------------------------------------ observations
    def _observe(self, ids: np.ndarray, fresh: bool = False, drawn: np.ndarray | None = None) -> Obs:
        """Refresh the cached observation rows of envs ``ids`` and return a copy of all rows.

        ``fresh``: the envs start an episode, so past frames of history cameras repeat this one.
        ``drawn``: the envs whose camera views are rendered (default ``ids``); the other rows keep
        the frames last rendered.
        """
        xp = self.xp
        sel = slice(None) if len(ids) == self.num_envs else ids
        qpos = self.qpos[sel]
        rows = xp.concat(
            [
                self.site_xpos[sel, self.tcp_site],
                self.tcp_quat(sel),
                xp.sum(qpos[:, self.finger_qpos], axis=1)[:, None],
                to_real_joints(qpos[:, self.arm_qpos]),
            ],
            axis=1,
        )
        rows = xp.astype(rows, xp.float32)
        if self._state is None or isinstance(sel, slice):
            self._state = rows  # a new array: the observation below may share its memory
        else:
            self._state[ids] = rows
        dev = self.device
        obs = {
            "state": self._obs_tensor(self._state),
            "task_id": torch.from_numpy(self._task_ids.copy()).to(dev),
            "privileged": self._obs_tensor(self._privileged()),
        }
        if self._renderer is not None:
            obs["rgb"] = self._views(ids if drawn is None else drawn, fresh)
        self._last_obs = obs
        return obs

    def _views(self, ids: np.ndarray, fresh: bool) -> torch.Tensor:
        """Render envs ``ids`` and return every env's camera views ``[N, V, H, W, 3]`` uint8 (a new tensor)."""
        dev = self.device
        if self._device_rgb:
            # the ray tracer's buffer as a torch tensor on the Warp device, copied once (on that device
            # when the obs live there: the next render overwrites the buffer). Worlds outside ``ids``
            # are re-rendered from their unchanged state, so their rows stay the same.
            if len(ids) or self._last_device_rgb is None:
                self._last_device_rgb = self._renderer.render_torch(self.sim).to(dev, copy=True)
            return self._last_device_rgb.clone()
        if not len(ids):  # nothing drawn: the frames last rendered
            return torch.from_numpy(self._rgb.copy()).to(dev)
        if self._host_stale:  # the GL renderer reads the host arrays
            self._pull_host()
        if not self._history:  # the views are the rendered cameras
            self._renderer.render(self.sim, ids, self._rgb)
            return torch.from_numpy(self._rgb.copy()).to(dev)
        self._renderer.render(self.sim, ids, self._rendered)
        if fresh:
            self._frames[ids] = self._rendered[ids][:, None]
        else:
            self._frames[ids, 1:] = self._frames[ids, :-1]
            self._frames[ids, 0] = self._rendered[ids]
        for v, (b, lag) in enumerate(self._view_src):
            self._rgb[ids, v] = self._frames[ids, lag, b]
        return torch.from_numpy(self._rgb.copy()).to(dev)

    def _obs_tensor(self, x: Any) -> torch.Tensor:
        """A float32 copy of ``x`` (numpy, or torch on the Warp device) on the obs device."""
        if isinstance(x, np.ndarray):
            return torch.from_numpy(np.array(x, np.float32)).to(self.device)
        return x.to(self.device, torch.float32, copy=True)

    def _privileged(self) -> Any:
        """``[N, P]`` privileged rows of every env (numpy, or torch while the logic runs on the device)."""
        groups = self._task_groups(np.arange(self.num_envs))
        if len(groups) == 1:
            return self.task_objs[groups[0][0]].privileged(groups[0][1])
        xp = self.xp
        parts = [self.task_objs[t].privileged(g) for t, g in groups]
        out = xp.zeros(
            (self.num_envs, self.task.privileged_dim),
            dtype=parts[0].dtype,
            **({} if xp is np else {"device": parts[0].device}),
        )
        for (_, g), rows in zip(groups, parts):
            out[g] = rows
        return out

    def render(self, env_id: int = 0, camera: str = "agentview") -> np.ndarray:
        """An ``[H, W, 3]`` uint8 frame of one env (for videos); works without obs cameras."""
        if not hasattr(self, "_video_renderer") or self._video_renderer.cameras != (camera,):
            from sims.mujoco.render import BatchRenderer

            self._video_renderer = BatchRenderer(self.model, (camera,), self.image_size, self.image_size)
            self._video_buf = np.zeros((self.num_envs, 1, self.image_size, self.image_size, 3), np.uint8)
        if self._host_stale:
            self._pull_host()
        self._video_renderer.render(self.sim, np.array([env_id]), self._video_buf)
        return self._video_buf[env_id, 0].copy()

    def set_elapsed(self, steps: torch.Tensor | np.ndarray) -> None:
        """Set each env's step counter ``[N]`` (e.g. random episode starts, as RSL-RL does)."""
        self._book.set_elapsed(steps, self._task_ids)

    def set_state(self, env_id: int, *, qpos: np.ndarray | None = None, qvel: np.ndarray | None = None) -> None:
        """Overwrite one env's physics state (tests, fault injection, replay)."""
        if qpos is not None:
            self.qpos[env_id] = qpos
        if qvel is not None:
            self.qvel[env_id] = qvel
        if self.task_logic == "device":
            self.sim.upload()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this env is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for r in (self._renderer, getattr(self, "_video_renderer", None)):
            if r is not None:
                r.close()


def parse_camera(name: str) -> tuple[str, int]:
    """``"agentview"`` -> ``("agentview", 0)``; ``"agentview_prev4"`` -> ``("agentview", 4)``: the view
    that camera showed 4 control steps ago (a frame history lets a policy see motion)."""
    base, sep, lag = name.rpartition("_prev")
    if sep and base in CAMERAS and lag.isdigit() and int(lag) >= 1:
        return base, int(lag)
    if name in CAMERAS:
        return name, 0
    raise ValueError(
        f"unknown camera {name!r}; available: {list(CAMERAS)}, or <camera>_prev<k> for the view k control steps ago"
    )
