"""Scripted experts for suite tasks: waypoints through the end-effector controller.

Each env runs its task's plan as a Python generator (one script per env, readable top to
bottom); the generator yields one 7-D action per control step and reads the latest observation
from its context. Plans are sequences of primitives:

- ``("pick_place", obj, target)`` with target ``("on", support[, (dx, dy)])`` or ``("in", container)``;
- ``("lift", obj)``: pick and hold it up; ``("hold_above", obj, target)``: pick, hold it over target;
- ``("open", drawer)`` / ``("close", drawer)``: grasp the handle, pull / push, release.

Moving objects are tracked with their velocity (from the privileged observation) so the expert
also solves the dynamic suite.

``gain``: the fraction of the remaining position and orientation error commanded each control
step. 1 (default) commands the whole error: moves saturate (|a| = 1 on about a fifth of the
steps) and stop abruptly. Below 1 (e.g. 0.35) each move eases in over several steps, closer to
teleoperated data: on ``lift_the_can`` a quarter of the saturated steps and half the
step-to-step change of the actions, episodes 20-60% longer, every task still solved.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Sequence

import numpy as np
import torch

from sims.mujoco.controller import EEDeltaConfig, quat_to_mat, rotation_error
from sims.mujoco.suites.base import OBJ_STRIDE, SuiteTask
from sims.mujoco.suites.objects import DRAWER_TRAVEL, HANDLE_OUT

CARRY_Z = 0.2
SETTLE_SPEED = 0.03  # m/s: an object slower than this is grasped right away
SETTLE_STEPS = 40  # at most this many steps hovering over a moving object
GRASP_OFFSET = 0.012  # TCP above an object's centre when grasping it
DROP_CLEARANCE = 0.006  # gap under an object when the hand lets go of it
DRAWER_FLOOR_TOP = 0.036  # height of a drawer's floor (cabinet on the table, see objects.py)
PUSH_GAP = 0.035  # TCP distance behind the handle bar when pushing a drawer closed
HANDLE_GRIP = -0.5  # gripper command while approaching a drawer handle (half open)
GRASP_MIN_Z = 0.033  # the fingertips are 3 cm below the TCP: keep them off the table

Action = np.ndarray
Script = Generator[Action, None, None]


class Context:
    """One env's view for its script: the latest observation, parsed."""

    def __init__(self, task: SuiteTask, cfg: EEDeltaConfig, gain: float = 1.0):
        self.task = task
        self.gain = gain
        self.scene = task.scene
        self.cfg = cfg
        self.layout: dict[str, slice] = {}
        start = 0
        for key, size in task.privileged_keys:
            self.layout[key] = slice(start, start + size)
            start += size
        self.yaw: float | None = None
        self.prev: dict[str, np.ndarray] = {}
        self.vel: dict[str, np.ndarray] = {}

    def update(self, state: np.ndarray, priv: np.ndarray, dt: float) -> None:
        self.tcp = state[:3]
        self.rot = quat_to_mat(state[None, 3:7])[0]
        self.width = state[7]
        self.priv = priv
        for c in self.scene.carriages:
            p = priv[self.layout[f"{c.name}_pos"]]
            self.vel[c.name] = (p - self.prev[c.name]) / dt if c.name in self.prev else np.zeros(3)
            self.prev[c.name] = p.copy()
        if self.yaw is None:
            self.yaw = self.current_yaw()

    def current_yaw(self) -> float:
        """Yaw of the TCP y axis (the fingers' closing direction) in the world frame."""
        return float(np.arctan2(self.rot[1, 1], self.rot[0, 1]))

    def pos(self, name: str, lead: float = 0.0) -> np.ndarray:
        """Position of an object or carriage, predicted ``lead`` seconds ahead."""
        if f"{name}_pos" in self.layout:
            return self.priv[self.layout[f"{name}_pos"]] + lead * self.vel.get(name, 0.0)
        row = self.priv[self.layout[name]]
        return row[:3] + lead * row[7:10]

    def yaw_error(self) -> float:
        """Angle (rad) between the hand's current and desired yaw."""
        d = self.current_yaw() - self.yaw
        return float(abs(np.arctan2(np.sin(d), np.cos(d))))

    def speed(self, name: str) -> float:
        """Horizontal speed (m/s) of an object."""
        return float(np.linalg.norm(self.priv[self.layout[name]][7:9]))

    def quat(self, name: str) -> np.ndarray:
        return self.priv[self.layout[name]][3:7]

    def opening(self, drawer: str) -> float:
        return float(self.priv[self.layout[f"{drawer}_opening"]][0])

    def handle(self, drawer: str) -> np.ndarray:
        d = self.scene.by_name[drawer]
        x, y = d.extra.get("pos", (0.2, 0.18))
        inner_hx = d.size[0] - 0.016
        return np.array([x - inner_hx - HANDLE_OUT - self.opening(drawer), y, d.size[2]])

    def drawer_inside(self, drawer: str) -> np.ndarray:
        d = self.scene.by_name[drawer]
        x, y = d.extra.get("pos", (0.2, 0.18))
        return np.array([x - self.opening(drawer), y, DRAWER_FLOOR_TOP])

    def action(self, target: np.ndarray, grip: float, gain: float = 1.0) -> Action:
        err = target - self.tcp
        c, s = np.cos(self.yaw), np.sin(self.yaw)
        y_axis = np.array([c, s, 0.0])
        z_axis = np.array([0.0, 0.0, -1.0])
        desired = np.stack([np.cross(y_axis, z_axis), y_axis, z_axis], axis=1)
        rot_err = rotation_error(self.rot[None], desired[None])[0]
        a = np.zeros(7)
        a[:3] = np.clip(self.gain * gain * err / self.cfg.pos_scale, -1, 1)
        a[3:6] = np.clip(self.gain * rot_err / self.cfg.rot_scale, -1, 1)
        a[6] = grip
        return a


