"""The policy server (real_robot/server.py) and what it guarantees: openpi-client gets actions behind
the API key, no reply carries a bad action, every connection has a deadline."""

from __future__ import annotations

import itertools
import json
import socket
import time
import urllib.request

import numpy as np
import pytest
import torch
from conftest import SERVED_TINY as TINY
from conftest import openpi_obs as _obs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from real_robot import protocol
from real_robot.policy_client import PolicyClient, ServerError
from real_robot.server import PolicyServer, ServerThread
from real_robot.spec import RTC_FROZEN_KEY, RTC_PREV_KEY, PolicySpec, RequestError

H, A = 6, 7


def _health(port: int) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).read())


@pytest.fixture(scope="module")
def server():
    torch.manual_seed(0)
    srv = PolicyServer(policies.make("flow", chunk_size=H, **TINY), max_message_bytes=1 << 20)
    with ServerThread(srv) as port:
        yield srv, port


@pytest.fixture(scope="module")
def spec():
    torch.manual_seed(0)
    return PolicySpec.from_policy(policies.make("flow", chunk_size=H, **TINY))


def _connect(port: int):
    from websockets.sync.client import connect

    ws = connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None)
    ws.recv(timeout=10)  # metadata
    return ws


def _ask(ws, obs: dict) -> np.ndarray | str:
    ws.send(protocol.packb(obs))
    reply = ws.recv(timeout=30)
    return reply if isinstance(reply, str) else protocol.unpackb(reply)["actions"]


@pytest.mark.parametrize(
    "prev, frozen, why",
    [
        (np.full((3, A), 1e300), 2, "float32"),  # finite float64, inf once cast
        (np.full((3, A), 3e38, np.float32), 2, "action range"),  # finite float32, far out of range
        (np.full((3, A), 5.0, np.float32), 2, "action range"),  # plainly out of range
        (np.zeros((2, A), np.float32), 4, "frozen"),  # more frozen steps than the plan holds
    ],
)
def test_rtc_fields_are_checked_after_the_cast(server, prev, frozen, why):
    _, port = server
    ws = _connect(port)
    reply = _ask(ws, {**_obs(), RTC_PREV_KEY: prev, RTC_FROZEN_KEY: frozen})
    assert isinstance(reply, str) and reply.startswith("error:") and why in reply, reply
    good = _ask(ws, {**_obs(), RTC_PREV_KEY: np.full((3, A), 0.5, np.float32), RTC_FROZEN_KEY: 2})
    assert good.shape == (H, A) and np.isfinite(good).all() and np.allclose(good[:2], 0.5)
    ws.close()


def test_a_state_that_overflows_float32_is_refused(server):
    _, port = server
    ws = _connect(port)
    reply = _ask(ws, {**_obs(), "observation/state": np.full(15, 1e300)})
    assert isinstance(reply, str) and "NaN or inf" in reply
    ws.close()


def test_a_chunk_that_is_not_finite_never_leaves_the_server():
    torch.manual_seed(0)
    policy = policies.make("flow", chunk_size=H, **TINY)
    with torch.no_grad():
        next(policy.parameters()).fill_(float("nan"))  # a broken model: every chunk is NaN
    srv = PolicyServer(policy)
    with ServerThread(srv) as port:
        ws = _connect(port)
        reply = _ask(ws, _obs())
        assert isinstance(reply, str) and "NaN or inf" in reply and "no actions sent" in reply
        health = _health(port)
        assert health["unsafe_replies"] == 1 and health["requests"] == 0
        ws.close()


def test_the_client_refuses_a_reply_with_bad_actions(spec, monkeypatch):
    """A peer that is not our server may send anything: the client checks the reply too."""
    client = PolicyClient("ws://127.0.0.1:1")
    client.spec = spec

    class Peer:
        def __init__(self, actions):
            self.actions = actions

        def send(self, _):
            pass

        def recv(self, timeout=None):
            return protocol.packb({"actions": self.actions})

    for bad in (
        np.full((H, A), np.nan, np.float32),
        np.full((H, A), 2.0, np.float32),
        np.zeros((H, A + 1), np.float32),
    ):
        client._ws = Peer(bad)
        with pytest.raises(ServerError, match="refused the server's reply"):
            client.infer(_obs())
    client._ws = Peer(np.zeros((H, A), np.float32))
    assert client.infer(_obs())[0].shape == (H, A)
    client._ws = None


