"""Atomic writes and file hashes (policies/files.py). The metrics log: tests/embodied/test_metrics_log.py."""

from __future__ import annotations

import hashlib
import os

import pytest

from policies.files import atomic_path, sha256_file, write_atomic


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "a.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert sha256_file(path) == hashlib.sha256(b"new").hexdigest()


def test_atomic_write_flushes_the_file_then_its_folder(tmp_path, monkeypatch):
    """After a power loss the rename must be on disk too: the folder is flushed after the file is renamed."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = write_atomic(tmp_path / "state.json", "{}")
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / ".state.json."))
    assert synced[1] == str(tmp_path) and path.read_text() == "{}"


def test_folder_swap_flushes_every_file_before_the_rename(tmp_path, monkeypatch):
    from embodied.train_state import resolve_folder, swap_in_folder

    tmp = tmp_path / "ckpt.tmp"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "a.bin").write_bytes(b"a")
    (tmp / "sub" / "b.bin").write_bytes(b"b")
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.path.realpath(f"/proc/self/fd/{fd}")), real_fsync(fd))[1]
    )
    final = swap_in_folder(tmp, tmp_path / "ckpt")
    assert {str(tmp / "a.bin"), str(tmp / "sub" / "b.bin"), str(tmp / "sub"), str(tmp)} <= set(synced[:-1])
    assert synced[-1] == str(tmp_path)  # the rename itself
    assert resolve_folder(tmp_path / "ckpt") == final and (final / "sub" / "b.bin").read_bytes() == b"b"
