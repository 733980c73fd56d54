"""Quantile normalisation (LeRobot's ``QUANTILES`` mode, pi0.5's default): states and actions are
mapped by their 1st and 99th percentiles onto [-1, 1], ``2 * (x - q01) / (q99 - q01) - 1``, as
LeRobot's normaliser does (a zero range becomes 1e-8, as there). pi0.5 discretises the normalised state
into its prompt, which assumes that range."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from policies.processor import Processor

QUANTILE_KEYS = ("state_q01", "state_q99", "action_q01", "action_q99")
EPS = 1e-8


class QuantileProcessor(Processor):
    """:class:`~policies.processor.Processor` whose state and action maps use q01/q99 (the mean/std
    statistics are kept too: the value head and the reports read them)."""

    def set_stats(self, stats: dict[str, Sequence[float]] | None) -> None:
        stats = dict(stats or {})
        super().set_stats({k: v for k, v in stats.items() if k not in QUANTILE_KEYS})
        s, a = self.config.state_dim, self.config.action_dim
        defaults = {"state_q01": [-1.0] * s, "state_q99": [1.0] * s, "action_q01": [-1.0] * a, "action_q99": [1.0] * a}
        for key, default in defaults.items():
            values = [float(v) for v in stats.get(key, default)]
            if len(values) != len(default):
                raise ValueError(f"stats[{key!r}] has {len(values)} values, the policy expects {len(default)}")
            self.stats[key] = values
            self._t[key] = torch.tensor(values, dtype=torch.float32)

    @staticmethod
    def stats_from_arrays(states: np.ndarray, actions: np.ndarray) -> dict[str, list[float]]:
        stats = Processor.stats_from_arrays(states, actions)
        stats.update(
            {
                "state_q01": np.quantile(states, 0.01, axis=0).tolist(),
                "state_q99": np.quantile(states, 0.99, axis=0).tolist(),
                "action_q01": np.quantile(actions, 0.01, axis=0).tolist(),
                "action_q99": np.quantile(actions, 0.99, axis=0).tolist(),
            }
        )
        return stats

    def _range(self, kind: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        q01, q99 = self._stat(f"{kind}_q01", device), self._stat(f"{kind}_q99", device)
        denom = q99 - q01
        return q01, torch.where(denom == 0, torch.full_like(denom, EPS), denom)

    def state(self, state: torch.Tensor, device: torch.device) -> torch.Tensor:
        if state.shape[-1] != self.config.state_dim:
            raise ValueError(f"state has {state.shape[-1]} dims, the policy expects {self.config.state_dim}")
        q01, denom = self._range("state", device)
        return 2.0 * (state.to(device).float() - q01) / denom - 1.0

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        q01, denom = self._range("action", actions.device)
        return 2.0 * (actions.float() - q01) / denom - 1.0

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        q01, denom = self._range("action", actions.device)
        return ((actions + 1.0) * denom / 2.0 + q01).clamp(-1.0, 1.0)
