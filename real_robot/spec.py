"""What a policy server accepts: the request spec derived from a checkpoint bundle.

A request is one observation dict (openpi style keys):

- ``observation/state``: float32 or float64 ``[S]``;
- ``observation/images/<camera>``: uint8 ``[H, W, 3]`` per camera of the bundle (any size within
  ``min_image..max_image``; the policy resizes to its own input size);
- ``prompt``: the instruction, a string (may be left out when the server has a ``default_prompt``).

The request layouts of openpi's example clients (LIBERO, DROID, ALOHA: :mod:`real_robot.openpi_layouts`)
are accepted as aliases of these keys when they fit the policy; the metadata lists them under
``request_aliases``.

The reply holds ``actions`` float32 ``[H, A]`` (the chunk, within the env action space
``action_range``, ``[-1, 1]``) and ``server_timing`` (milliseconds per stage). Every value of a
request is checked after its cast to float32 (a float64 that overflows float32 is refused, not
turned into inf), and every outgoing chunk is checked by :meth:`PolicySpec.check_actions`: a
reply never carries a non-finite or out-of-range action.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Optional

import numpy as np

STATE_KEY = "observation/state"
IMAGE_PREFIX = "observation/images/"
PROMPT_KEY = "prompt"
# optional, for real-time chunking on the server (flow policies): the queued plan from the
# observation's step on, float32 [L, A] with L <= H, and how many of its steps are frozen
RTC_PREV_KEY = "rtc/prev_actions"
RTC_FROZEN_KEY = "rtc/frozen"
RTC_KEYS = frozenset({RTC_PREV_KEY, RTC_FROZEN_KEY})


class RequestError(ValueError):
    """A request that does not match the spec; the server answers it with this message."""


@dataclass(frozen=True)
class PolicySpec:
    family: str
    action_dim: int
    chunk_size: int
    state_dim: int
    cameras: tuple[str, ...]
    image_size: int
    control_hz: float
    state_obs: str = "proprio"
    min_image: int = 16
    max_image: int = 1024
    max_prompt: int = 1000
    action_range: tuple[float, float] = (-1.0, 1.0)  # every action component lies in [low, high]
    default_prompt: Optional[str] = None  # the instruction of a request without one (openpi's ALOHA client)

    @classmethod
    def from_policy(cls, policy: Any) -> "PolicySpec":
        c = policy.config
        return cls(
            family=policy.family,
            action_dim=c.action_dim,
            chunk_size=c.chunk_size,
            state_dim=c.state_dim,
            cameras=tuple(c.cameras),
            image_size=c.image_size,
            control_hz=float(c.control_hz),
            state_obs=c.state_obs,
        )

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "PolicySpec":
        fields = {k: meta[k] for k in cls.__dataclass_fields__ if k in meta}
        fields["cameras"] = tuple(fields.get("cameras", ()))
        if "action_range" in fields:
            fields["action_range"] = tuple(float(v) for v in fields["action_range"])
        return cls(**fields)

    def metadata(self) -> dict[str, Any]:
        """Sent to every client on connect."""
        meta = asdict(self)
        meta["cameras"] = list(self.cameras)
        meta["action_range"] = list(self.action_range)
        meta["request_keys"] = [STATE_KEY, *(IMAGE_PREFIX + c for c in self.cameras), PROMPT_KEY]
        meta["request_aliases"] = {name: fit.describe() for name, fit in self._layouts[0].items()}
        return meta

    def keys(self) -> set[str]:
        return {STATE_KEY, PROMPT_KEY, *(IMAGE_PREFIX + c for c in self.cameras)}

    @cached_property
    def _layouts(self) -> tuple[dict[str, Any], dict[str, str]]:
        """openpi's client layouts this policy takes (name -> :class:`~real_robot.openpi_layouts.Fit`)
        and why it takes each of the others not (name -> reason)."""
        # imported here: the layouts load torch, and the robot's client (policy_client) reads this
        # module without it
        from real_robot.openpi_layouts import LAYOUTS, LayoutError

        fits, refused = {}, {}
        for name, layout in LAYOUTS.items():
            try:
                fits[name] = layout.fit(self.cameras, self.state_dim, self.action_dim, self.state_obs)
            except LayoutError as err:
                refused[name] = str(err)
        return fits, refused

    def _expected(self) -> str:
        """The keys a request may carry, for the errors: ours and those of each openpi layout taken."""
        fits, refused = self._layouts
        aliases = "; ".join(f"or openpi's {n} layout {list(f.layout.keys())}" for n, f in fits.items())
        none = f" (openpi's {', '.join(refused)} layouts do not fit this policy)" if refused else ""
        return f"expected {sorted(self.keys())}" + (f"; {aliases}" if aliases else "") + none

    def _own_keys(self, obs: dict) -> dict:
        """``obs`` in the policy's own keys: as it is, or read from the openpi client layout it follows."""
        from real_robot.openpi_layouts import LayoutError, recognize

        keys = set(obs) - RTC_KEYS
        layout = None if keys <= self.keys() else recognize(keys)
        if layout is None:
            return obs  # our own layout, or none: the key check names what is wrong
        fits, refused = self._layouts
        if layout.name not in fits:
            raise RequestError(
                f"the request follows openpi's {layout.name} layout ({layout.source}), which this policy does not "
                f"take: {refused[layout.name]}; {self._expected()}"
            )
        try:
            got = layout.read(
                {k: v for k, v in obs.items() if k not in RTC_KEYS},
                fits[layout.name],
                self.image_size,
                (self.min_image, self.max_image),
            )
        except LayoutError as err:
            raise RequestError(f"openpi's {layout.name} layout ({layout.source}): {err}") from None
        own = {STATE_KEY: got["state"], **{IMAGE_PREFIX + cam: img for cam, img in got["images"].items()}}
        if got["prompt"] is not None:
            own[PROMPT_KEY] = got["prompt"]
        return {**own, **{k: obs[k] for k in RTC_KEYS if k in obs}}

    def validate(self, obs: Any) -> dict[str, Any]:
        """Check a decoded request; returns ``{"rgb" [V, H, W, 3] uint8, "state" [S] float32, "prompt"}``."""
        if not isinstance(obs, dict):
            raise RequestError(f"a request must be a map of observation keys, got {type(obs).__name__}")
        obs = self._own_keys(obs)
        keys = set(obs)
        needed = self.keys() - ({PROMPT_KEY} if self.default_prompt else set())
        missing, unknown = sorted(needed - keys), sorted(map(str, keys - self.keys() - RTC_KEYS))
        if missing or unknown:
            hint = (
                "; a server started with a default_prompt takes requests without one" if PROMPT_KEY in missing else ""
            )
            raise RequestError(
                f"request keys do not match the policy: missing {missing}, unknown {unknown}; {self._expected()}{hint}"
            )
        state = obs[STATE_KEY]
        if not isinstance(state, np.ndarray) or state.dtype not in (np.float32, np.float64):
            raise RequestError(
                f"{STATE_KEY} must be a float32/float64 array, got {getattr(state, 'dtype', type(state).__name__)}"
            )
        if state.shape != (self.state_dim,):
            raise RequestError(f"{STATE_KEY} must have shape [{self.state_dim}], got {list(state.shape)}")
        state = _as_float32(state)
        if not np.isfinite(state).all():
            raise RequestError(f"{STATE_KEY} holds NaN or inf (or values beyond float32's range)")
        prompt = obs.get(PROMPT_KEY, self.default_prompt)
        if not isinstance(prompt, str) or not prompt or len(prompt) > self.max_prompt:
            raise RequestError(f"{PROMPT_KEY} must be a non-empty string of at most {self.max_prompt} characters")
        images = []
        shape = None
        for cam in self.cameras:
            key = IMAGE_PREFIX + cam
            img = obs[key]
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
                raise RequestError(f"{key} must be a uint8 array, got {getattr(img, 'dtype', type(img).__name__)}")
            if img.ndim != 3 or img.shape[2] != 3:
                raise RequestError(f"{key} must have shape [H, W, 3], got {list(img.shape)}")
            if not (
                self.min_image <= img.shape[0] <= self.max_image and self.min_image <= img.shape[1] <= self.max_image
            ):
                raise RequestError(
                    f"{key} is {img.shape[0]}x{img.shape[1]}; sizes must lie in {self.min_image}..{self.max_image}"
                )
            if shape is not None and img.shape != shape:
                raise RequestError(
                    f"all camera images must have the same size, got {list(shape)} and {list(img.shape)}"
                )
            shape = img.shape
            images.append(img)
        out = {
            "rgb": np.stack(images) if images else np.zeros((0, 1, 1, 3), np.uint8),
            "state": state,
            "prompt": prompt,
        }
        if (RTC_PREV_KEY in obs) != (RTC_FROZEN_KEY in obs):
            raise RequestError(f"real-time chunking needs both {RTC_PREV_KEY} and {RTC_FROZEN_KEY}")
        if RTC_PREV_KEY in obs:
            if self.family != "flow":
                raise RequestError(f"real-time chunking needs a flow policy; this server runs {self.family}")
            prev, frozen = obs[RTC_PREV_KEY], obs[RTC_FROZEN_KEY]
            if (
                not isinstance(prev, np.ndarray)
                or prev.dtype not in (np.float32, np.float64)
                or prev.ndim != 2
                or prev.shape[1] != self.action_dim
                or not 0 <= prev.shape[0] <= self.chunk_size
            ):
                raise RequestError(f"{RTC_PREV_KEY} must be float [L <= {self.chunk_size}, {self.action_dim}]")
            prev = _as_float32(prev)
            low, high = self.action_range
            if not np.isfinite(prev).all():
                raise RequestError(f"{RTC_PREV_KEY} holds NaN or inf (or values beyond float32's range)")
            if (prev < low).any() or (prev > high).any():
                raise RequestError(f"{RTC_PREV_KEY} holds actions outside the action range [{low}, {high}]")
            if (
                isinstance(frozen, (bool, np.bool_))
                or not isinstance(frozen, (int, np.integer))
                or not 0 <= int(frozen) <= prev.shape[0]
                or int(frozen) >= self.chunk_size
            ):
                raise RequestError(
                    f"{RTC_FROZEN_KEY} must be an int in 0..min({RTC_PREV_KEY} length "
                    f"{prev.shape[0]}, {self.chunk_size - 1})"
                )
            out["rtc"] = (prev, int(frozen))
        return out

    def check_actions(self, actions: Any) -> str | None:
        """Why a chunk must not leave the server (None when it may): not ``[H, A]``, not finite, or
        outside ``action_range``. The last check on every reply."""
        if not isinstance(actions, np.ndarray) or actions.shape != (self.chunk_size, self.action_dim):
            return (
                f"the policy returned actions of shape {list(getattr(actions, 'shape', []))}, "
                f"expected [{self.chunk_size}, {self.action_dim}]"
            )
        if actions.dtype != np.float32:
            return f"the policy returned {actions.dtype} actions, expected float32"
        if not np.isfinite(actions).all():
            return "the policy returned NaN or inf actions"
        low, high = self.action_range
        if (actions < low).any() or (actions > high).any():
            return f"the policy returned actions outside the action range [{low}, {high}]"
        return None


def _as_float32(values: np.ndarray) -> np.ndarray:
    """``values`` as float32; a float64 beyond float32's range becomes inf (refused by the caller)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float32)
