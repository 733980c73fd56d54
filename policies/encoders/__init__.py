"""Encoders of the multimodal prefix: vision over all views, language, state, fused by a transformer."""

from policies.encoders.prefix import PrefixEncoder

__all__ = ["PrefixEncoder"]
