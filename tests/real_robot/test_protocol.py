"""The wire protocol (real_robot/protocol.py): openpi-client's msgpack-numpy both ways, unsafe payloads refused."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import openpi_obs as _obs

from real_robot import protocol


def test_protocol_matches_openpi_and_rejects_unsafe_payloads():
    from openpi_client import msgpack_numpy

    obs = _obs()
    back = protocol.unpackb(msgpack_numpy.packb(obs))
    assert np.array_equal(back["observation/state"], obs["observation/state"]) and back["prompt"] == obs["prompt"]
    assert np.array_equal(
        msgpack_numpy.unpackb(protocol.packb(obs))["observation/images/wrist"], obs["observation/images/wrist"]
    )
    bad = [
        b"\xc1",
        b"",
        protocol.packb({"x": 1})[:-1],
        msgpack_numpy.packb({b"__ndarray__": True, b"data": b"abc", b"dtype": "|O", b"shape": [3]}),
        msgpack_numpy.packb({b"__ndarray__": True, b"data": b"abcd", b"dtype": "<f4", b"shape": [2]}),
    ]
    for raw in bad:
        with pytest.raises(protocol.ProtocolError):
            protocol.unpackb(raw)
    with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
        protocol.unpackb(b"\x00" * 100, max_bytes=10)
