"""The policy server: a checkpoint bundle behind websocket + msgpack (openpi's wire format).

Protocol (the one ``openpi-client``'s ``WebsocketClientPolicy`` speaks):

1. The client connects (``Authorization: Api-Key <key>`` header when the server has a key; a
   missing or wrong key is refused with HTTP 401 before the websocket opens).
2. The server sends the metadata (:meth:`real_robot.spec.PolicySpec.metadata`), msgpack-encoded.
3. Per observation dict the client sends, the server answers one binary msgpack map
   ``{"actions": float32 [H, A], "server_timing": {...}}``; a malformed request gets a text frame
   ``"error: ..."`` (``openpi-client`` raises it as a ``RuntimeError``) and the connection stays
   open for the next one. A message over ``max_message_bytes`` closes that connection (1009).

What a reply can hold: every request is validated after its cast to float32 (finite state, RTC
actions finite and within the action range, the frozen count within the given plan), and every
chunk is checked once more just before it is sent (:meth:`~real_robot.spec.PolicySpec.check_actions`:
shape, finite, within ``action_range``); a chunk that fails is never sent: the client gets
``"error: ..."`` and ``/healthz`` counts it under ``unsafe_replies``.

Deadlines: the handshake must finish within ``open_timeout_s``; after it, a connection that starts
no message for ``idle_timeout_s`` (from its last reply) is closed (1008), as is one that takes over
``message_timeout_s`` to finish a message it has begun (half a frame, a trickle) or to take a
reply (:class:`FrameClock` tells the two apart from the frame headers).

At most ``max_connections`` connections are open at once. When a new authorized client finds them
all taken, the longest-idle one (no request read, run or answered; the longest since its last
reply) is closed (1013, logged, ``evicted_connections`` in ``/healthz``) to make room: idle or
leaked sessions never lock the robot's client out. Only when every open connection has a request
in flight is the new one refused with HTTP 503 (``refused_connections``).

Request keys: the policy's own (:mod:`real_robot.spec`) or, as aliases, those of openpi's example
clients whose robot fits the policy (:mod:`real_robot.openpi_layouts`: LIBERO, DROID, ALOHA), listed
in the metadata's ``request_aliases``; ``default_prompt`` stands in for a request without a prompt.

``GET /healthz`` answers 200 with JSON stage timings once the warm-up inference is done (503
before). Requests from concurrent clients are batched: those that arrived while the previous
batch ran go through the model together (up to ``max_batch``); ``batch_window_ms`` > 0 also lets
the first one wait that long for others.
Stages timed per request: decode (msgpack + validation), queue (waiting for the batch),
preprocess (stacking into tensors), inference, encode (of the previous reply on the connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Optional

import numpy as np
import torch

from embodied.latency.stats import LatencyStats
from policies.flow.rtc import rtc_sample
from policies.io import policy_inputs
from policies.precision import lookup as lookup_precision
from real_robot import protocol
from real_robot.spec import PolicySpec, RequestError

log = logging.getLogger(__name__)


class FrameClock:
    """When the client's unfinished message began, read off RFC 6455 frame headers alone.

    Fed every byte the client sends after the handshake, it follows frame boundaries (header,
    then a payload it skips by length): ``since`` is the arrival time of the first byte of a frame
    or fragmented message still unfinished, None between messages. Control frames (ping, pong,
    close) between messages leave it None, so a client that only keeps the connection alive is
    governed by the idle deadline.
    """

    def __init__(self) -> None:
        self.since: Optional[float] = None
        self._header = bytearray()
        self._opcode = 0
        self._fin = True
        self._payload_left = 0
        self._in_message = False  # a data frame without FIN was seen: its continuation is due

    def feed(self, data: bytes, now: float) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._payload_left:
                take = min(self._payload_left, n - i)
                self._payload_left -= take
                i += take
                if not self._payload_left:
                    self._frame_done()
                continue
            if self.since is None:
                self.since = now
            self._header.append(data[i])
            i += 1
            self._parse_header()

    def _parse_header(self) -> None:
        h = self._header
        if len(h) < 2:
            return
        short = h[1] & 0x7F
        ext = 2 if short == 126 else 8 if short == 127 else 0
        if len(h) < 2 + ext + (4 if h[1] & 0x80 else 0):
            return
        self._fin, self._opcode = bool(h[0] & 0x80), h[0] & 0x0F
        self._payload_left = int.from_bytes(h[2 : 2 + ext], "big") if ext else short
        self._header.clear()
        if not self._payload_left:
            self._frame_done()

    def _frame_done(self) -> None:
        if self._opcode < 0x8:  # a data frame (continuation, text, binary)
            self._in_message = not self._fin
        if not self._in_message:
            self.since = None


def _deadline_connection_class() -> type:
    """A websockets ``ServerConnection`` whose :class:`FrameClock` sees every byte after the handshake.

    It relies on public contracts only: ``serve(create_connection=...)`` for the subclass, the
    connection being an :class:`asyncio.Protocol` (bytes arrive through ``data_received``) and its
    ``state``; an implementation that breaks the second is refused here rather than left without
    a message deadline.
    """
    from websockets.asyncio.server import ServerConnection
    from websockets.protocol import State

    if not issubclass(ServerConnection, asyncio.Protocol) or issubclass(ServerConnection, asyncio.BufferedProtocol):
        raise RuntimeError(
            "this websockets version does not receive bytes through asyncio.Protocol.data_received, "
            "so the message deadline cannot be kept: install a websockets release from 13 to 17"
        )

    class DeadlineConnection(ServerConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.frames = FrameClock()

        @property
        def pending_since(self) -> Optional[float]:
            """Loop time of the first byte of the message still arriving (None: nothing pending)."""
            return self.frames.since

        def data_received(self, data: bytes) -> None:
            # a client sends frames only after the server's 101 answer (RFC 6455 4.1), so the
            # first byte seen in OPEN starts a frame; the handshake has its own deadline
            if self.state is State.OPEN:
                self.frames.feed(data, self.loop.time())
            super().data_received(data)

    return DeadlineConnection


@dataclass
class _Session:
    """An open websocket connection: ``idle_since`` (loop time of its last reply, or of the
    handshake), ``busy`` while a request of it is being read, run or answered."""

    idle_since: float
    busy: bool = False
    evicted: bool = False


def _peer(connection: Any) -> str:
    """``host:port`` of a connection's client, for the log."""
    try:
        host, port = connection.remote_address[:2]
        return f"{host}:{port}"
    except Exception:  # noqa: BLE001 - a socket already gone has no address
        return "a client"


