"""The push expert (sims/libero/push_expert.py) on libero_goal task 5, "push the plate to the front of
the stove": the plate, too flat for a grasp and lying 3.4 cm from the cabinet's side, is pushed from
within its rim into the table region, judged by LIBERO's own ``on`` predicate for a region."""

from __future__ import annotations

import numpy as np
from conftest import needs_libero_venv

from sims.libero import scenes
from sims.libero.experts import make_expert, run_episodes
from sims.libero.push_expert import PushExpert
from sims.libero.worlds import LiberoWorlds

pytestmark = needs_libero_venv  # the scene export runs in the reference venv


def test_push_expert_pushes_the_plate_to_the_front_of_the_stove(libero_goal_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 5, libero_goal_exported), 2, box_contacts="reference")
    expert = make_expert(worlds)
    assert isinstance(expert, PushExpert) and (expert.obj, expert.target) == (
        "plate_1",
        "main_table_stove_front_region",
    )
    worlds.reset([0, 1])
    start = [expert.remaining(d) for d in worlds.datas]
    assert min(start) > 0.2  # the plate starts more than 20 cm from the region's centre
    result = run_episodes(worlds, np.array([0, 1]), expert)
    assert result["success"].all(), result
    assert (result["length"] < worlds.max_steps).all()
    for d in worlds.datas:
        assert expert.remaining(d) < 0.04  # within the region's half-extent
        assert worlds.goal.success(d)


def test_push_expert_starts_over_when_the_hand_leaves_the_line(libero_goal_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_goal", 5, libero_goal_exported), 1, box_contacts="reference")
    expert = make_expert(worlds)
    worlds.reset([0])
    expert.phase[0] = expert.PUSH
    # the hand far off the line from the plate to the region: the push gives up and lifts
    d = worlds.datas[0]
    u, off = expert.direction(d), d.site_xpos[worlds.arm.site][:2] - expert.hold_point(d)[:2]
    assert np.linalg.norm(off - (off @ u) * u) > expert.cfg.line_tol
    expert.act()
    assert expert.phases[expert.phase[0]] == "up"
