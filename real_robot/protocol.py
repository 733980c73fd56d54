"""The wire format: msgpack with numpy arrays encoded as openpi does, decoded defensively.

An array travels as the map ``{b"__ndarray__": True, b"data": bytes, b"dtype": str, b"shape": [..]}``
and a numpy scalar as ``{b"__npgeneric__": True, b"data": value, b"dtype": str}`` (the encoding of
``openpi_client.msgpack_numpy``), so the public ``openpi-client`` talks to our server unmodified.

Decoding never unpickles and never trusts the peer: only plain numeric dtypes (bool, ints,
unsigned ints, floats) are accepted, the byte count must match dtype x shape, shapes are bounded,
and the message size is capped before msgpack sees it. Anything else raises :class:`ProtocolError`.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgpack
import numpy as np

ALLOWED_KINDS = "biuf"  # bool, signed / unsigned integers, floats: never object, void or complex
MAX_DIMS = 8
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class ProtocolError(ValueError):
    """A message that is not valid msgpack in our encoding."""


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    """The ``Authorization`` header a client sends (openpi's ``Api-Key <key>`` scheme)."""
    return {"Authorization": f"Api-Key {api_key}"} if api_key else None


def authorized(headers: Any, api_key: str | None) -> bool:
    """Whether request ``headers`` carry ``api_key`` (always, when no key is required); constant time."""
    if api_key is None:
        return True
    given = headers.get("Authorization", "") or ""
    return hmac.compare_digest(given.encode(), f"Api-Key {api_key}".encode())


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in ALLOWED_KINDS:
            raise ProtocolError(f"unsupported array dtype {obj.dtype}")
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in ALLOWED_KINDS:
            raise ProtocolError(f"unsupported scalar dtype {obj.dtype}")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """Encode a message (dicts, lists, str, numbers, numpy arrays and scalars)."""
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def _dtype(raw: Any) -> np.dtype:
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    if not isinstance(raw, str) or len(raw) > 8:
        raise ProtocolError("array dtype must be a short numpy dtype string such as '<f4'")
    try:
        dt = np.dtype(raw)
    except TypeError as err:
        raise ProtocolError(f"unknown array dtype {raw!r}") from err
    if dt.kind not in ALLOWED_KINDS or dt.hasobject:
        raise ProtocolError(f"array dtype {raw!r} is not allowed (numeric dtypes only)")
    return dt


def _object_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        data, shape = obj.get(b"data"), obj.get(b"shape")
        if not isinstance(data, bytes):
            raise ProtocolError("array data must be bytes")
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) > MAX_DIMS
            or not all(isinstance(s, int) and 0 <= s < 2**31 for s in shape)
        ):
            raise ProtocolError(f"array shape must be a list of at most {MAX_DIMS} non-negative ints")
        dt = _dtype(obj.get(b"dtype"))
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dt.itemsize != len(data):
            raise ProtocolError(
                f"array of shape {list(shape)} and dtype {dt.str} needs {count * dt.itemsize} bytes, got {len(data)}"
            )
        return np.frombuffer(data, dtype=dt).reshape(shape)
    if b"__npgeneric__" in obj:
        dt = _dtype(obj.get(b"dtype"))
        value = obj.get(b"data")
        if not isinstance(value, (bool, int, float)):
            raise ProtocolError("scalar data must be a number")
        try:
            return dt.type(value)
        except (OverflowError, ValueError) as err:
            raise ProtocolError(f"scalar {value!r} does not fit {dt.str}") from err
    return obj


def unpackb(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Decode a message; :class:`ProtocolError` for anything malformed, oversized or unsafe."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("expected a binary message (msgpack), got text")
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(
            bytes(data),
            object_hook=_object_hook,
            raw=False,
            strict_map_key=False,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 16,
            max_map_len=1 << 12,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except (
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        OverflowError,
    ) as err:
        raise ProtocolError(f"not a valid msgpack message: {type(err).__name__}: {err}"[:300]) from None
