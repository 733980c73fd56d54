"""embodied-sft on several processes (DDP, gloo) at tiny sizes: two real CPU ranks, under torchrun and
under ``nproc=2``, against one process over the same global batch."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import policies

BIN = Path(sys.executable).parent
# the autoregressive family's loss draws no noise and augment_shift=0 draws no shifts, so a step is a
# function of its batch alone; grad_clip is out of reach and the first step runs at the full lr
TINY = [
    "policy=autoregressive",
    "policy.d_model=32",
    "policy.image_size=32",
    "policy.vision_channels=[8,16]",
    "policy.chunk_size=3",
    "policy.prefix_layers=1",
    "augment_shift=0",
    "grad_clip=1e9",
    "warmup_steps=1",
    "lr=1e-3",
    "log_every=1",
]


def _train(*overrides: str) -> dict:
    from conftest import compose

    from embodied.runners.sft import train

    return train(compose("sft", *overrides))


def _moments(run: Path) -> dict[str, torch.Tensor]:
    """AdamW's first moments after the run's steps: after one step, 0.1 x the (averaged) gradient."""
    state = load_file(str(run / "train_state" / "state.safetensors"))
    return {k: v for k, v in state.items() if k.endswith(".exp_avg")}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Equal up to float rounding: the sums run in another order, and some gradients are rounding noise
    (a bias in front of a normalisation), so the tolerance is set by the largest moment."""
    scale = max(v.abs().max().item() for v in b.values())
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5 * scale) for k in a)


def test_two_ranks_average_gradients_write_one_run_and_resume(demos, tmp_path):
    two, cwd = tmp_path / "two", tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    args = [str(BIN / "embodied-sft"), f"data={demos}", f"out={two}", "steps=1", "batch_size=4", *TINY]
    proc = subprocess.run(torchrun + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained autoregressive for 1 steps") == 1  # rank 0 alone reports
    # one process over the same global batch (2 x 4: rank r's batch is the r-th 4 of the global draw)
    _train(f"data={demos}", f"out={tmp_path / 'one'}", "steps=1", "batch_size=8", *TINY)
    _train(f"data={demos}", f"out={tmp_path / 'half'}", "steps=1", "batch_size=4", *TINY)  # rank 0's 4 alone
    grads, full, half = _moments(two), _moments(tmp_path / "one"), _moments(tmp_path / "half")
    assert _close(grads, full), "the ranks' averaged gradient is not one process's over the global batch"
    assert not _close(grads, half)  # the test can fail: rank 0's own gradient is another one
    # Adam's first step moves each weight by lr x sign(gradient) (less where the gradient is rounding noise,
    # under its eps): a gradient of another sign would move it 2 x lr the other way
    a, b = policies.load(two / "ckpt").state_dict(), policies.load(tmp_path / "one" / "ckpt").state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=0.5e-3) for k in a)
    # rank 0 alone wrote, into the one run folder; rank 1 wrote nothing (not even Hydra's files)
    assert not any(cwd.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "half", "one", "two"]
    assert len(list((two / "tb").iterdir())) == 1 and len(list(csv.DictReader(open(two / "metrics.csv")))) == 1

    # resumed on two ranks spawned by embodied-sft itself: the loss goes down, the bundle loads
    summary = _train(f"data={demos}", f"out={two}", "steps=6", "batch_size=4", "nproc=2", "resume=true", *TINY)
    rows = list(csv.DictReader(open(two / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 7))
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]) - 0.1  # mean over both ranks' batches
    assert summary["steps"] == 6 == json.loads((two / "sft.json").read_text())["steps"]
    assert json.loads((two / "train_state" / "state.json").read_text())["step"] == 6
    assert policies.load(two / "ckpt").family == "autoregressive"


def test_nproc_errors_are_clear(demos, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        _train(f"data={demos}", f"out={tmp_path / 'a'}", "nproc=0", *TINY)
    with pytest.raises(ValueError, match="device=cpu \\(gloo\\)"):
        _train(f"data={demos}", f"out={tmp_path / 'b'}", "nproc=2", "device=meta", *TINY)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            _train(f"data={demos}", f"out={tmp_path / 'c'}", "nproc=2", "device=cuda", *TINY)
    # as torchrun leaves it for a rank: nproc must agree with its --nproc-per-node
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="leave nproc at 1"):
        _train(f"data={demos}", f"out={tmp_path / 'd'}", "nproc=3", *TINY)
    assert not any(tmp_path.iterdir())  # refused before anything was written
    monkeypatch.delenv("RANK")
    # a spawned rank's error comes back as itself, for embodied-sft to print as one line
    with pytest.raises(FileNotFoundError, match="resume=true but .* holds no checkpoint"):
        _train(f"data={demos}", f"out={tmp_path / 'e'}", "nproc=2", "resume=true", *TINY)
