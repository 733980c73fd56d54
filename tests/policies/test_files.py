"""Atomic writes and file hashes (policies/files.py). The metrics log: tests/embodied/test_metrics_log.py."""

from __future__ import annotations

import hashlib

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
