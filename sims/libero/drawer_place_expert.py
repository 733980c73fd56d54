"""The scripted expert of "open the drawer and put the object inside" (libero_goal task 3: ``in
akita_black_bowl_1 wooden_cabinet_1_top_region``, the drawer closed at the start), on privileged state,
through LIBERO's action space, batched over the envs of a :class:`sims.libero.worlds.LiberoWorlds`.

Three stages per env: :class:`~sims.libero.fixture_experts.DrawerExpert` opens the drawer and backs
away; the hand returns to where and how it started (pointing down: the pull ends with it pointing at
the cabinet, the arm stretched, where OSC_POSE would not bring it back by itself); then the
pick-and-place expert it is given (:class:`sims.libero.experts.PickPlaceExpert`, built by
:func:`sims.libero.experts.make_expert`) puts the object into the drawer's region, which moved out
with the drawer.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from sims.libero.fixture_experts import DrawerExpert, FixtureExpertConfig
from sims.libero.worlds import LiberoWorlds

DRAWER, RETURN, PLACE = range(3)


class DrawerPlaceExpert:
    """Opens drawer region ``region`` of ``worlds``' task, then ``place`` (a pick-and-place expert over
    the same worlds: ``act() -> [N, 7]``, ``reset(env_ids)``, ``phase``, ``phases``, ``obj``, ``target``)
    puts the goal's object in it.

    ``phase [N]`` indexes :attr:`phases`: the drawer expert's phases, ``return``, then the
    pick-and-place expert's (prefixed ``place:``)."""

    def __init__(
        self,
        worlds: LiberoWorlds,
        region: str,
        place: Any,
        drawer_cfg: FixtureExpertConfig = FixtureExpertConfig(),
        return_tol: float = 0.02,
        return_steps: int = 60,
    ) -> None:
        if place.worlds is not worlds:
            raise ValueError("the pick-and-place expert must act on the same worlds as the drawer expert")
        self.worlds = worlds
        self.drawer = DrawerExpert(worlds, region, drawer_cfg)
        self.place = place
        self.obj, self.target = self.place.obj, self.place.target
        self.return_tol, self.return_steps = return_tol, return_steps
        self.phases = (*self.drawer.phases, "return", *(f"place:{p}" for p in self.place.phases))
        n = worlds.num_envs
        self.stage = np.zeros(n, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)

    @property
    def phase(self) -> np.ndarray:
        """``[N]`` indices into :attr:`phases`."""
        k = len(self.drawer.phases)
        return np.where(
            self.stage == DRAWER, self.drawer.phase, np.where(self.stage == RETURN, k, k + 1 + self.place.phase)
        )

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        """Start over (every env, or the envs ``env_ids`` of its worlds) from opening the drawer."""
        rows = slice(None) if env_ids is None else np.asarray(env_ids, np.int64)
        self.stage[rows] = DRAWER
        self.count[rows] = 0
        self.drawer.reset(env_ids)
        self.place.reset(env_ids)

    def _opened(self, i: int, d: mujoco.MjData) -> bool:
        """Env ``i``'s drawer is open and the drawer expert has backed away from it (or stopped trying)."""
        drawer = self.drawer
        if drawer.phase[i] != drawer.BACK or not drawer.past_target(d):
            return False
        standoff = drawer.handle_point(d) + drawer.open_direction(d) * drawer.cfg.standoff
        near = np.linalg.norm(standoff - d.site_xpos[self.worlds.arm.site]) < 3 * drawer.cfg.reach_tol
        return bool(near or drawer.count[i] > drawer.cfg.stall_steps)

    def act(self) -> np.ndarray:
        """Actions ``[N, 7]`` for the envs' current state (and the stage each is in)."""
        w, drawer = self.worlds, self.drawer
        actions = np.zeros((w.num_envs, 7))
        for i, d in enumerate(w.datas):
            if self.stage[i] == DRAWER:
                actions[i] = drawer._act(i, d)
                if self._opened(i, d):
                    self.stage[i], self.count[i] = RETURN, 0
            if self.stage[i] == RETURN:
                self.count[i] += 1
                home = drawer.home_pos[i]
                actions[i] = drawer._action(d, home, drawer.home_mat[i], -1.0)
                there = np.linalg.norm(home - d.site_xpos[w.arm.site]) < self.return_tol and drawer._turned(
                    d, drawer.home_mat[i]
                )
                if there or self.count[i] > self.return_steps:
                    self.stage[i] = PLACE
                    self.place.reset(np.array([i]))
        placing = self.stage == PLACE
        if placing.any():
            actions[placing] = self.place.act()[placing]
        return actions
