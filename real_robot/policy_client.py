"""A blocking client of ``embodied-serve`` (the same protocol as ``openpi-client``), with timeouts.

:meth:`PolicyClient.connect` tries once (a wrong address fails at start-up);
:meth:`PolicyClient.reconnect` retries a lost server with bounded exponential backoff
(:class:`ReconnectPolicy`) and refuses a server that came back with another policy.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from real_robot import protocol
from real_robot.spec import PolicySpec

log = logging.getLogger(__name__)

#: a server that does not answer our close handshake within this is cut off (the default is 10 s)
CLOSE_TIMEOUT_S = 1.0


class ServerError(RuntimeError):
    """The server answered a request with an error message."""


@dataclass
class ReconnectPolicy:
    """How :meth:`PolicyClient.reconnect` retries: attempt k waits ``first_delay_s * factor**k``
    (at most ``max_delay_s``) after the one before; it gives up after ``max_attempts`` attempts or
    ``max_total_s`` seconds, whichever comes first. The robot holds still meanwhile."""

    max_attempts: int = 40
    max_total_s: float = 60.0  # a server restart loads its checkpoint and warms up before it answers
    first_delay_s: float = 0.1
    max_delay_s: float = 2.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if (
            self.max_attempts < 1
            or self.max_total_s <= 0
            or self.first_delay_s < 0
            or self.factor < 1
            or self.max_delay_s < self.first_delay_s
        ):
            raise ValueError(
                f"ReconnectPolicy needs max_attempts >= 1, max_total_s > 0, first_delay_s >= 0, "
                f"factor >= 1 and max_delay_s >= first_delay_s; got {self}"
            )

    def delays(self) -> Iterator[float]:
        """The wait after each failed attempt."""
        delay = self.first_delay_s
        for _ in range(self.max_attempts):
            yield delay
            delay = min(self.max_delay_s, delay * self.factor)


def _refused_key(err: ConnectionError) -> bool:
    from websockets.exceptions import InvalidStatus

    cause = err.__cause__
    return isinstance(cause, InvalidStatus) and cause.response.status_code == 401


class PolicyClient:
    def __init__(
        self,
        uri: str,
        api_key: Optional[str] = None,
        timeout: float = 10.0,
        max_message_bytes: int = protocol.DEFAULT_MAX_BYTES,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
    ):
        self.uri = uri if uri.startswith("ws") else f"ws://{uri}"
        self.api_key, self.timeout, self.max_message_bytes = api_key, timeout, max_message_bytes
        self.reconnect_policy = reconnect
        self.reconnects = 0  # successful reconnects over this client's life
        self._ws: Any = None
        self._closed = threading.Event()  # close() ends a reconnect that is waiting
        self.metadata: dict[str, Any] = {}
        self.spec: Optional[PolicySpec] = None

    def connect(self) -> PolicySpec:
        """Open the connection and read the server's metadata (the policy's spec); one attempt."""
        self._closed.clear()
        self._ws, self.metadata = self._open(self.timeout)
        self.spec = PolicySpec.from_metadata(self.metadata)
        return self.spec

    def _open(self, timeout: float) -> tuple[Any, dict[str, Any]]:
        """A new connection and the metadata the server sent on it."""
        from websockets.sync.client import connect

        ws = None
        try:
            ws = connect(
                self.uri,
                compression=None,
                max_size=self.max_message_bytes,
                open_timeout=timeout,
                close_timeout=CLOSE_TIMEOUT_S,
                additional_headers=protocol.auth_headers(self.api_key),
            )
            return ws, protocol.unpackb(ws.recv(timeout=timeout), self.max_message_bytes)
        except Exception as err:
            if ws is not None:
                ws.close()
            raise ConnectionError(f"cannot connect to the policy server at {self.uri}: {err}") from err

    def reconnect(self) -> PolicySpec:
        """Replace a lost connection, retrying as :attr:`reconnect_policy` says. Raises
        :class:`ConnectionError` naming the address and how long it tried when it gives up (or the
        key is refused), :class:`ServerError` when the server is back with a different policy."""
        self._discard()
        policy, started = self.reconnect_policy, time.monotonic()
        attempts, last = 0, None
        for delay in policy.delays():
            left = policy.max_total_s - (time.monotonic() - started)
            if left <= 0 or self._closed.is_set():
                break
            attempts += 1
            try:
                ws, metadata = self._open(min(self.timeout, left))
            except ConnectionError as err:
                last = err
                if _refused_key(err) or attempts == policy.max_attempts:
                    break
                left = policy.max_total_s - (time.monotonic() - started)
                if self._closed.wait(max(0.0, min(delay, left))):
                    break
                continue
            return self._adopt(ws, metadata, attempts, time.monotonic() - started)
        raise ConnectionError(self._gave_up(attempts, time.monotonic() - started, last))

    def _gave_up(self, attempts: int, seconds: float, last: Optional[ConnectionError]) -> str:
        policy = self.reconnect_policy
        if last is not None and _refused_key(last):
            hint = "The server refused the API key: give the key it was started with"
        else:
            hint = (
                "Check that embodied-serve runs there and is reachable, or give PolicyClient a ReconnectPolicy "
                "with more time"
            )
        why = str(last.__cause__ or last) if last is not None else "closed before an attempt"
        return (
            f"gave up reconnecting to the policy server at {self.uri} after {attempts} attempt(s) in "
            f"{seconds:.1f} s (limits: {policy.max_attempts} attempts, {policy.max_total_s:g} s); "
            f"last error: {why}. {hint}"
        )

    def _adopt(self, ws: Any, metadata: dict[str, Any], attempts: int, seconds: float) -> PolicySpec:
        """Use the new connection, unless its server serves another policy than the one checked at connect."""
        if self._closed.is_set():  # close() was called while this attempt ran
            ws.close()
            raise ConnectionError(f"the client of {self.uri} was closed while reconnecting")
        if self.metadata and metadata != self.metadata:
            ws.close()
            raise ServerError(
                f"the policy server at {self.uri} came back serving a different policy "
                f"({metadata.get('family')}, chunk {metadata.get('chunk_size')}); restart the deployment so it is checked against "
                f"the robot again"
            )
        self._ws, self.metadata = ws, metadata
        self.spec = PolicySpec.from_metadata(metadata)
        self.reconnects += 1
        log.info("reconnected to the policy server at %s after %d attempt(s) in %.2f s", self.uri, attempts, seconds)
        return self.spec

    def infer(self, obs: dict[str, Any], timeout: Optional[float] = None) -> tuple[np.ndarray, dict[str, Any]]:
        """The chunk ``[H, A]`` and the server timing for one observation dict."""
        if self._ws is None:
            raise ConnectionError(f"not connected to the policy server at {self.uri}: call connect() or reconnect()")
        wait = self.timeout if timeout is None else timeout
        try:
            self._ws.send(protocol.packb(obs))
            reply = self._ws.recv(timeout=wait)
        except TimeoutError:
            # the late reply would be read as the answer to the next request: start over on a new connection
            self._discard()
            raise TimeoutError(
                f"no reply from the policy server at {self.uri} within {wait:g} s; "
                f"the connection was dropped (reconnect() opens a new one)"
            ) from None
        except Exception as err:
            raise ConnectionError(f"lost the policy server at {self.uri}: {err}") from None
        if isinstance(reply, str):
            raise ServerError(reply)
        msg = protocol.unpackb(reply, self.max_message_bytes)
        actions = msg.get("actions") if isinstance(msg, dict) else None
        # the server checks every chunk it sends; a client trusts no peer all the same
        problem = (
            (self.spec.check_actions(actions) if self.spec is not None else None)
            if isinstance(actions, np.ndarray)
            else "the reply holds no actions array"
        )
        if problem is not None:
            raise ServerError(f"refused the server's reply: {problem}")
        return actions.copy(), dict(msg.get("server_timing", {}))

    def alive(self) -> bool:
        """Whether the connection is open (a server that died is noticed without a request)."""
        ws = self._ws
        if ws is None:
            return False
        from websockets.protocol import State

        return ws.protocol.state is State.OPEN

    def _discard(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - the connection is being thrown away
                pass

    def close(self) -> None:
        """Close the connection; a reconnect under way stops at its next wait."""
        self._closed.set()
        self._discard()

    def __enter__(self) -> "PolicyClient":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