# ------------------------------------------------------------------------------- primitives
def goto(
    ctx: Context, target: Callable[[], np.ndarray], grip: float, tol: float, timeout: int, gain: float = 1.0
) -> Script:
    """Move the TCP to ``target()`` (re-evaluated every step) until within ``tol`` metres."""
    for _ in range(timeout):
        goal = target()
        if np.linalg.norm(goal - ctx.tcp) < tol:
            return
        yield ctx.action(goal, grip, gain)


def retreat(ctx: Context, grip: float) -> Script:
    """Rise straight up: slowly out of the clutter (no sideways drag), then fast to carry height."""
    spot = ctx.tcp.copy()
    yield from goto(ctx, lambda: spot + [0.0, 0.0, 0.05], grip, 0.01, 12, gain=0.4)
    spot[2] = CARRY_Z
    yield from goto(ctx, lambda: spot, grip, 0.03, 25)


def hold(ctx: Context, grip: float, steps: int, where: np.ndarray | None = None) -> Script:
    spot = ctx.tcp.copy() if where is None else where
    for _ in range(steps):
        yield ctx.action(spot, grip)


def _face_yaw(ctx: Context, obj: str) -> float:
    """Yaw that aligns the fingers with a face of a box (nearest to the current yaw)."""
    q = ctx.quat(obj)
    box_yaw = 2 * np.arctan2(q[3], q[0])
    cur = ctx.current_yaw()
    return float(box_yaw + np.round((cur - box_yaw) / (np.pi / 2)) * (np.pi / 2))


def pick(ctx: Context, obj: str) -> Script:
    """Approach above ``obj``, wait for it to (nearly) stop, align, descend, close, lift."""
    spec = ctx.scene.by_name[obj]
    lead = 0.25  # seconds of look-ahead while approaching a moving object

    def grasp_point() -> np.ndarray:
        p = ctx.pos(obj, lead)
        z = max(p[2] + (GRASP_OFFSET if spec.kind != "ball" else 0.004), GRASP_MIN_Z)
        return np.array([p[0], p[1], z])

    def xy_error() -> float:
        return float(np.linalg.norm(grasp_point()[:2] - ctx.tcp[:2]))

    if spec.kind == "cube":
        ctx.yaw = _face_yaw(ctx, obj)
    yield from goto(ctx, lambda: grasp_point() + [0, 0, 0.09], -1.0, 0.012, 60)
    lead = 0.0
    # a sliding object escapes the slightest touch: hover above it until it (nearly) stops,
    # the hand is turned and the fingers are centred on it, then go straight down
    for _ in range(SETTLE_STEPS):
        if ctx.speed(obj) < SETTLE_SPEED:
            break
        yield ctx.action(grasp_point() + [0, 0, 0.09], -1.0)
    if spec.kind == "cube":
        ctx.yaw = _face_yaw(ctx, obj)
    for _ in range(20):
        if ctx.yaw_error() < 0.05 and xy_error() < 0.004:
            break
        yield ctx.action(grasp_point() + [0, 0, 0.05], -1.0)
    yield from goto(ctx, grasp_point, -1.0, 0.007, 30)
    for _ in range(8):
        near = np.linalg.norm(ctx.pos(obj)[:2] - ctx.tcp[:2]) < 0.02
        yield ctx.action(grasp_point() if near else ctx.tcp, 1.0)
    up = ctx.tcp.copy()
    up[2] = CARRY_Z
    yield from goto(ctx, lambda: up, 1.0, 0.02, 40)


