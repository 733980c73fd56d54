"""N copies of one exported LIBERO task, stepped together: its init states (LIBERO's official 0..49 and
the held-out 50..99 its placement initializer sampled), LIBERO's controller and goal, the protocol's 8-D
state. The physics core of the batched LIBERO backend (no rendering).

    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0), num_envs=8)
    state = worlds.reset([0, 1, 2, 3, 4, 5, 6, 7])       # [8, 8], after the protocol's wait steps
    success = worlds.step(actions)                       # actions [8, 7] in [-1, 1] -> [8] bool

As in robosuite, the goal's truth is read from the simulator right after a step's last physics
substep, without another ``mj_forward`` (positions and contacts of the start of that substep), and
the state is robosuite's observation: its observables sample the simulator once per control period
on a timer that accumulates the 2 ms substeps in floating point (:class:`ObservationClock`), so
the state a step reports is the simulator's after an earlier substep of the step (the 24th of 25
in LIBERO's protocol), exactly what the reference env reports. The fixtures stay where the cache put them
(the official protocol's first episode; LIBERO moves them by up to 2 cm at later resets), for the
official and the sampled states alike (``meta.json["sampled_states"]`` records how far each sampled
state's own reset had put them).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import mujoco
import numpy as np

from sims.libero import INIT_IDS, NUM_WAIT_STEPS, max_steps
from sims.libero.osc import OSCArm, OSCConfig
from sims.libero.predicates import GoalChecker
from sims.libero.scenes import load_init_states, load_sampled_states, load_scene, read_meta

#: the protocol's views and the scene's cameras behind them
CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
#: robosuite's end-effector body (``robot0_eef_quat`` is its orientation)
EEF_BODY = "robot0_right_hand"
#: robosuite's observable timer after LIBERO's reset (its forced samples at the reset and at
#: ``set_init_state``), in seconds; measured against the reference env
OBS_CLOCK_START = 0.004
#: the protocol's open-gripper action of the wait steps
WAIT_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])


def quat_to_axisangle(quat_wxyz: np.ndarray) -> np.ndarray:
    """Axis-angle ``[N, 3]`` of unit quaternions ``[N, 4]`` (w, x, y, z), as LIBERO's state computes it
    (robosuite's ``quat2axisangle``: the angle from ``acos(w)``, no hemisphere flip)."""
    q = np.asarray(quat_wxyz, dtype=np.float64)
    w = np.clip(q[:, 0], -1.0, 1.0)
    den = np.sqrt(1.0 - w * w)
    small = np.isclose(den, 0.0)
    scale = np.where(small, 0.0, 2.0 * np.arccos(w) / np.where(small, 1.0, den))
    return q[:, 1:] * scale[:, None]


class ObservationClock:
    """robosuite's ``Observable`` timer (no delay): one sample per ``period`` of simulated time, taken at
    the first substep of each period, with the same floating-point arithmetic."""

    def __init__(self, timestep: float, period: float, start: float = OBS_CLOCK_START) -> None:
        self.timestep, self.period = timestep, period
        self.elapsed, self.sampled = start, True

    def tick(self) -> bool:
        """Advance one substep; whether the observation is sampled at it."""
        self.elapsed += self.timestep
        sample = not self.sampled and self.period >= self.elapsed
        if sample:
            self.sampled = True
        if self.elapsed >= self.period:
            self.elapsed %= self.period
            self.sampled = False
        return sample


class LiberoWorlds:
    """``num_envs`` copies of the exported task in ``task_dir``.

    Args:
        task_dir: a task folder of the scene cache (:func:`sims.libero.scenes.task_dir`).
        num_envs: N.
        box_contacts: ``reference`` (default: box-box contacts that respond as mujoco 2.3.7's, the
            closer match) or ``native`` (MuJoCo 4's own; 2.5 times cheaper physics).
        osc: the controller's configuration.
        cameras: views to render, of ``agentview`` and ``wrist`` (the protocol's two; none: state only).
        image_size: their height and width in pixels.
        shadows, reflections: MuJoCo's shadow and reflection passes (off by default: cheaper; the
            reference renders both, and with them the views match the reference's to 44-46 dB PSNR,
            without them to 28 dB for the agent view and 45 dB for the wrist view).
        render_faces: draw every mesh that only renders (robosuite's visual geoms) decimated to about this
            many triangles (:mod:`sims.mujoco.meshes`; a CPU renderer's cost is the triangles); None
            draws the scene's meshes as they are.
        antialias: draw with the scene's multisampling (4 samples, as the reference); False draws one
            sample per pixel, ~1.5x the frame rate on a CPU renderer, aliased edges.
        nthread: threads stepping the envs (default one per 4 envs, at most the cores; :mod:`sims.libero.physics`).
    """

    def __init__(
        self,
        task_dir: str | Path,
        num_envs: int,
        *,
        box_contacts: str = "reference",
        osc: OSCConfig = OSCConfig(),
        cameras: Sequence[str] = (),
        image_size: int = 128,
        shadows: bool = False,
        reflections: bool = False,
        render_faces: int | None = None,
        antialias: bool = True,
        nthread: int | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.meta = read_meta(task_dir)
        self.suite, self.task_index = self.meta["suite"], int(self.meta["task_index"])
        self.instruction: str = self.meta["language"]
        self.max_steps = max_steps(self.suite)
        self.model = load_scene(task_dir, box_contacts=box_contacts)
        self.init_states = load_init_states(task_dir)  # official [50, 1 + nq + nv], init ids 0..49
        self.sampled_states = load_sampled_states(task_dir)  # sampled [50, 1 + nq + nv], init ids 50..99
        self.states = np.concatenate([self.init_states, self.sampled_states])  # by init id [100, 1 + nq + nv]
        self.arm = OSCArm(self.model, osc)
        self.physics = self.arm.physics(num_envs, nthread)
        self.datas = self.physics.datas  # MjData copies of the simulations after each step (goal, experts, views)
        self.goal = GoalChecker(self.model, self.meta)
        self.num_envs = num_envs
        self._hand = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, EEF_BODY)
        self.init_ids = np.zeros(num_envs, dtype=np.int64)
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; LIBERO's views are {sorted(CAMERAS)}")
        self.cameras = tuple(cameras)
        self._views = None
        self.render_faces = render_faces
        self.antialias = antialias
        self._render_model: mujoco.MjModel | None = None
        if self.cameras:
            from sims.mujoco.render import BatchRenderer

            self._views = BatchRenderer(
                self.render_model(),
                [CAMERAS[c] for c in self.cameras],
                image_size,
                image_size,
                shadows=shadows,
                reflections=reflections,
                skybox=True,
                hidden_groups=(0,),
            )  # robosuite's collision geoms are not drawn
        self._images = np.zeros((num_envs, len(self.cameras), image_size, image_size, 3), np.uint8)
        # the views are drawn when read (render_views), from the positions each env's last observation
        # sample saw: qpos (and mocap poses) kept at the sample, and whether that sample is drawn yet
        self._sample_qpos = np.zeros((num_envs, self.model.nq))
        self._sample_mocap = (np.zeros((num_envs, self.model.nmocap, 3)), np.zeros((num_envs, self.model.nmocap, 4)))
        self._undrawn = np.zeros(num_envs, dtype=bool)
        b = self.physics.batch
        self._mocap = (b.bind("mocap_pos"), b.bind("mocap_quat")) if self.model.nmocap else None
        self._scratch: mujoco.MjData | None = None
        self._video: tuple[str, Any] | None = None
        self._timestep = float(self.model.opt.timestep)
        self._period = self._timestep * osc.substeps
        self._clocks = [ObservationClock(self._timestep, self._period) for _ in range(num_envs)]
        self._observed = np.zeros((num_envs, 8), np.float32)
        self._stepping = np.zeros(0, dtype=np.int64)
        self._due = np.zeros(0, dtype=np.int64)
        self._due_pose = np.zeros((0, 6))

    def _env_ids(self, env_ids: Sequence[int] | None) -> np.ndarray:
        if env_ids is None:
            return np.arange(self.num_envs)
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_envs or len(set(ids.tolist())) != len(ids)):
            raise ValueError(f"env ids must be distinct and in 0..{self.num_envs - 1}, got {ids.tolist()}")
        return ids

    def reset(
        self,
        init_ids: Sequence[int],
        wait_steps: int = NUM_WAIT_STEPS,
        gripper_command: np.ndarray | None = None,
        env_ids: Sequence[int] | None = None,
        render: bool = True,
    ) -> np.ndarray:
        """Every env (or the envs ``env_ids``) to init state ``init_ids[i]`` (0..49 official, 50..99 sampled),
        the controller as robosuite leaves it, then ``wait_steps`` open-gripper steps; the protocol's state
        ``[N, 8]`` of every env (the others unchanged). ``render``: draw the reset envs' views (:meth:`images`)
        now; False leaves them to :meth:`render_views`.

        ``gripper_command`` (``[2]`` or ``[len(init_ids), 2]``): the gripper command the reset starts from.
        robosuite keeps it across resets: ``[0, 0]`` (the default) in a new env, the previous episode's
        last one in the protocol's later episodes (``[1, -1]`` after an episode that ended with the
        gripper open)."""
        envs = self._env_ids(env_ids)
        ids = np.asarray(init_ids, dtype=np.int64).reshape(-1)
        if ids.shape != envs.shape:
            raise ValueError(f"init_ids must hold one id per env ({len(envs)}), got {ids.shape[0]}")
        if len(ids) == 0:
            return self.state()
        if ids.min() < 0 or ids.max() >= len(self.states):
            raise ValueError(f"init ids must be in {INIT_IDS}, got {ids.tolist()}")
        self.physics.load(envs, self.states[ids])
        self.arm.reset(
            self.num_envs if env_ids is None else None, rows=None if env_ids is None else envs, gripper=gripper_command
        )
        self.init_ids[envs] = ids
        for e in envs:
            self._clocks[e] = ObservationClock(self._timestep, self._period)
        # robosuite's forced observation at set_init_state
        self._observed[envs] = self._read_state(envs)
        self._sample_views(envs)
        for _ in range(wait_steps):
            self._advance(np.tile(WAIT_ACTION, (len(envs), 1)), envs, env_ids is None, sync=False)
        if wait_steps:  # (physics.load synced them)
            self.physics.sync(envs)
        if render:
            self.render_views(envs)
        return self.state()

    def render_model(self) -> mujoco.MjModel:
        """The model the views are drawn from: the scene's, or its copy with decimated visual meshes
        and/or without multisampling."""
        if self._render_model is None:
            if self.render_faces is not None:
                from sims.mujoco.meshes import decimated_copy

                self._render_model = decimated_copy(self.model, self.render_faces)
            elif not self.antialias:
                self._render_model = copy.copy(self.model)
            else:
                self._render_model = self.model
            if not self.antialias:
                self._render_model.vis.quality.offsamples = 0
        return self._render_model

    def continue_from(self, states: np.ndarray, gripper_command: np.ndarray | None = None) -> None:
        """Every env to a flattened simulator state ``[N, 1 + nq + nv]`` taken mid-episode (the reference's),
        the controller continuing from it (its orientation goal and null-space posture at their
        defaults, the gripper command ``gripper_command``), without wait steps."""
        states = np.asarray(states, dtype=np.float64)
        self.physics.load(np.arange(self.num_envs), states)
        self.arm.reset(self.num_envs, gripper=gripper_command, fresh=False)
        self._observed[:] = self._read_state(np.arange(self.num_envs))

    def _read_state(self, envs: np.ndarray) -> np.ndarray:
        """The 8-D state of ``envs`` from the derived fields now and the fingers' qpos now."""
        pose = np.concatenate(
            [self.physics.site_pos(envs), quat_to_axisangle(self.physics.body_quat(envs, self._hand))], axis=1
        )
        return np.concatenate([pose, self.physics.qpos[envs][:, self.arm.finger_idx]], axis=1).astype(np.float32)

    def _sample_views(self, envs: np.ndarray) -> None:
        """An observation sample of ``envs`` now: keep the positions their views show (drawn later)."""
        if self._views is not None and len(envs):
            self._sample_qpos[envs] = self.physics.qpos[envs]
            if self._mocap is not None:
                self._sample_mocap[0][envs], self._sample_mocap[1][envs] = self._mocap[0][envs], self._mocap[1][envs]
            self._undrawn[envs] = True

    def render_views(self, env_ids: Sequence[int] | None = None) -> None:
        """Draw the views of the envs ``env_ids`` (default all) whose last observation sample is not drawn
        yet, from the positions of that sample: the same pixels as drawing them at the sample (the
        derived fields a view reads are the kinematics of those positions)."""
        if self._views is None:
            return
        envs = self._env_ids(env_ids)
        envs = envs[self._undrawn[envs]]
        if not len(envs):
            return
        if self._scratch is None:
            self._scratch = mujoco.MjData(self.model)
        d, m = self._scratch, self.model
        for e in envs:
            d.qpos[:] = self._sample_qpos[e]
            if m.nmocap:
                d.mocap_pos[:], d.mocap_quat[:] = self._sample_mocap[0][e], self._sample_mocap[1][e]
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            mujoco.mj_camlight(m, d)
            self._views.render_data(d, self._images[e])
        self._undrawn[envs] = False

    def _before_substep(self, _: int) -> None:
        # robosuite samples after a substep: the positions of its start (mj_step's derived fields), the
        # joints after it; the clock does not depend on the physics, so tick it here
        due = np.array([e for e in self._stepping if self._clocks[e].tick()], dtype=np.int64)
        self._due = due
        if len(due):
            self._due_pose = np.concatenate(
                [self.physics.site_pos(due), quat_to_axisangle(self.physics.body_quat(due, self._hand))], axis=1
            )
            self._sample_views(due)

    def _after_substep(self, _: int) -> None:
        if len(self._due):
            fingers = self.physics.qpos[self._due][:, self.arm.finger_idx]
            self._observed[self._due] = np.concatenate([self._due_pose, fingers], axis=1).astype(np.float32)
            self._due = np.zeros(0, dtype=np.int64)

    def images(self) -> np.ndarray:
        """The views ``[N, V, H, W, 3]`` uint8 as the protocol's observation shows them, of the state when
        the observation was sampled (as drawn by the last :meth:`render_views`; :meth:`reset` and
        :meth:`step` draw them unless told not to): robosuite's renders are OpenGL's bottom-up buffer and the
        protocol rotates them by 180 degrees, which is MuJoCo 4's top-down image mirrored left-right."""
        return np.ascontiguousarray(self._images[:, :, :, ::-1])

    def step(self, actions: np.ndarray, env_ids: Sequence[int] | None = None, render: bool = True) -> np.ndarray:
        """One control step of ``actions [N, 7]`` (or ``[len(env_ids), 7]`` for the envs ``env_ids``, the
        others standing still); whether each stepped env's goal holds after it ``[N]`` / ``[len(env_ids)]``.
        ``render``: draw the stepped envs' views now; False leaves them to :meth:`render_views`."""
        envs = self._env_ids(env_ids)
        if len(envs) == 0:
            return np.zeros(0, dtype=bool)
        self._advance(actions, envs, env_ids is None)
        if render:
            self.render_views(envs)
        return self.success(envs)

    def _advance(self, actions: np.ndarray, envs: np.ndarray, every: bool, sync: bool = True) -> None:
        """One control step of ``envs``; ``sync``: then copy them into :attr:`datas` (the goal check,
        experts and videos read those)."""
        self._stepping = envs
        try:
            self.arm.step(
                self.physics,
                actions,
                rows=None if every else envs,
                before_substep=self._before_substep,
                after_substep=self._after_substep,
            )
        finally:
            self._stepping = np.zeros(0, dtype=np.int64)
        if sync:
            self.physics.sync(envs)

    def success(self, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """Whether the goal holds ``[N]`` (or ``[len(env_ids)]``) in the simulator's state now."""
        return np.array([self.goal.success(self.datas[e]) for e in self._env_ids(env_ids)], dtype=bool)

    def state(self) -> np.ndarray:
        """The official 8-D state ``[N, 8]`` float32 as the reference reports it: end-effector position
        (the grip site), the hand's orientation as an axis-angle, the two finger joint positions,
        sampled at the substep the observation clock chose."""
        return self._observed.copy()

    def render(self, env: int, camera: str = "agentview") -> np.ndarray:
        """One env's view ``[H, W, 3]`` uint8 now (not at the observation's substep), in the protocol's
        orientation; for videos, with or without observation cameras."""
        if camera not in CAMERAS:
            raise ValueError(f"unknown camera {camera!r}; LIBERO's views are {sorted(CAMERAS)}")
        if self._video is None or self._video[0] != camera:
            from sims.mujoco.render import BatchRenderer

            if self._video is not None:
                self._video[1].close()
            size = self._images.shape[2]
            self._video = (
                camera,
                BatchRenderer(self.render_model(), [CAMERAS[camera]], size, size, skybox=True, hidden_groups=(0,)),
            )
        out = np.zeros((1,) + self._images.shape[2:], np.uint8)
        self._video[1].render_data(self.datas[env], out)
        return np.ascontiguousarray(out[0, :, ::-1])

    def close(self) -> None:
        """Release the renderers and the simulations."""
        for r in (self._views, None if self._video is None else self._video[1]):
            if r is not None:
                r.close()
        self._views, self._video = None, None
        self.physics.close()

    def sim_state(self) -> np.ndarray:
        """The flattened simulator states ``[N, 1 + nq + nv]`` (time, qpos, qvel), robosuite's layout."""
        return np.stack([np.concatenate([[d.time], d.qpos, d.qvel]) for d in self.datas])


__all__ = ["CAMERAS", "EEF_BODY", "LiberoWorlds", "ObservationClock", "quat_to_axisangle"]
