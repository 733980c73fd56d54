"""Configuration of the autoregressive (OpenVLA-style) action-token policy."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import PolicyConfig


@dataclass
class AutoregressiveConfig(PolicyConfig):
    """:class:`~policies.base.PolicyConfig` plus the action-token decoder.

    Every action dimension is discretised into ``num_bins`` uniform bins over the env action space
    ``[-1, 1]`` (not over the dataset-normalised space: the Processor's action statistics are not
    used by this family). A chunk is ``chunk_size * action_dim`` tokens decoded one by one.

    ``value_features`` (inherited, default ``"detached"``): the critic reads the detached fused
    state token and pooled prefix plus ``obs["time_left"]``, as the flow policy's. With
    ``"shared"`` (bundles written before the field existed) ``value_head`` places it: ``"expert"``
    on the decoder's hidden state at the BOS position (it sees only the prefix, so it is a state
    value), ``"prefix"`` on the mean of the prefix tokens.
    """

    # bins per action dimension; uniform over [-1, 1], tokens are bin indices 0..num_bins-1
    num_bins: int = 256
    # causal transformer layers of the action-token decoder (self-attn, cross-attn, MLP each)
    decoder_layers: int = 2
    # attention heads of the decoder; must divide d_model
    decoder_heads: int = 4
    # hidden width of the decoder MLP, as a multiple of d_model
    decoder_mlp_ratio: int = 4
    # exploration temperature: sample() draws from softmax(logits / temperature) and logprob() scores
    # under that same scaled distribution (so PPO ratios are exact); greedy mode ignores it
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.num_bins < 2:
            raise ValueError(f"num_bins must be >= 2, got {self.num_bins}")
        if self.decoder_layers < 1:
            raise ValueError(f"decoder_layers must be >= 1, got {self.decoder_layers}")
        if self.decoder_heads < 1 or self.d_model % self.decoder_heads:
            raise ValueError(f"decoder_heads ({self.decoder_heads}) must divide d_model ({self.d_model})")
        if not self.temperature > 0.0:
            raise ValueError(f"temperature must be > 0 (use mode='greedy' for argmax), got {self.temperature}")
        if self.chunk_size < 1 or self.action_dim < 1:
            raise ValueError(f"chunk_size and action_dim must be >= 1, got {self.chunk_size}, {self.action_dim}")
        self.check_value_fields()