def place(ctx: Context, obj: str, target: tuple) -> Script:
    """Carry the held ``obj`` over ``target`` (``("on"|"in", where[, (dx, dy)])``), lower, release."""
    where = target[1]
    offset = np.array([*target[2], 0.0]) if len(target) > 2 else np.zeros(3)
    spec = ctx.scene.by_name[obj]
    lead = 0.3

    def drop_point() -> np.ndarray:
        if where in ctx.scene.by_name and ctx.scene.by_name[where].kind == "drawer":
            # front half of the drawer: the hand stays clear of the cabinet above the back half
            base = ctx.drawer_inside(where)
            return base + [-0.02, 0.0, spec.rest_z + GRASP_OFFSET + DROP_CLEARANCE] + offset
        sup = ctx.scene.by_name.get(where)
        base = ctx.pos(where, lead)
        if sup is None:  # a carriage
            car = next(c for c in ctx.scene.carriages if c.name == where)
            top = base[2] + car.half[2]
        elif sup.kind == "basket":
            top = base[2] + 0.01
        else:
            top = base[2] + sup.size[1]
        return np.array([base[0], base[1], top + spec.rest_z + GRASP_OFFSET + DROP_CLEARANCE]) + offset

    container = ctx.scene.by_name.get(where)
    if container is not None and container.kind == "drawer":
        # fingers open along y, across the drawer's width, away from its front and back panels
        ctx.yaw = float(np.pi / 2 + np.round((ctx.yaw - np.pi / 2) / np.pi) * np.pi)
    elif container is not None and container.kind == "basket":
        # fingers parallel to the basket's walls, so they can open inside it
        wall_yaw = 2 * np.arctan2(ctx.quat(where)[3], ctx.quat(where)[0])
        ctx.yaw = float(wall_yaw + np.round((ctx.yaw - wall_yaw) / (np.pi / 2)) * (np.pi / 2))
    yield from goto(ctx, lambda: np.array([*drop_point()[:2], CARRY_Z]), 1.0, 0.015, 80)
    lead = 0.1
    yield from goto(ctx, drop_point, 1.0, 0.008, 40)
    yield from release(ctx)
    yield from retreat(ctx, -1.0)


def release(ctx: Context, min_steps: int = 4, max_steps: int = 20) -> Script:
    """Open the hand in place until the fingers are (nearly) fully open."""
    spot = ctx.tcp.copy()
    for k in range(max_steps):
        if k >= min_steps and ctx.width > 0.072:
            return
        yield ctx.action(spot, -1.0)


def _handle_yaw(ctx: Context) -> float:
    cur = ctx.current_yaw()
    return float(np.round(cur / np.pi) * np.pi)  # fingers close along world x


def open_drawer(ctx: Context, drawer: str) -> Script:
    """Grasp the handle bar from above with a half-open hand and pull the drawer out."""
    ctx.yaw = _handle_yaw(ctx)
    above = lambda: ctx.handle(drawer) + [0.0, 0.0, 0.14]  # noqa: E731  (clear of the cabinet top)
    # half-open hand: the fingers straddle the bar without touching the cabinet behind it
    yield from goto(ctx, above, HANDLE_GRIP, 0.012, 60)
    yield from goto(ctx, above, HANDLE_GRIP, 0.003, 20)  # align precisely before going down
    yield from goto(ctx, lambda: ctx.handle(drawer), HANDLE_GRIP, 0.006, 30)
    yield from hold(ctx, 1.0, 8)
    for _ in range(60):
        opening = ctx.opening(drawer)
        if opening > DRAWER_TRAVEL - 0.01:
            break
        step = min(DRAWER_TRAVEL - opening, 0.04)
        yield ctx.action(ctx.handle(drawer) + [-step, 0.0, 0.0], 1.0)
    yield from release(ctx)
    yield from retreat(ctx, -1.0)


