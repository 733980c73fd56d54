"""Autoregressive action-token VLA (OpenVLA-style).

Model
    The :class:`~policies.encoders.prefix.PrefixEncoder` turns the observation into prefix tokens
    ``[N, T, d]`` (+ pad mask ``[N, T]``), once per chunk. A small causal transformer decoder then
    models the chunk as ``L = H * A`` action tokens (time-major: token ``i`` is step ``i // A``,
    dimension ``i % A``). Its input at position ``i`` is BOS (``i = 0``) or token ``i - 1``, plus a
    learned position embedding (``L`` positions) and an embedding of the action dimension
    ``i % A`` that position ``i`` predicts. Each pre-norm layer has causal self-attention,
    cross-attention to the prefix (padding masked) and an MLP; a linear head gives logits over
    ``num_bins`` bins.

Tokens
    Bins are uniform over the env action space ``[-1, 1]`` (see
    :mod:`policies.autoregressive.tokenization`), decoded to bin centers. The Processor's action
    statistics are deliberately **not** used by this family: binning the raw env action keeps the
    token vocabulary tied to the robot's action space and independent of dataset statistics.
    State normalisation, image and text preprocessing still go through the Processor.

Decoding
    ``sample`` decodes the ``L`` tokens one at a time with a KV cache: each layer caches its
    self-attention keys/values, and the cross-attention keys/values over the prefix are computed
    once per chunk, so a chunk costs ``L`` single-token passes through the decoder.

Log-probabilities (RL)
    ``sample(mode="explore")`` draws each token from ``softmax(logits / temperature)`` with
    ``temperature = config.temperature``; ``logprob`` scores tokens under that *same*
    temperature-scaled distribution and reports its entropy. The log-probability is thus the one of
    the distribution actually sampled from, and PPO ratios are exact (do not change
    ``config.temperature`` between collecting and training). The chunk log-probability is the sum
    of the ``L`` token log-probabilities. Greedy mode takes the argmax and returns ``logprob = 0``
    (the :class:`~policies.base.ChunkSample` contract).

Value
    ``value_features="detached"`` (default): a :class:`~policies.base.DetachedValueHead` on the
    detached fused state token and pooled prefix plus ``obs["time_left"]`` (1.0 when absent), as
    the flow policy's; the value loss moves neither the encoder nor the decoder. With
    ``value_features="shared"`` (bundles written before the field), ``value_head`` places it:
    ``value_head="expert"``: an MLP on the decoder's final hidden state at the BOS position. With
    causal attention that position sees only BOS and the prefix, so it is a state value ``V(s)``
    that does not depend on the sampled chunk (the hidden state of the last decoded position would
    see the sampled tokens and leak the action into the critic). ``value_head="prefix"``: the same
    MLP on the mean of the non-padding prefix tokens (pi_0.5 placement).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.autoregressive.configuration_autoregressive import AutoregressiveConfig
from policies.autoregressive.tokenization import actions_to_bins, bins_to_actions
from policies.base import ENCODED, ChunkSample, DetachedValueHead, Mode, Policy, obs_time_left
from policies.encoders.prefix import PrefixEncoder

KVCache = list[dict[str, torch.Tensor]]


def sample_categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws ``[N]`` from ``probs [N, K]`` (rows sum to 1) with uniforms ``u [N, 1]`` in
    [0, 1): index k is drawn when ``cdf[k-1] <= u < cdf[k]``."""
    cdf = probs.cumsum(dim=-1)
    return (cdf <= u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: causal self-attention (KV cache), cross-attention to the prefix, MLP."""

    def __init__(self, d_model: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.norm_self = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_self = nn.Linear(d_model, d_model)
        self.norm_cross = nn.LayerNorm(d_model)
        self.q_cross = nn.Linear(d_model, d_model)
        self.kv_cross = nn.Linear(d_model, 2 * d_model)
        self.out_cross = nn.Linear(d_model, d_model)
        self.norm_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model)
        )

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, S, d]`` -> ``[N, heads, S, head_dim]``."""
        n, s, _ = x.shape
        return x.view(n, s, self.heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, heads, S, head_dim]`` -> ``[N, S, d]``."""
        n, _, s, _ = x.shape
        return x.transpose(1, 2).reshape(n, s, self.heads * self.head_dim)

    def cross_kv(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values over prefix tokens ``[N, T, d]``: two ``[N, heads, T, hd]``."""
        k, v = self.kv_cross(prefix).chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def forward(
        self,
        x: torch.Tensor,
        cross: tuple[torch.Tensor, torch.Tensor],
        cross_mask: torch.Tensor,
        cache: dict[str, torch.Tensor] | None = None,
        pos: int = 0,
    ) -> torch.Tensor:
        """One layer.

        Args:
            x: ``[N, S, d]`` hidden states of positions ``pos .. pos + S - 1``.
            cross: cross-attention ``(k, v)``, each ``[N, heads, T, hd]`` (see :meth:`cross_kv`).
            cross_mask: bool ``[N, 1, 1, T]``, True where a prefix token may be attended to.
            cache: ``None`` for a full causal pass over ``x`` (then ``pos`` must be 0); else this
                layer's ``{"k", "v"}`` buffers ``[N, heads, L, hd]``: the new keys/values are written
                at ``pos .. pos + S - 1`` and ``x`` attends to positions ``0 .. pos + S - 1``.
            pos: position of ``x``'s first row (cached mode).

        Returns:
            ``[N, S, d]``.
        """
        s = x.shape[1]
        q, k, v = (self._split(t) for t in self.qkv(self.norm_self(x)).chunk(3, dim=-1))
        if cache is None:
            if pos != 0:
                raise ValueError("a full pass without a cache must start at position 0")
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            cache["k"][:, :, pos : pos + s] = k
            cache["v"][:, :, pos : pos + s] = v
            keys, values = cache["k"][:, :, : pos + s], cache["v"][:, :, : pos + s]
            mask = None
            if s > 1:  # several new positions: causal among them, all earlier positions visible
                mask = torch.ones(s, pos + s, dtype=torch.bool, device=x.device).tril(diagonal=pos)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.out_self(self._merge(att))
        qc = self._split(self.q_cross(self.norm_cross(x)))
        att = F.scaled_dot_product_attention(qc, cross[0], cross[1], attn_mask=cross_mask)
        x = x + self.out_cross(self._merge(att))
        return x + self.mlp(self.norm_mlp(x))


class AutoregressivePolicy(Policy):
    """OpenVLA-style VLA: prefix encoder + causal action-token decoder with a KV cache.

    See the module docstring for tokens, temperature, log-probabilities and the value head.
    ``extras`` of a sample: ``{"tokens": int64 [N, H * A]}``.
    """

    family = "autoregressive"
    config_class = AutoregressiveConfig
    config: AutoregressiveConfig

    def __init__(self, config: AutoregressiveConfig):
        if not isinstance(config, AutoregressiveConfig):
            raise TypeError(f"AutoregressivePolicy needs an AutoregressiveConfig, got {type(config).__name__}")
        super().__init__(config)
        d = config.d_model
        self.num_tokens = config.chunk_size * config.action_dim  # L
        self.bos = config.num_bins  # the extra input token id
        self.prefix = PrefixEncoder(config)
        self.token_emb = nn.Embedding(config.num_bins + 1, d)
        self.pos_emb = nn.Parameter(torch.randn(self.num_tokens, d) * 0.02)
        self.dim_emb = nn.Embedding(config.action_dim, d)
        self.layers = nn.ModuleList(
            DecoderLayer(d, config.decoder_heads, config.decoder_mlp_ratio) for _ in range(config.decoder_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.num_bins)
        self.value_mlp = self._make_value_head()
        nn.init.normal_(self.token_emb.weight, std=0.02)
        nn.init.normal_(self.dim_emb.weight, std=0.02)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("_dims", torch.arange(self.num_tokens) % config.action_dim, persistent=False)

    # ------------------------------------------------------------------ building blocks
    def encode(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Observation batch -> ``(prefix tokens [N, T, d], pad [N, T])`` (True = padding)."""
        if not isinstance(obs, dict):
            raise TypeError(f"obs must be a dict with rgb, state and instruction, got {type(obs).__name__}")
        if ENCODED in obs:  # computed earlier for these observations (a frozen encoder's, see Policy.frozen_prefix)
            return obs[ENCODED]
        return self.prefix(self.processor.prepare(obs, self.device))

    def _cross(
        self, prefix: torch.Tensor, pad: torch.Tensor
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per-layer cross ``(k, v)`` over the prefix and the attend mask ``[N, 1, 1, T]``."""
        return [layer.cross_kv(prefix) for layer in self.layers], (~pad)[:, None, None, :]

    def _embed(self, inputs: torch.Tensor, start: int) -> torch.Tensor:
        """Input token ids ``[N, S]`` at positions ``start .. start + S - 1`` -> ``[N, S, d]``."""
        s = inputs.shape[1]
        return self.token_emb(inputs) + self.pos_emb[start : start + s] + self.dim_emb(self._dims[start : start + s])

    def _make_value_head(self) -> nn.Module:
        c = self.config
        if c.value_features == "detached":
            return DetachedValueHead(2 * c.d_model, c.value_hidden)
        return nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.GELU(), nn.Linear(c.d_model, 1))

    def _value(
        self, bos_hidden: torch.Tensor | None, prefix: torch.Tensor, pad: torch.Tensor, time_left: torch.Tensor
    ) -> torch.Tensor:
        """Critic ``[N]``: ``detached``, from the detached state token and pooled prefix and
        ``time_left [N]``; ``shared``, from the BOS position's hidden state ``[N, d]`` or the pooled prefix."""
        if self.config.value_features == "detached":
            feats = torch.cat([prefix[:, -1], PrefixEncoder.pooled(prefix, pad)], dim=1)
            return self.value_mlp(feats, time_left)  # the head detaches its input
        feat = bos_hidden if self.config.value_head == "expert" else PrefixEncoder.pooled(prefix, pad)
        return self.value_mlp(feat).squeeze(-1)

    def decode_teacher_forced(
        self, prefix: torch.Tensor, pad: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over a whole token sequence.

        Args:
            prefix: ``[N, T, d]``; pad: bool ``[N, T]``.
            tokens: int64 ``[N, L]``, the chunk's tokens (the last one is only a target).

        Returns:
            ``(logits [N, L, num_bins], hidden [N, L, d])``: position ``i`` predicts token ``i``.
        """
        n = tokens.shape[0]
        bos = torch.full((n, 1), self.bos, dtype=torch.long, device=tokens.device)
        x = self._embed(torch.cat([bos, tokens[:, :-1]], dim=1), 0)
        cross, mask = self._cross(prefix, pad)
        for layer, kv in zip(self.layers, cross):
            x = layer(x, kv, mask)
        h = self.norm(x)
        return self.head(h), h

    def _pick(self, logits: torch.Tensor, mode: Mode, generator: torch.Generator | None) -> torch.Tensor:
        """Next tokens ``[N]`` from logits ``[N, num_bins]``."""
        if mode == "greedy":
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.config.temperature, dim=-1)
        if generator is not None and generator.device.type != probs.device.type:
            # a generator on another device (a CPU one for a CUDA policy): draw the uniforms there
            u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=generator.device)
            return sample_categorical(probs, u.to(probs.device))
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    @torch.no_grad()
    def generate(
        self,
        obs: dict[str, Any],
        *,
        mode: Mode = "explore",
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Decode a chunk's tokens one by one.

        Args:
            obs: observation batch (``rgb``, ``state``, ``instruction``).
            mode: ``"explore"`` samples at ``config.temperature``; ``"greedy"`` takes the argmax.
            generator: random source for ``"explore"`` (on any device).
            use_cache: True (default) decodes with the KV cache, ``L`` single-token decoder passes;
                False recomputes the whole sequence at every step (``O(L^2)``, a reference for tests).

        Returns:
            ``{"tokens": int64 [N, L], "logits": [N, L, num_bins] (unscaled), "hidden": [N, L, d],
            "value": [N]}``.
        """
        if mode not in ("explore", "greedy"):
            raise ValueError(f"mode must be 'explore' or 'greedy', got {mode!r}")
        prefix, pad = self.encode(obs)
        n, big_l, d = prefix.shape[0], self.num_tokens, self.config.d_model
        dev = prefix.device
        tokens = torch.empty(n, big_l, dtype=torch.long, device=dev)
        logits_all = torch.empty(n, big_l, self.config.num_bins, dtype=prefix.dtype, device=dev)
        hidden_all = torch.empty(n, big_l, d, dtype=prefix.dtype, device=dev)
        if not use_cache:
            for i in range(big_l):
                logits, hidden = self.decode_teacher_forced(prefix, pad, tokens[:, : i + 1])  # token i is unused
                logits_all[:, i], hidden_all[:, i] = logits[:, i], hidden[:, i]
                tokens[:, i] = self._pick(logits[:, i], mode, generator)
        else:
            cross, mask = self._cross(prefix, pad)
            hd = d // self.config.decoder_heads
            caches: KVCache = [
                {
                    k: torch.empty(n, self.config.decoder_heads, big_l, hd, dtype=prefix.dtype, device=dev)
                    for k in ("k", "v")
                }
                for _ in self.layers
            ]
            inp = torch.full((n, 1), self.bos, dtype=torch.long, device=dev)
            for i in range(big_l):
                x = self._embed(inp, i)
                for layer, kv, cache in zip(self.layers, cross, caches):
                    x = layer(x, kv, mask, cache=cache, pos=i)
                h = self.norm(x[:, 0])
                logits = self.head(h)
                logits_all[:, i], hidden_all[:, i] = logits, h
                tokens[:, i] = self._pick(logits, mode, generator)
                inp = tokens[:, i : i + 1]
        return {
            "tokens": tokens,
            "logits": logits_all,
            "hidden": hidden_all,
            "value": self._value(hidden_all[:, 0], prefix, pad, obs_time_left(obs, n, dev)),
        }

    def _token_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token ``(logprob [N, L], entropy [N, L])`` under ``softmax(logits / temperature)``."""
        logp = torch.log_softmax(logits.float() / self.config.temperature, dim=-1)
        tok_logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return tok_logp, entropy

    def tokens_to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """int64 ``[N, H * A]`` -> bin-center actions ``[N, H, A]``."""
        return bins_to_actions(tokens, self.config.num_bins).view(-1, self.chunk_size, self.action_dim)

    def actions_to_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[N, H, A]`` in ``[-1, 1]`` -> int64 tokens ``[N, H * A]``."""
        if actions.ndim != 3 or tuple(actions.shape[1:]) != (self.chunk_size, self.action_dim):
            raise ValueError(f"actions must be [N, {self.chunk_size}, {self.action_dim}], got {tuple(actions.shape)}")
        return actions_to_bins(actions, self.config.num_bins).flatten(1)

    # ------------------------------------------------------------------ the Policy contract
    def sample(
        self, obs: dict[str, Any], *, mode: Mode = "explore", generator: torch.Generator | None = None
    ) -> ChunkSample:
        """Decode a chunk with the KV cache (no gradients; use :meth:`logprob` to train).

        Returns:
            ``ChunkSample(actions [N, H, A] bin centers, logprob [N] (sum of the ``H * A`` token
            log-probs under ``softmax(logits / temperature)``; 0 in greedy mode), value [N],
            extras {"tokens": int64 [N, H * A]})``.
        """
        out = self.generate(obs, mode=mode, generator=generator)
        tokens = out["tokens"]
        if mode == "greedy":
            logprob = torch.zeros(tokens.shape[0], device=tokens.device)
        else:
            logprob = self._token_logprobs(out["logits"], tokens)[0].sum(-1)
        return ChunkSample(
            actions=self.tokens_to_actions(tokens),
            logprob=logprob,
            value=out["value"].float(),
            extras={"tokens": tokens},
        )

    def logprob(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced single causal pass over ``extras["tokens"]`` ``[N, H * A]``.

        Returns:
            ``(logprob [N], entropy [N], value [N])``: sums over the ``H * A`` tokens of the token
            log-probabilities and of the entropies of the temperature-scaled categoricals.
        """
        if "tokens" not in extras:
            raise KeyError(f"extras must hold 'tokens' (from sample()), got keys {sorted(extras)}")
        prefix, pad = self.encode(obs)
        tokens = extras["tokens"].to(prefix.device).long()
        n = prefix.shape[0]
        if tuple(tokens.shape) != (n, self.num_tokens):
            raise ValueError(f"extras['tokens'] must be [{n}, {self.num_tokens}] (N, H*A), got {tuple(tokens.shape)}")
        if bool(((tokens < 0) | (tokens >= self.config.num_bins)).any()):
            raise ValueError(f"extras['tokens'] must be bin indices in [0, {self.config.num_bins})")
        logits, hidden = self.decode_teacher_forced(prefix, pad, tokens)
        tok_logp, entropy = self._token_logprobs(logits, tokens)
        value = self._value(hidden[:, 0], prefix, pad, obs_time_left(obs, n, prefix.device))
        return tok_logp.sum(-1), entropy.sum(-1), value.float()

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        """Critic value ``[N]``: the BOS position sees only the prefix, so one position suffices."""
        prefix, pad = self.encode(obs)
        time_left = obs_time_left(obs, prefix.shape[0], prefix.device)
        if self.config.value_features == "detached":  # the decoder takes no part
            return self._value(None, prefix, pad, time_left).float()
        dummy = torch.zeros(prefix.shape[0], 1, dtype=torch.long, device=prefix.device)
        _, hidden = self.decode_teacher_forced(prefix, pad, dummy)
        return self._value(hidden[:, 0], prefix, pad, time_left).float()

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy (at temperature 1) of the binned expert chunk ``[N, H, A]``, teacher forced."""
        prefix, pad = self.encode(obs)
        tokens = self.actions_to_tokens(actions.to(prefix.device))
        if tokens.shape[0] != prefix.shape[0]:
            raise ValueError(f"{tokens.shape[0]} action chunks for a batch of {prefix.shape[0]} observations")
        logits, _ = self.decode_teacher_forced(prefix, pad, tokens)
        return F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())

    def max_entropy(self) -> float:
        """Upper bound of :meth:`logprob`'s entropy: ``H * A * log(num_bins)``."""
        return self.num_tokens * math.log(self.config.num_bins)
