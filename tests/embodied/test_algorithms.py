"""Chunk-level GAE, PPO and GRPO as pure functions (:mod:`embodied.algorithms.gae`, :mod:`embodied.algorithms.ppo`,
:mod:`embodied.algorithms.grpo`) and the update schedule (:func:`embodied.algorithms.update.run_epochs`), checked on
tiny tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied.algorithms.gae import chunk_gae, normalize_advantages
from embodied.algorithms.grpo import episode_weighted_advantages, grpo_advantages, grpo_group_filter, grpo_return_filter
from embodied.algorithms.ppo import ppo_loss

#: ppo_loss has no defaults (they live in embodied.algorithms.loss.LossConfig): the plain objective, spelled out
PLAIN = dict(clip=0.2, dual_clip=None, value_clip=None, vf_coef=0.5, ent_coef=0.0, kl_coef=0.0)


def _ppo(*args, **kwargs):
    return ppo_loss(*args, **{**PLAIN, **kwargs})


def _reference_gae(r, v, d, tr, last, fv, gamma, lam):
    t_len, n = r.shape
    adv = torch.zeros(t_len, n)
    for i in range(n):
        running = 0.0
        for t in reversed(range(t_len)):
            if d[t, i]:
                boot = fv[t, i] if tr[t, i] else 0.0
                running = r[t, i] + gamma * boot - v[t, i]
            else:
                nxt = last[i] if t == t_len - 1 else v[t + 1, i]
                running = r[t, i] + gamma * nxt - v[t, i] + gamma * lam * running
            adv[t, i] = running
    return adv


def test_chunk_gae_matches_a_loop_reference():
    g = torch.Generator().manual_seed(0)
    t_len, n = 12, 5
    r, v, fv = (torch.rand(t_len, n, generator=g) for _ in range(3))
    d = torch.rand(t_len, n, generator=g) < 0.25
    tr = d & (torch.rand(t_len, n, generator=g) < 0.5)
    last = torch.rand(n, generator=g)
    adv, ret = chunk_gae(r, v, d, tr, last, 0.99, 0.95, final_values=fv)
    torch.testing.assert_close(adv, _reference_gae(r, v, d, tr, last, fv, 0.99, 0.95))
    torch.testing.assert_close(ret, adv + v)


def test_termination_vs_truncation_and_monte_carlo_limit():
    one = torch.ones(1, 1)
    r, v, fv = one, 0.5 * one, 2.0 * one
    term, _ = chunk_gae(r, v, one.bool(), torch.zeros(1, 1, dtype=torch.bool), torch.tensor([9.0]), final_values=fv)
    trunc, _ = chunk_gae(r, v, one.bool(), one.bool(), torch.tensor([9.0]), final_values=fv)
    assert term.item() == pytest.approx(0.5)  # no bootstrap after a terminal state
    assert trunc.item() == pytest.approx(1 + 0.99 * 2.0 - 0.5)  # the step limit bootstraps
    # gamma = lambda = 1 without ends: advantage = future rewards + last value - value
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.zeros(3, 1)
    no = torch.zeros(3, 1, dtype=torch.bool)
    adv, _ = chunk_gae(r, v, no, no, torch.tensor([4.0]), gamma=1.0, lam=1.0)
    assert adv.flatten().tolist() == [10.0, 9.0, 7.0]
    with pytest.raises(ValueError, match="truncs must imply dones"):
        chunk_gae(r, v, no, ~no, torch.zeros(1))


def test_ppo_clipping_dual_clip_and_value_clip():
    a = torch.tensor([1.0, -1.0])
    old = torch.zeros(2)
    loss, stats = _ppo(torch.zeros(2), old, a, dual_clip=None)
    assert loss.item() == pytest.approx(0.0) and stats.clip_fraction == 0.0
    # ratio e^0.5 = 1.65: the positive advantage is clipped at 1.2, the negative one is not
    lp = torch.full((2,), 0.5, requires_grad=True)
    loss, stats = _ppo(lp, old, a, dual_clip=None)
    assert loss.item() == pytest.approx((-1.2 + 1.6487) / 2, abs=1e-4) and stats.clip_fraction == 1.0
    loss.backward()
    assert lp.grad[0] == 0.0 and lp.grad[1] > 0  # no gradient through the clipped term
    # dual clip bounds the loss of a negative advantage at -c * A
    huge = torch.full((1,), 3.0)
    loss, _ = _ppo(huge, torch.zeros(1), torch.tensor([-1.0]), dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)
    # value clipping keeps the larger of the clipped and unclipped errors
    _, stats = _ppo(
        torch.zeros(1),
        torch.zeros(1),
        torch.ones(1),
        values=torch.tensor([1.0]),
        old_values=torch.tensor([0.0]),
        returns=torch.tensor([1.0]),
        value_clip=0.2,
    )
    assert stats.value_loss == pytest.approx(0.5 * 0.8**2)
    with pytest.raises(ValueError, match="dual_clip"):
        _ppo(torch.zeros(1), torch.zeros(1), -torch.ones(1), dual_clip=0.5)
    with pytest.raises(TypeError, match="clip"):  # no defaults: the caller's LossConfig sets every one
        ppo_loss(torch.zeros(1), torch.zeros(1), torch.ones(1))


def test_ppo_approx_kl_and_entropy_bonus():
    lp = torch.log(torch.tensor([1.1, 0.9]))
    loss0, s0 = _ppo(lp, torch.zeros(2), torch.zeros(2), entropy=torch.ones(2), ent_coef=0.0)
    loss1, _ = _ppo(lp, torch.zeros(2), torch.zeros(2), entropy=torch.ones(2), ent_coef=0.01)
    assert loss1.item() == pytest.approx(loss0.item() - 0.01)
    expected_kl = ((torch.tensor([1.1, 0.9]) - 1) - lp).mean().item()
    assert s0.approx_kl == pytest.approx(expected_kl)
    assert s0.log_ratio_max == pytest.approx(abs(float(lp[1])))
    # one row far off dominates the mean: 63 rows at log ratio 0.01 and one at 4.4 (ratio 81)
    lp = torch.full((64,), 0.01)
    lp[7] = 4.4
    _, s = _ppo(lp, torch.zeros(64), torch.zeros(64))
    k3 = lambda r: math.exp(r) - 1 - r  # noqa: E731
    assert s.approx_kl == pytest.approx((63 * k3(0.01) + k3(4.4)) / 64, rel=1e-5)
    assert s.approx_kl > 1.0 and s.log_ratio_max == pytest.approx(4.4)


def test_grpo_advantages_and_dynamic_sampling():
    returns = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(returns)
    torch.testing.assert_close(adv.mean(1), torch.zeros(4), atol=1e-6, rtol=0)
    assert adv[1].abs().max() == 0 and adv[0, 0] > 0 > adv[0, 1]
    keep = grpo_group_filter(returns > 0.5)
    assert keep.tolist() == [True, False, False, True]
    assert grpo_return_filter(returns).tolist() == keep.tolist()  # sparse returns: the same groups
    # shaped returns (progress + 1 at success): an all-failure group that made different progress is
    # kept, one whose rollouts all ended alike is not
    shaped = torch.tensor([[0.3, 0.7], [0.2, 0.2], [1.9, 1.9], [1.9, 0.4]])
    assert grpo_return_filter(shaped).tolist() == [True, False, False, True]
    assert grpo_group_filter(shaped > 1.0).tolist() == [False, False, False, True]
    # Dr. GRPO: centred, not scaled: the near-tie (0.3 vs 0.7) pushes less than the success (1.9 vs 0.4)
    plain = grpo_advantages(shaped, std_norm=False)
    torch.testing.assert_close(plain[:, 0], torch.tensor([-0.2, 0.0, 0.0, 0.75]))
    assert grpo_advantages(shaped)[0, 0] == pytest.approx(-0.7071, abs=1e-3)
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(3, 1))


def test_advantage_normalisation():
    adv = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([True, True, True, False])
    out = normalize_advantages(adv, mask)
    assert out[mask].mean().abs() < 1e-6 and out[mask].std() == pytest.approx(1.0, abs=1e-5)


def test_first_episode_mask():
    from embodied.algorithms.batch import first_episode_mask

    done = torch.tensor([[False, True], [True, False], [False, True]])
    assert first_episode_mask(done).tolist() == [[True, True], [True, False], [False, False]]


def test_episode_weighting_makes_every_episode_count_once():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]])).flatten()  # one success among four
    lengths = torch.tensor([4.0, 16.0, 16.0, 16.0])  # the failures ran to the step limit
    assert float((adv * lengths).sum()) < -1.0  # per chunk, the group's advantages no longer sum to 0
    scaled = episode_weighted_advantages(adv, lengths)
    assert abs(float((scaled * lengths).sum())) < 1e-5
    assert torch.equal(scaled.sign(), adv.sign())  # nobody changes side
    torch.testing.assert_close(episode_weighted_advantages(adv, torch.full((4,), 7.0)), adv)
    with pytest.raises(ValueError, match="must both be"):
        episode_weighted_advantages(adv, lengths[:3])
    with pytest.raises(ValueError, match=">= 1 chunk"):
        episode_weighted_advantages(adv, torch.tensor([0.0, 1.0, 1.0, 1.0]))


def test_minibatches_are_even_disjoint_and_cover_the_batch():
    from embodied.algorithms.batch import minibatch_indices, minibatches_per_epoch

    gen = torch.Generator().manual_seed(0)
    parts = minibatch_indices(80, 32, gen)
    assert sorted(len(p) for p in parts) == [26, 27, 27]  # not 32, 32, 16: sizes differ by one at most
    assert sorted(torch.cat(parts).tolist()) == list(range(80))  # every row once
    again = minibatch_indices(80, 32, gen)
    assert not torch.equal(torch.cat(parts), torch.cat(again))  # a fresh shuffle per epoch
    assert [len(p) for p in minibatch_indices(5, None, gen)] == [5] and minibatch_indices(0, 8, gen) == []
    assert [len(p) for p in minibatch_indices(64, 64, gen)] == [64]
    for total, size in [(80, 32), (5, None), (0, 8), (64, 64), (65, 64)]:
        assert minibatches_per_epoch(total, size) == len(minibatch_indices(total, size, gen))


def test_run_epochs_shuffles_every_epoch_and_stops_at_the_kl_target():
    from embodied.algorithms.update import run_epochs

    seen: list[list[int]] = []
    kls = iter([0.001, 0.01, 0.02, 0.2, 0.3, 0.4])

    def step(rows: torch.Tensor) -> dict[str, float]:
        seen.append(rows.tolist())
        return {
            "policy_loss": 1.0,
            "value_loss": 0.5,
            "entropy": 0.0,
            "clip_fraction": 0.1 * len(seen),
            "approx_kl": next(kls),
        }

    out = run_epochs(step, 10, epochs=3, minibatch_size=5, generator=torch.Generator().manual_seed(1))
    assert out["minibatches"] == 6 and out["epochs_run"] == 3 and out["kl_stop"] == 0
    assert out["approx_kl_first"] == 0.001 and out["clip_fraction_first"] == pytest.approx(0.1)
    assert out["approx_kl"] == pytest.approx(np.mean([0.001, 0.01, 0.02, 0.2, 0.3, 0.4]))
    for e in range(3):  # each epoch covers every row once, in its own order
        assert sorted(seen[2 * e] + seen[2 * e + 1]) == list(range(10))
    assert seen[0:2] != seen[2:4]
    seen.clear()
    kls = iter([0.001, 0.01, 0.02, 0.2, 0.3, 0.4])
    out = run_epochs(step, 10, epochs=3, minibatch_size=5, target_kl=0.05, generator=torch.Generator().manual_seed(1))
    assert out["minibatches"] == 4 and out["epochs_run"] == 2 and out["kl_stop"] == 1  # stopped after the 0.2
    assert run_epochs(step, 0, epochs=3, minibatch_size=5)["minibatches"] == 0


def test_gradient_cosine_of_the_first_epoch_and_the_noise_scale():
    """run_epochs reports the second minibatch's gradient cosine (grad_cos) only when it is the first
    epoch's second, disjoint minibatch; the noise scale inverts cos = |G|^2 / (|G|^2 + tr(Sigma) / b)."""
    from embodied.algorithms.update import gradient_noise_scale, run_epochs

    def step_reporting(values):
        it = iter(values)

        def step(rows: torch.Tensor) -> dict[str, float]:
            out = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
            cos = next(it)
            return out if cos is None else out | {"grad_cos": cos}

        return step

    out = run_epochs(step_reporting([None, 0.25, None, None]), 8, epochs=2, minibatch_size=4)
    assert out["grad_cos_first"] == 0.25
    # one minibatch per epoch: the second step trains on the same rows, no independent comparison
    assert np.isnan(run_epochs(step_reporting([None, 0.9]), 8, epochs=2, minibatch_size=None)["grad_cos_first"])
    assert np.isnan(run_epochs(step_reporting([None]), 8, epochs=1, minibatch_size=4, target_kl=-1.0)["grad_cos_first"])
    # a true gradient G with noise of total variance tr(Sigma) per row: B_noise = tr(Sigma) / |G|^2
    g = torch.zeros(400)
    g[0] = 1.0
    trace, b = 50.0, 10  # B_noise = 50: minibatches of 10 rows are mostly noise
    gen = torch.Generator().manual_seed(0)
    cos = [
        float(
            torch.nn.functional.cosine_similarity(
                g + torch.randn(400, generator=gen) * (trace / 400 / b) ** 0.5,
                g + torch.randn(400, generator=gen) * (trace / 400 / b) ** 0.5,
                dim=0,
            )
        )
        for _ in range(400)
    ]
    assert gradient_noise_scale(float(np.mean(cos)), b) == pytest.approx(trace, rel=0.15)
    assert gradient_noise_scale(1.0, b) == 0.0 and gradient_noise_scale(0.0, b) == float("inf")


