"""Confidence intervals for success rates, as pure functions."""

from __future__ import annotations

import math
from typing import Sequence


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% (by default) Wilson score interval of a binomial proportion; ``(0, 1)`` for no trials."""
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float, float]:
    """Difference ``p1 - p2`` of two proportions with Newcombe's hybrid score 95% interval.

    Returns ``(difference, low, high)``.
    """
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return d, max(-1.0, low), min(1.0, high)


def paired_difference_interval(
    now: Sequence[float], before: Sequence[float], z: float = 1.959963984540054
) -> tuple[float, float, float]:
    """Mean of ``now[i] - before[i]`` over paired units (two policies' success rates on the same initial
    states, each over its attempts there) with a 95% normal interval from the spread of the
    differences (its standard error over the units; apt from ~30 units on).

    Pairing removes what the states themselves contribute (a hard state is hard for both policies),
    so it is tighter than :func:`difference_interval` on the pooled episodes when the policies agree
    on which states are hard. Returns ``(difference, low, high)``; ``(d, -1, 1)`` under two units.
    """
    if len(now) != len(before):
        raise ValueError(f"paired rates need the same units: {len(now)} now, {len(before)} before")
    n = len(now)
    if n == 0:
        return 0.0, -1.0, 1.0
    diffs = [a - b for a, b in zip(now, before)]
    d = sum(diffs) / n
    if n < 2:
        return d, -1.0, 1.0
    se = math.sqrt(sum((x - d) ** 2 for x in diffs) / (n - 1) / n)
    return d, max(-1.0, d - z * se), min(1.0, d + z * se)


def pass_at_k(attempts: int, successes: int, k: int) -> float:
    """Probability that at least one of ``k`` attempts drawn without replacement from ``attempts``
    recorded ones (``successes`` of them successful) succeeds: the unbiased pass@k estimator of Chen
    et al. (2021), ``1 - C(n - c, k) / C(n, k)``."""
    if not 1 <= k <= attempts:
        raise ValueError(f"k must be in [1, {attempts}] (the recorded attempts), got {k}")
    if not 0 <= successes <= attempts:
        raise ValueError(f"successes must be in [0, {attempts}], got {successes}")
    return 1.0 - math.comb(attempts - successes, k) / math.comb(attempts, k)
