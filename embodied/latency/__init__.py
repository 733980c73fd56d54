"""Latency-aware execution (DESIGN.md, "Latency"): an action queue indexed by control step,
sync / async / real-time chunking / latency-aware execution modes, measured delay statistics, and
the delayed-env wrapper for latency-aware RL (ARLI)."""

from embodied.latency.augment import augment_state, augmented_state_dim, widen_state_input
from embodied.latency.executor import EXECUTION_MODES, ChunkExecutor, LatencyConfig, hold_action
from embodied.latency.queue import MERGE_RULES, ActionQueue
from embodied.latency.stats import LatencyStats, delay_steps

__all__ = ["EXECUTION_MODES", "MERGE_RULES", "ActionQueue", "ChunkExecutor", "LatencyConfig", "LatencyStats",
           "augment_state", "augmented_state_dim", "delay_steps", "hold_action", "widen_state_input"]
