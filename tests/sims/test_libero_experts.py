"""The scripted LIBERO expert (sims/libero/experts.py) on an exported libero_spatial task: it picks
the bowl by its rim and puts it on the plate, judged by LIBERO's own goal predicate."""

from __future__ import annotations


import numpy as np
import pytest

from sims.libero import scenes
from sims.libero.experts import PickPlaceExpert, run_episodes
from sims.libero.worlds import LiberoWorlds

from conftest import needs_libero_venv

pytestmark = needs_libero_venv  # the scene export runs in the reference venv


def test_expert_puts_the_bowl_on_the_plate(libero_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 2, box_contacts="native")
    result = run_episodes(worlds, np.array([0, 3]))
    assert result["success"].all(), result
    assert (result["length"] < worlds.max_steps).all()
    # the goal holds because the bowl sits on the plate, centred within LIBERO's 3 cm
    for d in worlds.datas:
        bowl, plate = worlds.goal.position(d, "akita_black_bowl_1"), worlds.goal.position(d, "plate_1")
        assert np.linalg.norm((bowl - plate)[:2]) < 0.03 and bowl[2] >= plate[2]


def test_expert_refuses_other_goals(libero_exported):
    worlds = LiberoWorlds(scenes.task_dir("libero_spatial", 0, libero_exported[0]), 1, box_contacts="native")
    worlds.goal.goal = [["open", "wooden_cabinet_1_top_region"]]
    with pytest.raises(ValueError, match="one 'on' or 'in' predicate with a movable object"):
        PickPlaceExpert(worlds)