def _float_arrays(shape):
    floats = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        st.sampled_from([1e300, -1e300, 3.4e38, 3.5e38, 1.0000001, -1.0000001, 1.0, -1.0]),
    )
    return st.lists(floats, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))).map(
        lambda v: np.array(v, np.float64).reshape(shape)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=_float_arrays((15,)),
    prev=_float_arrays((3, A)),
    dtype=st.sampled_from([np.float32, np.float64]),
    frozen=st.integers(-3, H + 3),
)
def test_validation_passes_only_finite_in_range_float32(spec, state, prev, dtype, frozen):
    """Any float input: either refused, or what reaches the model is finite float32 within range."""
    with np.errstate(over="ignore", invalid="ignore"):
        obs = {
            **_obs(),
            "observation/state": state.astype(dtype),
            RTC_PREV_KEY: prev.astype(dtype),
            RTC_FROZEN_KEY: frozen,
        }
    try:
        out = spec.validate(obs)
    except RequestError:
        return
    assert out["state"].dtype == np.float32 and np.isfinite(out["state"]).all()
    plan, d = out["rtc"]
    assert plan.dtype == np.float32 and np.isfinite(plan).all() and (np.abs(plan) <= 1.0).all()
    assert 0 <= d <= len(plan) and d < H


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=H * A, max_size=H * A))
def test_check_actions_admits_exactly_finite_in_range_chunks(spec, values):
    chunk = np.array(values, np.float32).reshape(H, A)
    ok = bool(np.isfinite(chunk).all() and (np.abs(chunk) <= 1.0).all())
    assert (spec.check_actions(chunk) is None) == ok


def test_an_idle_connection_is_closed(server):
    from websockets.exceptions import ConnectionClosed

    srv, port = server
    srv.idle_timeout = 0.5
    try:
        before = srv.timeouts["idle"]
        ws = _connect(port)
        assert isinstance(_ask(ws, _obs()), np.ndarray)  # served, then nothing more is sent
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert srv.timeouts["idle"] == before + 1
    finally:
        srv.idle_timeout = 300.0


def test_a_client_that_waits_before_its_first_request_is_served(server):
    """Only the idle deadline governs the time between the handshake and the first message (a client
    may connect, then build its simulator): the message deadline starts with a message's first byte."""
    srv, port = server
    srv.message_timeout = 0.3
    try:
        before = dict(srv.timeouts)
        ws = _connect(port)
        time.sleep(1.0)  # > the message deadline, < the idle one
        assert isinstance(_ask(ws, _obs()), np.ndarray)
        assert srv.timeouts == before
        ws.close()
    finally:
        srv.message_timeout = 10.0


@pytest.mark.parametrize("trickle", [False, True])
def test_half_a_frame_or_a_trickle_is_cut_off(server, trickle):
    from websockets.exceptions import ConnectionClosed

    srv, port = server
    srv.message_timeout = 0.5  # the idle deadline stays at 300 s: only the message deadline can fire
    try:
        before, idle = srv.timeouts["message"], srv.timeouts["idle"]
        ws = _connect(port)
        header = b"\x82" + bytes([0x80 | 100]) + b"\x00\x00\x00\x00"  # a masked binary frame of 100 bytes
        ws.socket.sendall(header + b"\x00" * 10)  # ... of which only 10 arrive
        closed, stop = False, time.monotonic() + 30
        while not closed and time.monotonic() < stop:
            try:
                if trickle:  # one more byte every 0.2 s: the frame would take 18 s to complete
                    ws.socket.sendall(b"\x00")
                ws.recv(timeout=0.2)
            except TimeoutError:
                continue
            except (ConnectionClosed, OSError):  # OSError: the socket was cut while sending
                closed = True
        assert closed, "the connection was never closed"
        while srv.timeouts["message"] == before and time.monotonic() < stop:
            time.sleep(0.05)
        assert srv.timeouts["message"] == before + 1 and srv.timeouts["idle"] == idle
    finally:
        srv.message_timeout = 10.0


def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """One masked client frame (RFC 6455 5.2) with a zero mask, payload lengths of every header size."""
    n = len(payload)
    size = (
        bytes([0x80 | n])
        if n < 126
        else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        if n < 1 << 16
        else bytes([0x80 | 127]) + n.to_bytes(8, "big")
    )
    return bytes([(0x80 if fin else 0) | opcode]) + size + b"\x00" * 4 + payload


