"""Tiny, randomly initialised LeRobot VLAs for tests and benchmarks on a laptop, with nothing
downloaded: a word-level tokenizer built in code (a stand-in for PaliGemma's), a tiny SmolVLM folder
(config, processor, tokenizer; no weights) for SmolVLA, and pi0 / pi0.5 at the ``tiny`` size preset
(:data:`policies.lerobot.sizes.PRESETS`). The models are LeRobot's own classes at small sizes; only
their weights and vocabulary are made up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: the tiny tokenizers' words (instructions of our suites and of LIBERO); others map to <unk>
WORDS = (
    "pick put place the a up and on in of to lift can cube bowl plate red blue green black white "
    "top drawer open close turn stove basket box bottom middle cabinet next ramekin cookie mug"
).split()


def make_word_tokenizer(folder: str | os.PathLike) -> str:
    """A word-level tokenizer saved in ``folder`` (returned as a string)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )
    fast.save_pretrained(str(folder))
    return str(folder)


def make_tiny_smolvlm(folder: str | os.PathLike) -> str:
    """A tiny SmolVLM (config, processor and word-level tokenizer, no weights) saved in ``folder``: the
    VLM folder SmolVLA builds on (``lerobot_config.vlm_model_name``) when its weights are not loaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    specials = [
        "<pad>",
        "<unk>",
        "<|im_start|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
    ]
    vocab = {t: i for i, t in enumerate(specials)}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<|im_start|>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    SmolVLMConfig(
        text_config=dict(
            model_type="llama",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=len(vocab),
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            patch_size=8,
            image_size=32,
        ),
        scale_factor=2,
        image_token_id=vocab["<image>"],
        vocab_size=len(vocab),
    ).save_pretrained(str(folder))
    images = SmolVLMImageProcessor(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    SmolVLMProcessor(
        image_processor=images, tokenizer=fast, video_processor=SmolVLMVideoProcessor(), image_seq_len=4
    ).save_pretrained(str(folder))
    return str(folder)


def tiny_config(
    family: str, folder: str | os.PathLike, *, image_size: int = 32, chunk_size: int = 4, num_steps: int = 4
) -> dict[str, Any]:
    """``policies.make(family, **kwargs)`` kwargs of a tiny ``pi0`` / ``pi05`` / ``smolvla``; its
    tokenizer or VLM folder is written under ``folder`` (once)."""
    folder = Path(folder)
    common = dict(image_size=image_size, chunk_size=chunk_size, num_steps=num_steps)
    if family in ("pi0", "pi05"):
        tok = folder / "word_tokenizer"
        if not (tok / "tokenizer.json").is_file():
            make_word_tokenizer(tok)
        return dict(
            common,
            model_sizes="tiny",
            tokenizer=str(tok),
            tokenizer_max_length=48 if family == "pi05" else 12,
            lerobot_config={"max_state_dim": 16, "max_action_dim": 8},
        )
    if family == "smolvla":
        vlm = folder / "tiny_smolvlm"
        if not (vlm / "config.json").is_file():
            make_tiny_smolvlm(vlm)
        return dict(
            common,
            tokenizer_max_length=12,
            lerobot_config={"vlm_model_name": str(vlm), "max_state_dim": 16, "max_action_dim": 8, "num_vlm_layers": 4},
        )
    raise ValueError(f"no tiny config for family {family!r}; LeRobot's families: pi0, pi05, smolvla")
