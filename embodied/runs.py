"""The run folder: every output of a command (config, metrics, reports, videos) goes under ``out``."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any


def prepare_run_dir(out: str | os.PathLike) -> Path:
    """Create the run folder ``out`` (and parents); return it as an absolute path."""
    path = Path(out).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write JSON atomically: the file is complete or absent, never half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def machine_info() -> dict[str, Any]:
    """Versions and hardware recorded next to every benchmark or report."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    from importlib.metadata import PackageNotFoundError, version

    # versions from package metadata: importing mujoco here would fix its GL platform too early
    for dist in ("numpy", "torch", "mujoco"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    try:
        import torch

        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        info["cuda"] = None
    info["mujoco_gl"] = os.environ.get("MUJOCO_GL")
    return info