def close_drawer(ctx: Context, drawer: str) -> Script:
    """Put the closed hand on the robot side of the handle bar and push the drawer in."""
    ctx.yaw = _handle_yaw(ctx)
    behind = lambda: ctx.handle(drawer) + [-PUSH_GAP, 0.0, 0.0]  # noqa: E731
    yield from goto(ctx, lambda: behind() + [0.0, 0.0, 0.12], 1.0, 0.012, 60)
    yield from goto(ctx, lambda: behind() + [0.0, 0.0, 0.12], 1.0, 0.004, 20)
    yield from goto(ctx, behind, 1.0, 0.008, 30)
    for _ in range(60):
        opening = ctx.opening(drawer)
        if opening < 0.004:
            break
        yield ctx.action(behind() + [min(opening, 0.04) + PUSH_GAP, 0.0, 0.0], 1.0)
    up = ctx.tcp.copy()
    up[2] = CARRY_Z
    yield from goto(ctx, lambda: up, 1.0, 0.03, 25)


def run_plan(ctx: Context, plan: Sequence[tuple]) -> Script:
    for step in plan:
        op = step[0]
        if op == "pick_place":
            yield from pick(ctx, step[1])
            yield from place(ctx, step[1], step[2])
        elif op == "lift":
            yield from pick(ctx, step[1])
            while True:
                yield ctx.action(np.array([*ctx.tcp[:2], CARRY_Z]), 1.0)
        elif op == "hold_above":
            yield from pick(ctx, step[1])
            while True:
                yield ctx.action(np.array([*ctx.pos(step[2])[:2], 0.15]), 1.0)
        elif op == "open":
            yield from open_drawer(ctx, step[1])
        elif op == "close":
            yield from close_drawer(ctx, step[1])
        else:
            raise ValueError(f"unknown plan step {step!r}")
    while True:  # done: stay still, hand open
        yield ctx.action(ctx.tcp, -1.0)


class SuiteExpert:
    """Batched driver of per-env scripts for the tasks of one suite env.

    ``act(obs)`` returns ``[N, 7]`` actions; ``__call__(obs)`` the same as a chunk ``[N, 1, 7]``.
    Call ``reset(mask)`` for envs whose episode restarted (e.g. with ``info["done"]``).
    ``gain`` in (0, 1]: see the module docstring.
    """

    def __init__(
        self,
        tasks: Sequence[SuiteTask],
        num_envs: int,
        *,
        control_hz: float = 20.0,
        cfg: EEDeltaConfig = EEDeltaConfig(),
        gain: float = 1.0,
    ):
        if not 0.0 < gain <= 1.0:
            raise ValueError(f"expert gain must be in (0, 1], got {gain}")
        self.gain = float(gain)
        self.tasks = list(tasks)
        self.num_envs = num_envs
        self.cfg = cfg
        self.dt = 1.0 / control_hz
        self._scripts: list[Script | None] = [None] * num_envs
        self._ctx: list[Context | None] = [None] * num_envs

    def reset(self, mask: Any = None) -> None:
        if mask is None:
            idx = range(self.num_envs)
        else:
            m = np.asarray(mask.cpu() if isinstance(mask, torch.Tensor) else mask, bool)
            idx = np.flatnonzero(m)
        for i in idx:
            self._scripts[i] = None

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        state = obs["state"].cpu().numpy().astype(np.float64)
        priv = obs["privileged"].cpu().numpy().astype(np.float64)
        task_ids = obs["task_id"].cpu().numpy()
        out = np.zeros((self.num_envs, 7))
        for i in range(self.num_envs):
            task = self.tasks[int(task_ids[i])]
            if self._scripts[i] is None or self._ctx[i].task is not task:
                self._ctx[i] = Context(task, self.cfg, self.gain)
                self._ctx[i].update(state[i], priv[i], self.dt)
                self._scripts[i] = run_plan(self._ctx[i], task.plan)
            else:
                self._ctx[i].update(state[i], priv[i], self.dt)
            out[i] = next(self._scripts[i])
        return torch.as_tensor(out, dtype=torch.float32)

    def __call__(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.act(obs)[:, None, :]


__all__ = ["SuiteExpert", "OBJ_STRIDE"]
