"""The CNN view encoder and its spatial-softmax keypoint readout (policies/encoders/vision.py). The
random-shift augmentation: tests/embodied/test_augment.py."""

from __future__ import annotations

import pytest
import torch

import policies
from policies.encoders.vision import SpatialKeypoints, ViewEncoder


def test_keypoints_locate_a_bright_spot():
    kp = SpatialKeypoints(channels=1, num_keypoints=1, d_model=4)
    with torch.no_grad():
        kp.attend.weight.fill_(1.0)
        kp.attend.bias.zero_()
        kp.log_temperature.fill_(-3.0)  # sharp softmax
    feat = torch.zeros(2, 1, 8, 8)
    feat[0, 0, 1, 6] = 5.0  # row 1, column 6
    feat[1, 0, 7, 0] = 5.0
    captured = {}
    kp.pos.register_forward_hook(lambda m, inp, out: captured.update(xy=inp[0]))
    kp(feat)
    xy = captured["xy"][:, 0]  # [B, 2] expected (x, y) in [-1, 1]
    grid = torch.linspace(-1, 1, 8)
    assert torch.allclose(xy[0], torch.stack([grid[6], grid[1]]), atol=1e-3)
    assert torch.allclose(xy[1], torch.stack([grid[0], grid[7]]), atol=1e-3)


def test_view_encoder_adds_keypoint_tokens_and_old_bundles_keep_their_keys(tmp_path):
    plain = ViewEncoder([8, 16], d_model=32, num_views=2)
    with_kp = ViewEncoder([8, 16], d_model=32, num_views=2, keypoints=5)
    images = torch.rand(3, 2, 3, 32, 32) * 2 - 1
    assert plain(images).shape == (3, 2 * 16, 32)
    assert with_kp(images).shape == (3, 2 * (16 + 5), 32)
    # the conv stack's parameter names are unchanged, so bundles saved before keypoints existed load
    assert {k for k in plain.state_dict() if k.startswith("cnn.")} == {
        k for k in with_kp.state_dict() if k.startswith("cnn.")
    }
    with pytest.raises(ValueError, match="vision_keypoints"):
        ViewEncoder([8], d_model=8, num_views=1, keypoints=-1)

    policy = policies.make(
        "flow", d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, vision_keypoints=4
    )
    obs = {
        "rgb": torch.randint(0, 255, (2, 2, 32, 32, 3), dtype=torch.uint8),
        "state": torch.randn(2, 15),
        "instruction": ["pick up the cube"] * 2,
    }
    loss = policy.sft_loss(obs, torch.rand(2, 3, 7) * 2 - 1)
    loss.backward()
    assert policy.prefix.vision.keypoints.attend.weight.grad is not None
    from policies.checkpoint import save

    save(policy, tmp_path / "b")
    loaded = policies.load(tmp_path / "b")
    assert loaded.config.vision_keypoints == 4
    torch.manual_seed(0)
    a = policy.eval().sample(obs, mode="greedy").actions
    torch.manual_seed(0)
    b = loaded.sample(obs, mode="greedy").actions
    assert torch.allclose(a, b)