_MESSAGES = st.lists(
    st.tuples(st.sampled_from(["binary", "fragmented", "ping"]), st.sampled_from([0, 5, 125, 126, 300, 70000])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(messages=_MESSAGES, cut=st.lists(st.integers(1, 400), min_size=1, max_size=40), partial=st.booleans())
def test_frame_clock_knows_when_a_message_is_unfinished(messages, cut, partial):
    """Whatever the framing and however the bytes are split: ``since`` is None exactly between
    messages, and it holds the arrival time of the first byte of the unfinished one."""
    from real_robot.server import FrameClock

    stream = b""
    for kind, n in messages:
        if kind == "fragmented":  # two data fragments with a ping between them
            stream += _frame(0x2, b"a" * n, fin=False) + _frame(0x9, b"p") + _frame(0x0, b"b" * n)
        else:
            stream += _frame(0x2 if kind == "binary" else 0x9, b"x" * (n if kind == "binary" else min(n, 125)))
    complete = len(stream)
    if partial:
        stream += _frame(0x2, b"y" * 300)[:7]  # a frame begun: header and a little payload
    bounds = sorted({min(len(stream), b) for b in itertools.accumulate(cut)} | {len(stream)})
    clock, at, started = FrameClock(), 0, None
    for t, end in enumerate(bounds):  # one chunk a second
        if partial and at <= complete < end:
            started = float(t)
        clock.feed(stream[at:end], float(t))
        at = end
    assert (clock.since is not None) == partial
    if partial:
        assert clock.since == started


def test_pings_do_not_start_the_message_deadline(server):
    """A client that keeps its connection alive with pings, past the message deadline, is served."""
    srv, port = server
    srv.message_timeout = 0.3
    try:
        before = dict(srv.timeouts)
        ws = _connect(port)
        for _ in range(4):
            assert ws.ping().wait(10)  # answered: the server saw a whole control frame
            time.sleep(0.2)
        assert isinstance(_ask(ws, _obs()), np.ndarray)
        assert srv.timeouts == before
        ws.close()
    finally:
        srv.message_timeout = 10.0


def test_a_fragmented_message_that_trickles_is_cut_off(server):
    """Each fragment is a complete frame, with pings between: the message deadline still counts
    from the message's first byte."""
    from websockets.exceptions import ConnectionClosed

    srv, port = server
    srv.message_timeout = 0.5
    try:
        before = srv.timeouts["message"]
        ws = _connect(port)
        ws.socket.sendall(_frame(0x2, b"\x80", fin=False))
        closed, stop = False, time.monotonic() + 30
        while not closed and time.monotonic() < stop:
            try:
                ws.socket.sendall(_frame(0x9, b"") + _frame(0x0, b"\x00", fin=False))
                ws.recv(timeout=0.2)
            except TimeoutError:
                continue
            except (ConnectionClosed, OSError):
                closed = True
        assert closed, "the connection was never closed"
        while srv.timeouts["message"] == before and time.monotonic() < stop:
            time.sleep(0.05)
        assert srv.timeouts["message"] == before + 1
    finally:
        srv.message_timeout = 10.0


def _wait_open_below(srv, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(srv._open) >= n and time.monotonic() < deadline:
        time.sleep(0.05)


def _closed_with(ws) -> int | None:
    """The close code the server sent ``ws`` (None: it is still open after 10 s)."""
    from websockets.exceptions import ConnectionClosed

    try:
        ws.recv(timeout=10)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None
    except TimeoutError:
        return None
    raise AssertionError("the server sent a message unasked")


def test_a_full_server_evicts_the_longest_idle_connection(server):
    srv, port = server
    _wait_open_below(srv, 1)  # connections of earlier tests are gone
    srv.max_connections = 2
    try:
        before = _health(port)["evicted_connections"]
        a, b = _connect(port), _connect(port)
        assert isinstance(_ask(b, _obs()), np.ndarray)  # b was active last: a is the longest idle
        c = _connect(port)
        assert _closed_with(a) == 1013
        assert isinstance(_ask(c, _obs()), np.ndarray) and isinstance(_ask(b, _obs()), np.ndarray)
        health = _health(port)
        assert health["evicted_connections"] == before + 1 and health["connections"] == 2
        b.close()
        c.close()
    finally:
        srv.max_connections = 32


def test_a_full_server_whose_connections_all_have_a_request_in_flight_refuses(server):
    from websockets.sync.client import connect

    srv, port = server
    _wait_open_below(srv, 1)
    srv.max_connections = 2
    try:
        before = _health(port)
        busy = [connect(f"ws://127.0.0.1:{port}", compression=None, close_timeout=0.1) for _ in range(2)]
        for ws in busy:
            ws.recv(timeout=10)  # metadata
        for ws in busy:  # a request begun and not finished: in flight, never evicted
            ws.socket.sendall(b"\x82" + bytes([0x80 | 100]) + b"\x00" * 4 + b"\x00" * 10)
        time.sleep(0.2)
        with pytest.raises(Exception, match="503"):
            _connect(port)
        after = _health(port)
        assert after["refused_connections"] == before["refused_connections"] + 1
        assert after["evicted_connections"] == before["evicted_connections"]
        for ws in busy:
            ws.close()
    finally:
        srv.max_connections = 32


def test_idle_sessions_and_silent_sockets_do_not_lock_the_robot_client_out(caplog):
    """50 idle authenticated sessions (cap 32) and 200 silent TCP sockets: the robot's client still
    gets in and gets actions; every session closed to make room is counted and logged."""
    from websockets.sync.client import connect

    torch.manual_seed(0)
    srv = PolicyServer(policies.make("flow", chunk_size=H, **TINY), api_key="k3y")
    caplog.set_level("WARNING", logger="real_robot.server")
    idle, silent = [], []
    with ServerThread(srv) as port:
        try:
            for _ in range(50):
                ws = connect(
                    f"ws://127.0.0.1:{port}", compression=None, additional_headers=protocol.auth_headers("k3y")
                )
                ws.recv(timeout=10)  # metadata
                idle.append(ws)
            silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(200)]
            robot = PolicyClient(f"ws://127.0.0.1:{port}", api_key="k3y", timeout=5.0)
            robot.connect()
            assert robot.infer(_obs(), timeout=5.0)[0].shape == (H, A)
            robot.close()
            evicted = 50 - srv.max_connections + 1  # one per session beyond the cap, one for the robot
            assert _health(port)["evicted_connections"] == evicted
            assert sum("evicted the connection" in r.getMessage() for r in caplog.records) == evicted
            assert _closed_with(idle[0]) == 1013  # the oldest idle session went first
        finally:
            for ws in idle:
                ws.close()
            for sock in silent:
                sock.close()


def test_a_plain_tcp_peer_without_handshake_is_dropped():
    torch.manual_seed(0)
    srv = PolicyServer(policies.make("flow", chunk_size=H, **TINY), open_timeout_s=0.5)
    with ServerThread(srv) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"GET / HTTP/1.1\r\n")  # half a request line, then silence
        assert sock.recv(1024) == b""  # closed by the server once the handshake deadline passed
        sock.close()


def test_bad_deadlines_are_refused():
    policy = policies.make("flow", chunk_size=H, **TINY)
    for bad in ({"idle_timeout_s": 0}, {"message_timeout_s": -1}, {"max_connections": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PolicyServer(policy, **bad)


def test_healthz_reports_the_deadlines(server):
    _, port = server
    health = _health(port)
    assert health["deadlines_s"]["idle"] > 0 and health["max_connections"] >= 1
    assert {"idle", "message", "reply"} <= set(health["timeouts"]) and "unsafe_replies" in health


def test_openpi_client_gets_actions_and_the_api_key_is_checked(tiny_server):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    server, port = tiny_server
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").read())
    assert health["status"] == "ok" and health["spec"]["chunk_size"] == 6
    client = WebsocketClientPolicy("127.0.0.1", port, api_key="s3cret")
    meta = client.get_server_metadata()
    assert meta["action_dim"] == 7 and "observation/images/wrist" in meta["request_keys"]
    reply = client.infer(_obs(48))
    assert reply["actions"].shape == (6, 7) and reply["actions"].dtype == np.float32
    assert {"decode_ms", "preprocess_ms", "infer_ms", "queue_ms"} <= set(reply["server_timing"])
    with pytest.raises(RuntimeError, match="NaN"):
        client.infer({**_obs(), "observation/state": np.full(15, np.nan, np.float32)})
    assert client.infer(_obs())["actions"].shape == (6, 7)  # still serving this connection
    for key in (None, "wrong"):
        with pytest.raises(Exception, match="401"):
            WebsocketClientPolicy("127.0.0.1", port, api_key=key)
