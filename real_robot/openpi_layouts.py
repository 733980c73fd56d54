"""The request layouts of openpi's example clients, accepted as aliases of a policy's own keys.

openpi's robot clients send each robot's own keys, which openpi's server maps onto the model in a
per-robot input transform (``src/openpi/policies/<robot>_policy.py``). Our server's own layout is
``observation/state``, ``observation/images/<camera>``, ``prompt`` (:mod:`real_robot.spec`); each
layout here reads one openpi client's request into it, so that client runs unchanged:

======  ===============================  ===============================================  ============================
layout  openpi client                    images (role)                                    state
======  ===============================  ===============================================  ============================
libero  ``examples/libero/main.py``      ``observation/image`` (base),                    ``observation/state`` [8]
                                         ``observation/wrist_image`` (wrist)
droid   ``examples/droid/main.py``       ``observation/exterior_image_1_left`` (base),    ``observation/joint_position``
                                         ``observation/wrist_image_left`` (wrist)         [7] + ``gripper_position`` [1]
aloha   ``examples/aloha_real/main.py``  ``images``: ``cam_high``, ``cam_low`` (base),    ``state`` [14]
                                         ``cam_left_wrist``, ``cam_right_wrist`` (wrist)
======  ===============================  ===============================================  ============================

A layout fits a policy (its embodiment) when the policy reads the layout's state size (``proprio``),
acts in the layout's action size (libero 7, droid 8, aloha 14) and each of its cameras finds an
image: the one of the same name (``cam_high``), else the next one of its role (a camera named like
``wrist`` or ``hand`` takes a wrist image, any other a base image). Images may come ``[H, W, 3]`` or,
as ALOHA's, ``[3, H, W]``; one not of the policy's ``image_size`` is zero-padded to a square and
resized to it (openpi's ``resize_with_pad``). ALOHA's client sends no prompt: the server's
``default_prompt`` stands in (as openpi's server's).

A new layout is a registered subclass of :class:`OpenpiLayout` (:func:`register_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from sims.registry import Registry

#: camera-name words that make a policy camera a wrist view
WRIST_WORDS = ("wrist", "hand")


class LayoutError(ValueError):
    """A request in a layout's keys whose values do not fit it (the server answers with the message)."""


@dataclass(frozen=True)
class ImageSlot:
    """One image of a layout: where it lies in the request (``path``: the key, then a nested key) and
    its role, ``base`` (a scene camera) or ``wrist``."""

    path: tuple[str, ...]
    role: str

    @property
    def label(self) -> str:
        return self.path[0] + "".join(f'["{p}"]' for p in self.path[1:])

    @property
    def name(self) -> str:
        """The camera's own name, the last part of its key (``cam_high``, ``wrist_image_left``)."""
        return self.path[-1].rpartition("/")[2]


@dataclass(frozen=True)
class Fit:
    """How a layout's request becomes a policy's input: ``cameras[i]`` is the slot of the policy's i-th camera."""

    layout: "OpenpiLayout"
    cameras: tuple[tuple[str, ImageSlot], ...]

    def describe(self) -> dict[str, Any]:
        """What the server's metadata says of this alias."""
        return {
            "client": self.layout.source,
            "keys": list(self.layout.keys()),
            "cameras": {cam: slot.label for cam, slot in self.cameras},
            "state": [f"{key} [{dim}]" for key, dim in self.layout.state],
        }


def _role(camera: str) -> str:
    return "wrist" if any(w in camera.lower() for w in WRIST_WORDS) else "base"


class OpenpiLayout:
    """One openpi example client's request layout; subclasses set the class attributes."""

    name: ClassVar[str]
    source: ClassVar[str]  # the openpi file whose requests this layout reads
    images: ClassVar[tuple[ImageSlot, ...]]
    state: ClassVar[tuple[tuple[str, int], ...]]  # (key, size) of each part, concatenated in order
    action_dim: ClassVar[int]
    prompt_key: ClassVar[str] = "prompt"

    def keys(self) -> tuple[str, ...]:
        """The top-level keys this layout's client sends."""
        tops = [s.path[0] for s in self.images] + [k for k, _ in self.state] + [self.prompt_key]
        return tuple(dict.fromkeys(tops))

    @property
    def state_dim(self) -> int:
        return sum(d for _, d in self.state)

    def fit(self, cameras: Sequence[str], state_dim: int, action_dim: int, state_obs: str) -> Fit:
        """How this layout feeds a policy of these fields; :class:`LayoutError` saying why it cannot."""
        if state_obs != "proprio" or state_dim != self.state_dim or action_dim != self.action_dim:
            raise LayoutError(
                f"that client sends state [{self.state_dim}] and takes actions [H, {self.action_dim}]; the policy "
                f"reads state [{state_dim}] ({state_obs}) and gives actions [H, {action_dim}]"
            )
        free = list(self.images)
        chosen: dict[str, ImageSlot] = {}
        for cam in cameras:  # a camera of the same name first, then by role in order
            slot = next((s for s in free if s.name == cam), None)
            slot = slot or next((s for s in free if s.role == _role(cam) and s.name not in cameras), None)
            if slot is None:
                raise LayoutError(
                    f"that client sends {len(self.images)} images ({', '.join(f'{s.label} ({s.role})' for s in self.images)}); "
                    f"the policy's cameras {list(cameras)} need one {_role(cam)} image more"
                )
            free.remove(slot)
            chosen[cam] = slot
        return Fit(self, tuple((cam, chosen[cam]) for cam in cameras))

    def read(self, obs: Mapping[str, Any], fit: Fit, image_size: int, size_range: tuple[int, int]) -> dict[str, Any]:
        """``{"state": float [S], "images": {camera: uint8 [s, s, 3]}, "prompt": value or None}`` of a
        request in this layout; :class:`LayoutError` for a missing, unknown or malformed value."""
        known = set(self.keys())
        unknown = sorted(map(str, set(obs) - known))
        needed = {s.path[0] for _, s in fit.cameras} | {k for k, _ in self.state}
        missing = sorted(needed - set(obs))
        if unknown or missing:
            raise LayoutError(f"missing {missing}, unknown {unknown}")
        parts = [_state_part(obs[key], key, dim, self.name) for key, dim in self.state]
        images = {cam: self._image(obs, slot, image_size, size_range) for cam, slot in fit.cameras}
        return {"state": np.concatenate(parts), "images": images, "prompt": obs.get(self.prompt_key)}

    def _image(self, obs: Mapping[str, Any], slot: ImageSlot, size: int, size_range: tuple[int, int]) -> np.ndarray:
        value: Any = obs
        for part in slot.path:
            if not isinstance(value, Mapping) or part not in value:
                raise LayoutError(f"{slot.label} is missing")
            value = value[part]
        return fit_image(_hwc(value, slot.label), size, size_range, slot.label)


