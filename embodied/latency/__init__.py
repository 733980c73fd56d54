"""Latency-aware execution (docs/design.md, "Latency"): an action queue indexed by control step,
sync / async / real-time chunking / latency-aware execution modes, measured delay statistics, and
the delayed-env wrapper for latency-aware RL (ARLI)."""

from embodied.latency.augment import augment_state, augmented_state_dim, max_delay_of, widen_state_input
from embodied.latency.executor import (
    EXECUTION_MODES,
    ChunkExecutor,
    LatencyConfig,
    chunk_start,
    hold_action,
    wants_chunk,
)
from embodied.latency.queue import MERGE_RULES, ActionQueue
from embodied.latency.stats import LatencyStats, delay_steps

__all__ = [
    "EXECUTION_MODES",
    "MERGE_RULES",
    "ActionQueue",
    "ChunkExecutor",
    "LatencyConfig",
    "LatencyStats",
    "augment_state",
    "augmented_state_dim",
    "chunk_start",
    "delay_steps",
    "hold_action",
    "max_delay_of",
    "wants_chunk",
    "widen_state_input",
]
