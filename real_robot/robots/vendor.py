"""Lazy imports of the robot and camera vendor libraries, with one error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

#: pip package (pinned in pyproject's ``robots`` extra) of each vendor module the adapters import
PACKAGES = {
    "franky": "franky-control",
    "rtde_control": "ur-rtde",
    "rtde_receive": "ur-rtde",
    "pyrealsense2": "pyrealsense2",
}


class VendorMissing(ImportError):
    """A robot or camera library that is not installed."""


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (a vendor library ``what`` needs) or raise :class:`VendorMissing` saying
    which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = PACKAGES.get(module, module)
        raise VendorMissing(
            f"{what} needs the Python module {module!r} (pip package {package}), which is not installed: "
            f"pip install 'embodied-platform[robots]' (or pip install {package}) on the machine wired "
            f"to the hardware ({err})"
        ) from err
