"""The :class:`Robot` contract over the network: a robot PC runs :class:`RobotAdapterServer` around
its own driver; the deployment machine uses :class:`NetworkRobot`.

Protocol (websocket, one binary msgpack map per message, arrays encoded as in
:mod:`real_robot.protocol`; optional ``Authorization: Api-Key <key>`` header). Requests carry
``op``; every reply carries ``ok`` (and ``error`` when false):

=============== ============================ ================================================
op              request fields               reply fields
=============== ============================ ================================================
``spec``        -                            ``spec`` (RobotSpec as a map)
``connect``     -                            -
``observe``     -                            ``state``, ``images`` {camera: uint8 [H, W, 3]},
                                             ``frame_ids``, ``timestamp``, ``success``
``send_action`` ``action`` float [A]          ``sent`` float [A] (what the robot executed)
``hold``        -                            -
``reset``       ``init_id`` (optional int)    - (a robot without ``reset`` stays where it is)
``disconnect``  -                            -
=============== ============================ ================================================

A user's adapter implements :class:`~real_robot.robots.base.Robot` against their SDK and calls
``RobotAdapterServer(robot).serve_forever(host, port)``; :mod:`real_robot.robots.lerobot_bridge` does
so for LeRobot's robots. The spec travels as a map: a field an older adapter does not send takes
its default (the Panda's).
"""

from __future__ import annotations

import threading
from contextlib import suppress
from http import HTTPStatus
from typing import Any, Optional

import numpy as np

from real_robot import protocol
from real_robot.robots.base import Observation, Robot, RobotSpec


class RobotAdapterServer:
    """Serves one :class:`Robot` to network clients (one command at a time)."""

    def __init__(self, robot: Robot, api_key: Optional[str] = None):
        self.robot, self.api_key = robot, api_key
        self._lock = threading.Lock()
        self._server: Any = None

    def _process_request(self, connection: Any, request: Any) -> Any:
        if not protocol.authorized(request.headers, self.api_key):
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
        return None

    def _dispatch(self, msg: Any) -> dict[str, Any]:
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            raise protocol.ProtocolError("a request is a map with an 'op' string")
        op, r = msg["op"], self.robot
        if op == "spec":
            return {"spec": r.spec.to_dict()}
        if op == "connect":
            r.connect()
            return {}
        if op == "observe":
            o = r.observe()
            return {
                "state": o.state,
                "images": o.images,
                "frame_ids": o.frame_ids,
                "timestamp": o.timestamp,
                "success": bool(o.success),
            }
        if op == "send_action":
            a = msg.get("action")
            if not isinstance(a, np.ndarray) or a.shape != (r.spec.action_dim,) or a.dtype.kind != "f":
                raise protocol.ProtocolError(f"action must be a float array [{r.spec.action_dim}]")
            return {"sent": np.asarray(r.send_action(a), np.float64)}
        if op == "hold":
            r.hold()
            return {}
        if op == "reset":
            if hasattr(r, "reset"):  # a real arm has none: the operator resets the scene
                r.reset(msg.get("init_id"))
            return {}
        if op == "disconnect":
            r.disconnect()
            return {}
        raise protocol.ProtocolError(f"unknown op {op!r}")

    def _handle(self, ws: Any) -> None:
        for message in ws:
            try:
                with self._lock:
                    reply = {"ok": True, **self._dispatch(protocol.unpackb(message))}
            except Exception as err:  # every failure is an error reply; the adapter stays up
                reply = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
            ws.send(protocol.packb(reply))

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve in a background thread; returns the port."""
        from websockets.sync.server import serve

        self._server = serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            compression=None,
            max_size=protocol.DEFAULT_MAX_BYTES,
        )
        threading.Thread(target=self._server.serve_forever, name="robot-adapter", daemon=True).start()
        return self._server.socket.getsockname()[1]

    def serve_forever(self, host: str = "0.0.0.0", port: int = 8765) -> None:
        from websockets.sync.server import serve

        with serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            compression=None,
            max_size=protocol.DEFAULT_MAX_BYTES,
        ) as server:
            server.serve_forever()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()


class NetworkRobot(Robot):
    """A :class:`Robot` whose driver runs behind a :class:`RobotAdapterServer`."""

    def __init__(self, address: str, api_key: Optional[str] = None, timeout: float = 2.0):
        self.address = address if address.startswith("ws") else f"ws://{address}"
        self.api_key, self.timeout = api_key, timeout
        self._ws: Any = None
        self.spec = RobotSpec()
        self.connected = False

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        if self._ws is None:
            raise ConnectionError("not connected to the robot adapter")
        self._ws.send(protocol.packb({"op": op, **fields}))
        reply = protocol.unpackb(self._ws.recv(timeout=self.timeout))
        if not reply.get("ok"):
            raise RuntimeError(f"robot adapter: {reply.get('error')}")
        return reply

    def connect(self) -> None:
        from websockets.sync.client import connect

        if self._ws is None:
            self._ws = connect(
                self.address,
                compression=None,
                max_size=protocol.DEFAULT_MAX_BYTES,
                additional_headers=protocol.auth_headers(self.api_key),
                open_timeout=self.timeout,
            )
        self.spec = RobotSpec.from_dict(self._call("spec")["spec"])
        self._call("connect")
        self.connected = True

    def observe(self) -> Observation:
        r = self._call("observe")
        return Observation(
            state=np.asarray(r["state"], np.float32),
            images=dict(r["images"]),
            frame_ids=dict(r["frame_ids"]),
            timestamp=float(r["timestamp"]),
            success=bool(r["success"]),
        )

    def send_action(self, action: np.ndarray) -> np.ndarray:
        return np.asarray(self._call("send_action", action=np.asarray(action, np.float64))["sent"])

    def hold(self) -> None:
        if self._ws is not None:
            with suppress(Exception):  # best effort: the adapter may be gone already
                self._call("hold")

    def reset(self, init_id: Optional[int] = None) -> None:
        self._call("reset", **({"init_id": int(init_id)} if init_id is not None else {}))

    def disconnect(self) -> None:
        if self._ws is not None:
            with suppress(Exception):
                self._call("disconnect")
            with suppress(Exception):
                self._ws.close()
            self._ws = None
        self.connected = False

    @property
    def instruction(self) -> str:
        return ""
