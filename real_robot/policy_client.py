"""A blocking client of ``embodied-serve`` (the same protocol as ``openpi-client``), with timeouts."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from real_robot import protocol
from real_robot.spec import PolicySpec


class ServerError(RuntimeError):
    """The server answered a request with an error message."""


class PolicyClient:
    def __init__(self, uri: str, api_key: Optional[str] = None, timeout: float = 10.0,
                 max_message_bytes: int = protocol.DEFAULT_MAX_BYTES):
        self.uri = uri if uri.startswith("ws") else f"ws://{uri}"
        self.api_key, self.timeout, self.max_message_bytes = api_key, timeout, max_message_bytes
        self._ws: Any = None
        self.metadata: dict[str, Any] = {}
        self.spec: Optional[PolicySpec] = None

    def connect(self) -> PolicySpec:
        """Open the connection and read the server's metadata (the policy's spec)."""
        from websockets.sync.client import connect

        try:
            self._ws = connect(self.uri, compression=None, max_size=self.max_message_bytes,
                               additional_headers=protocol.auth_headers(self.api_key), open_timeout=self.timeout)
        except Exception as err:
            raise ConnectionError(f"cannot connect to the policy server at {self.uri}: {err}") from None
        self.metadata = protocol.unpackb(self._ws.recv(timeout=self.timeout), self.max_message_bytes)
        self.spec = PolicySpec.from_metadata(self.metadata)
        return self.spec

    def infer(self, obs: dict[str, Any], timeout: Optional[float] = None) -> tuple[np.ndarray, dict[str, Any]]:
        """The chunk ``[H, A]`` and the server timing for one observation dict."""
        if self._ws is None:
            raise ConnectionError("not connected: call connect() first")
        try:
            self._ws.send(protocol.packb(obs))
            reply = self._ws.recv(timeout=self.timeout if timeout is None else timeout)
        except TimeoutError:
            raise
        except Exception as err:
            raise ConnectionError(f"lost the policy server at {self.uri}: {err}") from None
        if isinstance(reply, str):
            raise ServerError(reply)
        msg = protocol.unpackb(reply, self.max_message_bytes)
        actions = msg.get("actions") if isinstance(msg, dict) else None
        # the server checks every chunk it sends; a client trusts no peer all the same
        problem = (self.spec.check_actions(actions) if self.spec is not None else None) if \
            isinstance(actions, np.ndarray) else "the reply holds no actions array"
        if problem is not None:
            raise ServerError(f"refused the server's reply: {problem}")
        return actions.copy(), dict(msg.get("server_timing", {}))

    def alive(self) -> bool:
        """Whether the connection is open (a server that died is noticed without a request)."""
        if self._ws is None:
            return False
        from websockets.protocol import State

        return self._ws.protocol.state is State.OPEN

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
            self._ws = None

    def __enter__(self) -> "PolicyClient":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
