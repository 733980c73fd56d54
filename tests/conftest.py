"""Test session set-up: pick MuJoCo's offscreen GL platform before any test module imports
mujoco (MuJoCo fixes its GL backend at import time). The helpers tests import (``from conftest
import compose``) and the fixtures of more than one test file live here, the only conftest.py."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sims.mujoco  # noqa: E402,F401  (selects EGL, or OSMesa where EGL is missing)


def compose(config_name: str, *overrides: str):
    """The typed config an ``embodied-*`` command builds from ``overrides``, composed in-process
    (checks of bad input without a process start-up each). Import the command's module first: it
    registers the config schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="configs", version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name=config_name, overrides=list(overrides)))


# The real_robot tests (tests/real_robot/): a tiny flow policy behind a live websocket server, and the
# openpi-style observation its clients send. Shared here rather than in a tests/real_robot/conftest.py:
# a second conftest module would shadow this one for ``from conftest import compose``.

#: the tiny flow policy those tests serve (their ``TINY``)
SERVED_TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1)


def openpi_obs(size: int = 32) -> dict:
    """One request as an openpi client sends it: state, two camera images of ``size``, prompt."""
    import numpy as np

    return {"observation/state": np.zeros(15, np.float32),
            "observation/images/agentview": np.zeros((size, size, 3), np.uint8),
            "observation/images/wrist": np.zeros((size, size, 3), np.uint8), "prompt": "lift the can"}


@pytest.fixture(scope="module")
def tiny_server():
    import torch

    import policies
    from real_robot.server import PolicyServer, ServerThread

    torch.manual_seed(0)
    server = PolicyServer(policies.make("flow", chunk_size=6, **SERVED_TINY), api_key="s3cret",
                          max_message_bytes=1 << 20)
    with ServerThread(server) as port:
        yield server, port


def _have_libero_venv() -> bool:
    import sims.libero as libero

    return libero.VENV.joinpath("bin", "python").is_file() or bool(os.environ.get(libero.PYTHON_ENV))


#: the tests that run the reference LIBERO env (or export its scenes) skip without its venv
needs_libero_venv = pytest.mark.skipif(not _have_libero_venv(), reason="the reference LIBERO venv "
                                       ".venv-libero is missing: run bash scripts/setup.sh")


@pytest.fixture(scope="session")
def libero_exported(tmp_path_factory):
    """Task 0 of libero_spatial exported by the reference venv into a fresh cache: ``(root, stdout)``
    (the LIBERO scene and controller tests; they skip without ``.venv-libero``)."""
    import subprocess

    from sims.libero import scenes

    root = tmp_path_factory.mktemp("libero_cache")
    argv, env = scenes.export_command(root, ["libero_spatial"], [0])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, proc.stdout


# The LeRobot family tests (tests/lerobot_families/, run in .venv-lerobot by scripts/test.sh): tiny, randomly
# initialised models and a tokenizer built in code (a word-level vocabulary), so nothing is downloaded.
# Here rather than in a tests/lerobot_families/conftest.py, for the reason above.

WORDS = ("pick put place the a up and on in of to lift can cube bowl plate red blue green black white "
         "top drawer open close turn stove basket box bottom middle cabinet next ramekin cookie mug").split()

def make_tokenizer(folder) -> str:
    """A word-level tokenizer saved in ``folder`` (a stand-in for PaliGemma's, which is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>",
                                   eos_token="<eos>")
    fast.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def make_smolvlm(folder) -> str:
    """A tiny SmolVLM (config, processor and word-level tokenizer, no weights) saved in ``folder``: the
    VLM folder SmolVLA builds on (``lerobot_config.vlm_model_name``) when its weights are not loaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor,
                              SmolVLMVideoProcessor)

    specials = ["<pad>", "<unk>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<|im_start|>",
                                   extra_special_tokens={"fake_image_token": "<fake_token_around_image>",
                                                         "image_token": "<image>", "global_image_token": "<global-img>",
                                                         "end_of_utterance_token": "<end_of_utterance>"})
    SmolVLMConfig(text_config=dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=len(vocab)),
                  vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     patch_size=8, image_size=32),
                  scale_factor=2, image_token_id=vocab["<image>"], vocab_size=len(vocab)).save_pretrained(str(folder))
    images = SmolVLMImageProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                   do_image_splitting=False)
    SmolVLMProcessor(image_processor=images, tokenizer=fast, video_processor=SmolVLMVideoProcessor(),
                     image_seq_len=4).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="session")
def smolvlm_dir(tmp_path_factory) -> str:
    return make_smolvlm(tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="session")
def tiny_smolvla_kwargs(smolvlm_dir) -> dict:
    return dict(image_size=32, chunk_size=4, num_steps=4, tokenizer_max_length=12,
                lerobot_config={"vlm_model_name": smolvlm_dir, "max_state_dim": 16, "max_action_dim": 8,
                                "num_vlm_layers": 4})


@pytest.fixture(scope="session")
def tiny_pi05_kwargs(tiny_pi0_kwargs) -> dict:
    return {**tiny_pi0_kwargs, "tokenizer_max_length": 48}  # the prompt holds the 15 state bins


@pytest.fixture(scope="session")
def tiny_pi0_kwargs(tokenizer_dir) -> dict:
    return dict(model_sizes="tiny", tokenizer=tokenizer_dir, image_size=32, chunk_size=4, num_steps=4,
                tokenizer_max_length=12, lerobot_config={"max_state_dim": 16, "max_action_dim": 8})
