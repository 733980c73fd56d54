"""The errors of loading and checking policies (their own module: the families' code raises them
without importing the bundle loader)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A bundle that cannot be loaded: missing, incomplete, tampered, or not safetensors."""


class SpecMismatchError(ValueError):
    """A policy whose action or observation spec does not fit an environment."""


class ConfigOverrideError(ValueError):
    """Overrides a policy's config refuses: a field it has not, or a value its validation rejects."""