def test_run_epochs_cuts_even_minibatches_whole_batches_and_stops_in_the_first_epoch():
    from embodied.algorithms.update import run_epochs

    def recorder(kls: list[float]):
        seen: list[list[int]] = []
        it = iter(kls)

        def step(rows: torch.Tensor) -> dict[str, float]:
            seen.append(rows.tolist())
            return {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": next(it)}

        return seen, step

    # 11 rows in minibatches of at most 4: sizes 4, 4, 3 (differing by one at most), every row once per epoch
    seen, step = recorder([0.0] * 6)
    out = run_epochs(step, 11, epochs=2, minibatch_size=4, generator=torch.Generator().manual_seed(0))
    assert out["minibatches"] == 6 and out["epochs_run"] == 2 and out["kl_stop"] == 0
    for e in range(2):
        epoch = seen[3 * e : 3 * e + 3]
        assert sorted(len(r) for r in epoch) == [3, 4, 4] and sorted(sum(epoch, [])) == list(range(11))
    # the same seed gives the same schedule (a resumed iteration shuffles as the original did)
    again, step = recorder([0.0] * 6)
    run_epochs(step, 11, epochs=2, minibatch_size=4, generator=torch.Generator().manual_seed(0))
    assert again == seen
    # minibatch_size=None: the whole batch, one step per epoch
    seen, step = recorder([0.0] * 3)
    out = run_epochs(step, 7, epochs=3, minibatch_size=None, generator=torch.Generator().manual_seed(0))
    assert out["minibatches"] == 3 and [sorted(r) for r in seen] == [list(range(7))] * 3
    # the first minibatch already beyond the target: one step, one epoch, kl_stop; at the target it goes on
    seen, step = recorder([0.3, 0.0, 0.0, 0.0])
    out = run_epochs(step, 8, epochs=2, minibatch_size=4, target_kl=0.1, generator=torch.Generator().manual_seed(0))
    assert (out["minibatches"], out["epochs_run"], out["kl_stop"], out["approx_kl_first"]) == (1, 1, 1, 0.3)
    seen, step = recorder([0.1, 0.1, 0.1, 0.1])
    out = run_epochs(step, 8, epochs=2, minibatch_size=4, target_kl=0.1, generator=torch.Generator().manual_seed(0))
    assert (out["minibatches"], out["epochs_run"], out["kl_stop"]) == (4, 2, 0)
    # with undo (kl_rollback) the stop calls it once; a run that never stops never does
    undone: list[int] = []
    seen, step = recorder([0.0, 0.01, 0.3, 0.0])
    out = run_epochs(
        step,
        8,
        epochs=2,
        minibatch_size=4,
        target_kl=0.1,
        generator=torch.Generator().manual_seed(0),
        undo=lambda: undone.append(len(seen)),
    )
    assert undone == [3] and (out["minibatches"], out["kl_stop"], out["kl_rollback"]) == (3, 1, 1)
    assert out["approx_kl_max"] == 0.3 and out["approx_kl"] == pytest.approx(0.31 / 3)
    seen, step = recorder([0.0] * 4)
    out = run_epochs(
        step,
        8,
        epochs=2,
        minibatch_size=4,
        target_kl=0.1,
        generator=torch.Generator().manual_seed(0),
        undo=lambda: undone.append(len(seen)),
    )
    assert undone == [3] and (out["kl_stop"], out["kl_rollback"]) == (0, 0)