@dataclass
class _Pending:
    obs: dict[str, Any]
    future: asyncio.Future
    queued_at: float


class PolicyServer:
    """Serves ``policy`` (a :class:`policies.base.Policy`); see the module docstring."""

    def __init__(
        self,
        policy: Any,
        *,
        api_key: Optional[str] = None,
        max_message_bytes: int = 8 * 1024 * 1024,
        max_batch: int = 8,
        batch_window_ms: float = 0.0,
        seed: int = 0,
        idle_timeout_s: float = 300.0,
        message_timeout_s: float = 10.0,
        open_timeout_s: float = 10.0,
        max_connections: int = 32,
        default_prompt: Optional[str] = None,
        precision: str = "fp32",
    ):
        for name, value in (
            ("idle_timeout_s", idle_timeout_s),
            ("message_timeout_s", message_timeout_s),
            ("open_timeout_s", open_timeout_s),
            ("max_connections", max_connections),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.precision = lookup_precision(precision)  # fp32 | bf16: weights and autocast of inference
        self.policy = self.precision.for_inference(policy)
        # a request without a prompt gets default_prompt (openpi's ALOHA client sends none)
        self.spec = replace(PolicySpec.from_policy(policy), default_prompt=default_prompt or None)
        self.api_key = api_key or None
        self.max_message_bytes = max_message_bytes
        self.max_batch = max(1, max_batch)
        self.batch_window = batch_window_ms / 1000.0
        self.stats = LatencyStats()
        self.ready = False
        self.idle_timeout = float(idle_timeout_s)
        self.message_timeout = float(message_timeout_s)
        self.open_timeout = float(open_timeout_s)
        self.max_connections = int(max_connections)
        self.requests = 0
        self.errors = 0
        self.unsafe_replies = 0  # chunks the last check stopped (never sent)
        self.timeouts = {"idle": 0, "message": 0, "reply": 0}
        self.refused_connections = 0
        self.evicted_connections = 0
        self._open: dict[Any, _Session] = {}
        self._closing: set[asyncio.Future] = set()
        self._gen = torch.Generator(device=policy.device).manual_seed(seed)
        self._queue: asyncio.Queue[_Pending] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self._metadata = protocol.packb(self.spec.metadata())

    # ------------------------------------------------------------------ inference
    def infer_batch(self, observations: list[dict[str, Any]]) -> tuple[np.ndarray, float, float]:
        """Chunks ``[B, H, A]`` for validated observations of one image size (all with or all
        without real-time chunking); returns (chunks, preprocess s, inference s)."""
        t0 = time.perf_counter()
        batch = policy_inputs(
            np.stack([o["rgb"] for o in observations]),
            np.stack([o["state"] for o in observations]),
            [o["prompt"] for o in observations],
        )
        rtc = [o["rtc"] for o in observations if "rtc" in o]
        if rtc:
            h, a = self.spec.chunk_size, self.spec.action_dim
            prev = torch.zeros(len(rtc), h, a)
            valid = torch.zeros(len(rtc), h, dtype=torch.bool)
            for i, (p, _) in enumerate(rtc):
                prev[i, : len(p)] = torch.from_numpy(p)
                valid[i, : len(p)] = True
            frozen = max(f for _, f in rtc)
        t1 = time.perf_counter()
        with self.precision.autocast(self.policy.device):
            if rtc:
                actions = rtc_sample(self.policy, batch, prev, valid, frozen, generator=self._gen)
            else:
                with torch.no_grad():
                    actions = self.policy.sample(batch, mode="greedy", generator=self._gen).actions
        out = actions.float().cpu().numpy()
        return out, t1 - t0, time.perf_counter() - t1

    def warm_up(self) -> None:
        """One inference on a blank observation; the server is ready (``/healthz`` 200) after it."""
        s = self.spec
        blank = {
            "rgb": np.zeros((len(s.cameras), s.image_size, s.image_size, 3), np.uint8),
            "state": np.zeros(s.state_dim, np.float32),
            "prompt": "warm up",
        }
        self.infer_batch([blank])
        self.ready = True

    async def _batcher(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            items = [first]
            # requests that arrived while the previous batch ran join this one at no extra wait
            while len(items) < self.max_batch and not self._queue.empty():
                items.append(self._queue.get_nowait())
            deadline = loop.time() + self.batch_window
            while len(items) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self._queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            groups: dict[tuple, list[_Pending]] = {}
            for it in items:
                key = (it.obs["rgb"].shape, it.obs["rtc"][1] if "rtc" in it.obs else None)
                groups.setdefault(key, []).append(it)
            for group in groups.values():
                started = time.perf_counter()
                try:
                    chunks, t_pre, t_inf = await loop.run_in_executor(
                        self._pool, self.infer_batch, [g.obs for g in group]
                    )
                except Exception as err:  # the model failed: every waiting client gets the error
                    log.exception("inference failed")
                    for g in group:
                        if not g.future.done():
                            g.future.set_exception(err)
                    continue
                for i, g in enumerate(group):
                    if not g.future.done():
                        g.future.set_result((chunks[i], started - g.queued_at, t_pre, t_inf, len(group)))

    # ------------------------------------------------------------------ websocket
    def _process_request(self, connection: Any, request: Any) -> Any:
        path = request.path.split("?")[0]
        if path == "/healthz":
            if not self.ready:
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "warming up\n")
            body = {
                "status": "ok",
                "requests": self.requests,
                "errors": self.errors,
                "unsafe_replies": self.unsafe_replies,
                "connections": len(self._open),
                "max_connections": self.max_connections,
                "refused_connections": self.refused_connections,
                "evicted_connections": self.evicted_connections,
                "timeouts": dict(self.timeouts),
                "deadlines_s": {"open": self.open_timeout, "idle": self.idle_timeout, "message": self.message_timeout},
                "spec": self.spec.metadata(),
                "timing_ms": {
                    k: {q: round(v * 1e3, 3) if q != "count" else v for q, v in s.items()}
                    for k, s in self.stats.summary().items()
                },
            }
            return connection.respond(HTTPStatus.OK, json.dumps(body) + "\n")
        if not protocol.authorized(request.headers, self.api_key):
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
        if not self.ready:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "warming up\n")
        if len(self._open) >= self.max_connections and not self._evict_longest_idle():
            self.refused_connections += 1
            log.warning(
                "refused a connection from %s: all %d connections have a request in flight",
                _peer(connection),
                self.max_connections,
            )
            return connection.respond(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"too many connections (at most {self.max_connections}), each with a request "
                f"in flight; try again later\n",
            )
        return None

    def _evict_longest_idle(self) -> bool:
        """Close the open connection idle the longest (none with a request in flight) to make room;
        False when there is none to close."""
        idle = [
            (session.idle_since, id(ws), ws)
            for ws, session in self._open.items()
            if not session.busy and getattr(ws, "pending_since", None) is None
        ]
        if not idle:
            return False
        since, _, ws = min(idle)
        self._open.pop(ws).evicted = True
        self.evicted_connections += 1
        seconds = asyncio.get_running_loop().time() - since
        log.warning(
            "evicted the connection from %s, idle for %.1f s, to admit a new client (%d open at most; "
            "%d evicted so far)",
            _peer(ws),
            seconds,
            self.max_connections,
            self.evicted_connections,
        )
        task = asyncio.ensure_future(self._drop(ws, f"evicted after {seconds:.0f} s idle: the server is full", 1013))
        self._closing.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._closing.discard)
        return True

    async def _next_message(self, ws: Any, idle_since: float) -> Any:
        """The next message, or None once a deadline passed (idle since ``idle_since``, or a message
        begun over ``message_timeout`` ago); the caller closes the connection then."""
        loop = asyncio.get_running_loop()
        recv = asyncio.ensure_future(ws.recv())
        tick = max(0.01, min(1.0, self.message_timeout / 4, self.idle_timeout / 4))
        try:
            while True:
                pending = getattr(ws, "pending_since", None)
                late = pending + self.message_timeout if pending is not None else idle_since + self.idle_timeout
                left = late - loop.time()
                if left <= 0:
                    self.timeouts["message" if pending is not None else "idle"] += 1
                    return None
                done, _ = await asyncio.wait({recv}, timeout=min(left, tick))
                if done:
                    return recv.result()
        finally:
            if not recv.done():
                recv.cancel()

    async def _drop(self, ws: Any, reason: str, code: int = 1008) -> None:
        """Close ``ws`` for ``reason`` (``code``); a peer that does not answer the close is cut off."""
        log.info("closing a connection: %s", reason)
        try:
            await asyncio.wait_for(ws.close(code, reason[:120]), timeout=min(2.0, self.message_timeout))
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - whatever happens, the socket goes
            pass
        transport = getattr(ws, "transport", None)
        if transport is not None:
            transport.abort()

    async def _handle(self, ws: Any) -> None:
        import websockets

        loop = asyncio.get_running_loop()
        prev_encode = 0.0
        session = self._open[ws] = _Session(loop.time())
        try:
            await self._reply(ws, self._metadata)
            session.idle_since = loop.time()
            while True:
                message = await self._next_message(ws, session.idle_since)
                if session.evicted:
                    return
                if message is None:
                    await self._drop(
                        ws,
                        f"no complete message within the deadline (idle {self.idle_timeout:g} s, "
                        f"message {self.message_timeout:g} s)",
                    )
                    return
                session.busy = True
                prev_encode = await self._answer(ws, message, prev_encode)
                session.busy, session.idle_since = False, loop.time()
        except websockets.ConnectionClosed:
            pass
        except asyncio.TimeoutError:  # the peer did not take its reply in time
            self.timeouts["reply"] += 1
            await self._drop(ws, f"reply not taken within {self.message_timeout:g} s")
        finally:
            if self._open.get(ws) is session:
                del self._open[ws]

    async def _answer(self, ws: Any, message: Any, prev_encode: float) -> float:
        """Validate, run and answer one request; returns the seconds its reply took to encode."""
        assert self._queue is not None
        t0 = time.perf_counter()
        try:
            obs = self.spec.validate(protocol.unpackb(message, self.max_message_bytes))
        except (protocol.ProtocolError, RequestError) as err:
            self.errors += 1
            await self._reply(ws, f"error: {err}")
            return prev_encode
        decode = time.perf_counter() - t0
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(obs, fut, time.perf_counter()))
        try:
            chunk, queued, pre, inf, batch = await fut
        except Exception as err:
            self.errors += 1
            await self._reply(ws, f"error: inference failed: {type(err).__name__}: {err}")
            return prev_encode
        t_enc = time.perf_counter()
        chunk = np.asarray(chunk)
        problem = self.spec.check_actions(chunk)
        if problem is not None:  # the last line of defence: this chunk never leaves the server
            self.errors += 1
            self.unsafe_replies += 1
            log.error("refused to send a chunk: %s", problem)
            await self._reply(ws, f"error: {problem}; no actions sent")
            return prev_encode
        timing = {
            "decode_ms": decode * 1e3,
            "queue_ms": queued * 1e3,
            "preprocess_ms": pre * 1e3,
            "infer_ms": inf * 1e3,
            "prev_encode_ms": prev_encode * 1e3,
            "batch_size": batch,
        }
        reply = protocol.packb({"actions": chunk, "server_timing": timing})
        encode = time.perf_counter() - t_enc
        for stage, secs in (
            ("decode", decode),
            ("queue", queued),
            ("preprocess", pre),
            ("inference", inf),
            ("encode", encode),
        ):
            self.stats.record(stage, secs)
        self.requests += 1
        await self._reply(ws, reply)
        return encode

    async def _reply(self, ws: Any, message: Any) -> None:
        """Send within the message deadline (a peer that stops reading does not hold the handler)."""
        await asyncio.wait_for(ws.send(message), timeout=self.message_timeout)

    async def serve(
        self,
        host: str,
        port: int,
        started: Optional[threading.Event] = None,
        bound: Optional[list] = None,
        stop: Optional[asyncio.Event] = None,
        announce: bool = False,
    ) -> None:
        """Serve until ``stop`` is set (or forever); ``announce`` prints the port once ready."""
        from websockets.asyncio.server import serve

        self._queue = asyncio.Queue()
        batcher = asyncio.create_task(self._batcher())
        try:
            async with serve(
                self._handle,
                host,
                port,
                process_request=self._process_request,
                compression=None,
                max_size=self.max_message_bytes,
                ping_interval=None,
                open_timeout=self.open_timeout,
                create_connection=_deadline_connection_class(),
            ) as server:
                if bound is not None:
                    bound.append(server.sockets[0].getsockname()[1])
                if not self.ready:
                    await asyncio.get_running_loop().run_in_executor(self._pool, self.warm_up)
                if started is not None:
                    started.set()
                if announce:
                    print(f"embodied-serve: ready, listening on port {server.sockets[0].getsockname()[1]}", flush=True)
                log.info("serving %s on ws://%s:%s", self.spec.family, host, port)
                if stop is None:
                    await server.serve_forever()
                else:
                    await stop.wait()
        finally:
            batcher.cancel()


class ServerThread:
    """Run a :class:`PolicyServer` in a background thread (tests, benchmarks, in-process use).

    ``with ServerThread(server) as port: ...`` returns once the server is warm and listening.
    """

    def __init__(self, server: PolicyServer, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self) -> int:
        started, bound = threading.Event(), []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._stop = asyncio.Event()
            try:
                self._loop.run_until_complete(self.server.serve(self.host, self.port, started, bound, self._stop))
            except BaseException as err:  # surfaced by start()
                self._error = err
                started.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="policy-server", daemon=True)
        self._thread.start()
        started.wait(120)
        if self._error is not None or not bound:
            raise RuntimeError(f"the policy server did not start: {self._error}")
        self.port = bound[0]
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> int:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
