"""The evaluation protocol's constants, shared by the simulators, data collection and training.

Initial state ``k`` of a task is a pure function of (suite, task name, k). The fixed evaluation
states are ``0 .. NUM_INIT_STATES - 1``; demonstrations and RL's training starts use the states from
``TRAIN_INIT_OFFSET`` on, so a policy is never evaluated on a layout it was trained on.
"""

from __future__ import annotations

#: default seed of the fixed initial states: with init ids, an initial state is a pure function of
#: (this seed, suite, task name, init id)
EVAL_SEED = 20260101
#: fixed evaluation initial states per task (ids ``0 .. NUM_INIT_STATES - 1``), one episode each
NUM_INIT_STATES = 50
#: first initial-state id of demonstrations and of RL's training starts
TRAIN_INIT_OFFSET = 10_000
#: the robot's arm joints start uniformly within +- this (rad) of the home pose
ROBOT_INIT_NOISE = 0.02

__all__ = ["EVAL_SEED", "NUM_INIT_STATES", "ROBOT_INIT_NOISE", "TRAIN_INIT_OFFSET"]
