"""The run folder: every output of a command (config, metrics, reports, videos) goes under ``out``."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import MISSING, asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from policies.files import write_atomic


def prepare_run_dir(out: str | os.PathLike) -> Path:
    """Create the run folder ``out`` (and parents); return it as an absolute path."""
    path = Path(out).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write JSON atomically: the file is complete or absent, never half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path


def config_defaults(schema: type) -> dict[str, Any]:
    """The defaults of a config dataclass as a nested dict (fields without a default left out)."""
    out: dict[str, Any] = {}
    for f in fields(schema):
        if f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
        else:
            continue
        out[f.name] = asdict(value) if is_dataclass(value) else value
    return out


def without_added_defaults(stored: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``current`` less the keys, at any depth, that ``stored`` lacks and whose value is their default in
    ``defaults``: fields added to the code after ``stored`` was written, still at their defaults."""
    out: dict[str, Any] = {}
    for key, value in current.items():
        if key not in stored:
            if key in defaults and defaults[key] == value:
                continue
            out[key] = value
        elif isinstance(value, dict) and isinstance(stored[key], dict) and isinstance(defaults.get(key), dict):
            out[key] = without_added_defaults(stored[key], value, defaults[key])
        else:
            out[key] = value
    return out


def same_config(
    stored: dict[str, Any] | None, current: dict[str, Any], schema: type, defaults: dict[str, Any] | None = None
) -> bool:
    """Whether a run folder's stored config is ``current``. A field of the dataclass ``schema`` (nested
    ones included) added after the folder was made, absent from ``stored``, matches while it keeps its
    default, so folders from before the field existed still resume. ``defaults`` adds to (or replaces)
    the schema's defaults where a field's type is not a dataclass (e.g. a config group's node)."""
    if stored is None:
        return False
    return without_added_defaults(stored, current, {**config_defaults(schema), **(defaults or {})}) == stored


def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested config dicts (a key present in one only
    counts as a difference), sorted."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix or "<root>"]
    out: list[str] = []
    for key in sorted(set(a) | set(b), key=str):
        name = f"{prefix}.{key}" if prefix else str(key)
        if key not in a or key not in b:
            out.append(name)
        else:
            out.extend(config_differences(a[key], b[key], name))
    return out


def read_complete_rows(
    path: str | os.PathLike, key: str, upto: int | None = None
) -> tuple[list[str] | None, list[dict[str, str]]]:
    """``(header, rows)`` of the CSV file ``path`` (a run's ``metrics.csv``) that a resumed run keeps.

    Each row is a dict keyed by the header. Kept: the complete rows whose integer column ``key``
    (``iteration``, ``step``) is at most ``upto`` (the checkpoint the run resumes from; ``None``:
    no bound). Dropped as torn or stale: a last line without its line terminator (a write cut by a
    crash, possibly inside its last field, so it can still parse), a row with fewer or more fields
    than the header, a row whose ``key`` is not an integer, and rows past ``upto`` (logged after the
    last checkpoint: the resumed run logs them again). A missing file, or one without a complete
    header line, gives ``(None, [])``; a file with only the header gives ``(header, [])``. Rewrite
    the file with what this returns before appending to it.
    """
    import csv
    import io

    try:
        with open(path, newline="") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None, []
    if not text.endswith(("\n", "\r")):  # the last line is torn: keep the lines before it
        cut = max(text.rfind("\n"), text.rfind("\r"))
        text = text[: cut + 1]
    lines = csv.reader(io.StringIO(text))
    header = next(lines, None)
    if not header or key not in header:
        return None, []
    at = header.index(key)
    rows = []
    for values in lines:
        if len(values) != len(header):
            continue
        try:
            value = int(values[at])
        except ValueError:
            continue
        if upto is None or value <= upto:
            rows.append(dict(zip(header, values)))
    return header, rows


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_summary(machine: dict[str, Any]) -> str:
    """``"N CPUs (model, torch kernels ISA)"`` from a :func:`machine_info` dict (older ones lack the last two)."""
    return f"{machine['cpu_count']} CPUs ({machine.get('cpu')}, torch kernels {machine.get('torch_cpu_capability')})"


def machine_info() -> dict[str, Any]:
    """Versions and hardware recorded next to every benchmark or report."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
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
        # the instruction set torch's CPU kernels use: runs on machines that differ here (e.g. AVX2 vs
        # AVX512) round differently, so the same command can train a different policy
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        info["cuda"] = None
    info["mujoco_gl"] = os.environ.get("MUJOCO_GL")
    return info


def plain_config(cfg: Any) -> dict[str, Any]:
    """A config dataclass as plain JSON values (what a run records of its configuration)."""
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