def _state_part(value: Any, key: str, dim: int, layout: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype not in (np.float32, np.float64) or value.shape != (dim,):
        got = f"{getattr(value, 'dtype', type(value).__name__)} {list(getattr(value, 'shape', []))}"
        raise LayoutError(f"{key} must be a float32/float64 array [{dim}] in openpi's {layout} layout, got {got}")
    return value


def _hwc(img: Any, label: str) -> np.ndarray:
    """``img`` as uint8 ``[H, W, 3]``; ``[3, H, W]`` (ALOHA's) is transposed."""
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3:
        got = f"{getattr(img, 'dtype', type(img).__name__)} {list(getattr(img, 'shape', []))}"
        raise LayoutError(f"{label} must be a uint8 array [H, W, 3] or [3, H, W], got {got}")
    if img.shape[2] != 3 and img.shape[0] == 3:
        img = img.transpose(1, 2, 0)
    if img.shape[2] != 3:
        raise LayoutError(f"{label} must have 3 colour channels, got shape {list(img.shape)}")
    return img


def fit_image(img: np.ndarray, size: int, size_range: tuple[int, int], label: str = "image") -> np.ndarray:
    """uint8 ``[H, W, 3]`` -> uint8 ``[size, size, 3]``: zero-padded to a square (centred), then resized
    bilinearly with antialiasing (the policies' own resize); returned as it is when already that size."""
    h, w = img.shape[:2]
    low, high = size_range
    if not (low <= h <= high and low <= w <= high):
        raise LayoutError(f"{label} is {h}x{w}; sizes must lie in {low}..{high}")
    if (h, w) == (size, size):
        return img
    side = max(h, w)
    square = np.zeros((side, side, 3), np.uint8)
    top, left = (side - h) // 2, (side - w) // 2
    square[top : top + h, left : left + w] = img
    x = torch.from_numpy(square).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


#: the registered layouts by name, in the order they are tried and listed
LAYOUTS: Registry[OpenpiLayout] = Registry("openpi layout")


def register_layout(cls: type[OpenpiLayout]) -> type[OpenpiLayout]:
    """Register an instance of ``cls`` under its ``name`` (a class decorator)."""
    LAYOUTS.register(cls.name, cls())
    return cls


@register_layout
class LiberoLayout(OpenpiLayout):
    name = "libero"
    source = "openpi examples/libero/main.py"
    images = (ImageSlot(("observation/image",), "base"), ImageSlot(("observation/wrist_image",), "wrist"))
    state = (("observation/state", 8),)
    action_dim = 7


@register_layout
class DroidLayout(OpenpiLayout):
    name = "droid"
    source = "openpi examples/droid/main.py"
    images = (
        ImageSlot(("observation/exterior_image_1_left",), "base"),
        ImageSlot(("observation/wrist_image_left",), "wrist"),
    )
    state = (("observation/joint_position", 7), ("observation/gripper_position", 1))
    action_dim = 8


@register_layout
class AlohaLayout(OpenpiLayout):
    name = "aloha"
    source = "openpi examples/aloha_real/main.py"
    images = (
        ImageSlot(("images", "cam_high"), "base"),
        ImageSlot(("images", "cam_low"), "base"),
        ImageSlot(("images", "cam_left_wrist"), "wrist"),
        ImageSlot(("images", "cam_right_wrist"), "wrist"),
    )
    state = (("state", 14),)
    action_dim = 14

    def read(self, obs: Mapping[str, Any], fit: Fit, image_size: int, size_range: tuple[int, int]) -> dict[str, Any]:
        cams = obs.get("images")
        if not isinstance(cams, Mapping):
            raise LayoutError(f"images must be a map of camera name to image, got {type(cams).__name__}")
        extra = sorted(map(str, set(cams) - {s.path[1] for s in self.images}))
        if extra:
            raise LayoutError(
                f"unknown ALOHA camera(s) {extra}; openpi's ALOHA cameras: {[s.name for s in self.images]}"
            )
        return super().read(obs, fit, image_size, size_range)


def recognize(keys: set[Any]) -> OpenpiLayout | None:
    """The registered layout whose own keys (those our layout lacks) ``keys`` holds the most of, or None."""
    ours = {"observation/state", "prompt"}
    best, score = None, 0
    for layout in LAYOUTS.values():
        hits = len(keys & (set(layout.keys()) - ours))
        if hits > score:
            best, score = layout, hits
    return best


__all__ = [
    "LAYOUTS",
    "AlohaLayout",
    "DroidLayout",
    "Fit",
    "ImageSlot",
    "LayoutError",
    "LiberoLayout",
    "OpenpiLayout",
    "fit_image",
    "recognize",
    "register_layout",
]
