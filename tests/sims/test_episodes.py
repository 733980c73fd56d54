"""The episode bookkeeping both MuJoCo envs share (sims/episodes.py), on tiny arrays: no simulator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sims.episodes import EpisodeBook, StepOutcome

F, T = False, True


def _book(n=3, limits=(3,)):
    return EpisodeBook(n, limits)


def test_steps_and_returns_count_only_the_stepped_envs():
    book = _book()
    out = book.record(
        None,
        np.zeros(3, np.int64),
        success=np.zeros(3, bool),
        diverged=np.zeros(3, bool),
        reward=np.array([0.5, -1.0, 2.0]),
    )
    assert book.elapsed.tolist() == [1, 1, 1] and book.returns.tolist() == [0.5, -1.0, 2.0]
    assert not out.done.any() and out.stepped.all()
    # inactive envs (active=): no step, no reward, nothing ends, whatever the inputs say
    out = book.record(
        np.array([T, F, T]),
        np.zeros(3, np.int64),
        success=np.array([F, T, F]),
        diverged=np.array([F, T, F]),
        reward=np.array([1.0, 7.0, 1.0]),
    )
    assert book.elapsed.tolist() == [2, 1, 2] and book.returns.tolist() == [1.5, -1.0, 3.0]
    assert out.reward.tolist() == [1.0, 0.0, 1.0]
    assert not out.success[1] and not out.diverged[1] and not out.done[1]
    assert book.num_diverged == 0
    # env ids select the stepped envs as a mask does
    out = book.record(np.array([1]), np.zeros(3, np.int64), success=np.ones(3, bool), diverged=np.zeros(3, bool))
    assert book.elapsed.tolist() == [2, 2, 2] and out.stepped.tolist() == [F, T, F]
    assert out.terminated.tolist() == [F, T, F] and out.reward.tolist() == [0.0, 1.0, 0.0]


def test_sparse_reward_terminates_at_success():
    book = _book()
    out = book.record(None, np.zeros(3, np.int64), success=np.array([T, F, F]), diverged=np.zeros(3, bool))
    assert out.reward.dtype == np.float64 and out.reward.tolist() == [1.0, 0.0, 0.0]
    assert out.terminated.tolist() == [T, F, F] and not out.truncated.any()
    assert out.done.tolist() == [T, F, F] and book.returns.tolist() == [1.0, 0.0, 0.0]


def test_a_diverged_env_is_truncated_and_never_successful():
    book = _book()
    out = book.record(None, np.zeros(3, np.int64), success=np.array([T, T, F]), diverged=np.array([F, T, F]))
    assert out.diverged.tolist() == [F, T, F] and out.success.tolist() == [T, F, F]
    assert out.terminated.tolist() == [T, F, F] and out.truncated.tolist() == [F, T, F]
    assert out.reward.tolist() == [1.0, 0.0, 0.0] and book.num_diverged == 1
    book.record(None, np.zeros(3, np.int64), success=np.zeros(3, bool), diverged=np.array([T, T, F]))
    assert book.num_diverged == 3


def test_success_at_the_step_limit_terminates_rather_than_truncates():
    book = _book(2, limits=(2,))
    book.record(None, np.zeros(2, np.int64), success=np.zeros(2, bool), diverged=np.zeros(2, bool))
    out = book.record(None, np.zeros(2, np.int64), success=np.array([T, F]), diverged=np.zeros(2, bool))
    assert out.terminated.tolist() == [T, F] and out.truncated.tolist() == [F, T]


def test_step_limits_are_per_task_and_terminal_is_per_env():
    book = EpisodeBook(3, limits=[1, 5])
    tasks = np.array([0, 1, 1])
    out = book.record(
        None, tasks, success=np.array([F, T, T]), diverged=np.zeros(3, bool), terminal=np.array([T, F, T])
    )
    # env 0 hits task 0's limit; env 1 succeeds where success does not end the episode
    assert out.truncated.tolist() == [T, F, F] and out.terminated.tolist() == [F, F, T]
    assert out.success.tolist() == [F, T, T] and out.reward.tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"shape \[3\]"):
        book.record(np.array([T, F]), tasks, success=np.zeros(3, bool), diverged=np.zeros(3, bool))


def test_info_and_reset_of_rows():
    book = _book()
    out = book.record(None, np.zeros(3, np.int64), success=np.array([F, T, F]), diverged=np.array([T, F, F]))
    final = {"state": torch.arange(3.0)}
    info = book.info(out, final)
    assert list(info) == ["success", "done", "diverged", "final_obs", "episode", "elapsed"]
    assert info["success"].tolist() == [F, T, F] and info["done"].tolist() == [T, T, F]
    assert info["diverged"].tolist() == [T, F, F] and info["final_obs"] is final
    assert info["episode"]["return"].dtype == torch.float32 and info["episode"]["return"].tolist() == [0.0, 1.0, 0.0]
    assert info["episode"]["length"].dtype == torch.int64 and info["episode"]["length"].tolist() == [1, 1, 1]
    assert info["elapsed"].dtype == torch.int64 and info["elapsed"].tolist() == [1, 1, 1]
    held = book.elapsed
    book.reset(np.array([0, 1]))
    assert book.elapsed is held and held.tolist() == [0, 0, 1] and book.returns.tolist() == [0.0, 0.0, 0.0]
    assert info["episode"]["length"].tolist() == [1, 1, 1]  # the info does not follow the book
    book.reset()
    assert book.elapsed.tolist() == [0, 0, 0]


@pytest.mark.parametrize("elapsed_of_ended, expected", [("next", [0, 2]), ("ended", [2, 2])])
def test_finish_resets_the_ended_envs_after_taking_their_final_observation(elapsed_of_ended, expected):
    book = _book(2, limits=(5,))
    tasks = np.zeros(2, np.int64)
    book.record(None, tasks, success=np.zeros(2, bool), diverged=np.zeros(2, bool), reward=np.array([0.25, 0.5]))
    out = book.record(None, tasks, success=np.array([T, F]), diverged=np.zeros(2, bool))
    restarted = []

    def restart(ids):
        restarted.append(ids.tolist())
        book.reset(ids)
        return {"state": torch.tensor([9.0, 1.0])}

    final = {"state": torch.tensor([1.0, 1.0])}
    obs, reward, terminated, truncated, info = book.finish(out, final, restart, elapsed_of_ended=elapsed_of_ended)
    assert restarted == [[0]] and obs["state"].tolist() == [9.0, 1.0]
    assert info["final_obs"]["state"].tolist() == [1.0, 1.0]
    assert reward.dtype == torch.float32 and reward.tolist() == [1.0, 0.0]
    assert terminated.tolist() == [T, F] and truncated.tolist() == [F, F] and info["done"].tolist() == [T, F]
    assert info["episode"]["return"].tolist() == [1.25, 0.5] and info["episode"]["length"].tolist() == [2, 2]
    assert info["elapsed"].tolist() == expected
    assert book.elapsed.tolist() == [0, 2]


def test_finish_without_ended_envs_does_not_reset():
    book = _book(2)
    out = book.record(None, np.zeros(2, np.int64), success=np.zeros(2, bool), diverged=np.zeros(2, bool))

    def restart(ids):
        raise AssertionError("nothing ended")

    obs = {"state": torch.zeros(2)}
    assert book.finish(out, obs, restart)[0] is obs
    with pytest.raises(ValueError, match="elapsed_of_ended"):
        book.finish(out, obs, restart, elapsed_of_ended="old")


def test_set_elapsed_keeps_below_each_tasks_limit():
    book = EpisodeBook(2, limits=[3, 10])
    book.set_elapsed(torch.tensor([2, 9]), np.array([0, 1]))
    assert book.elapsed.tolist() == [2, 9]
    with pytest.raises(ValueError, match="max_steps"):
        book.set_elapsed([3, 0], np.array([0, 1]))
    out = book.record(None, np.array([0, 1]), success=np.zeros(2, bool), diverged=np.zeros(2, bool))
    assert out.truncated.tolist() == [T, T]
    assert isinstance(out, StepOutcome)
