"""A malformed-request fuzzer for the policy server, on loopback only.

    python -m real_robot.fuzz --messages 10000 --out runs/fuzz.json        # a tiny flow policy, in-process
    python -m real_robot.fuzz --checkpoint CKPT --messages 10000 --out ... # a real bundle, in-process
    python -m real_robot.fuzz --port 8000 --api-key KEY --messages 10000   # a running embodied-serve here

Every message is drawn from one of :data:`KINDS` (valid requests among them, with and without
real-time chunking) and each reply is judged:

- ``answered``: a reply came within ``--reply-timeout`` (else ``unanswered``);
- a valid-looking binary reply must hold an ``actions`` chunk that passes
  :meth:`real_robot.spec.PolicySpec.check_actions` (shape, finite, within the action range), else
  it counts under ``bad_actions``;
- an ``"error: ..."`` text frame is the expected answer to a malformed request;
- a connection the server closes with 1009 (a message over its size limit: by design) counts as
  ``closed_oversize``, any other close as ``dropped``; ``crashes`` counts a server that stopped
  answering ``/healthz``.

The run stops after ``--messages`` messages or ``--max-seconds``, whichever comes first, and
writes a JSON summary (per kind). It only ever connects to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from real_robot import protocol
from real_robot.spec import IMAGE_PREFIX, PROMPT_KEY, RTC_FROZEN_KEY, RTC_PREV_KEY, STATE_KEY, PolicySpec

HOST = "127.0.0.1"
OVERSIZE = "oversize"


def good_request(spec: PolicySpec, rng: np.random.Generator, size: int | None = None) -> dict[str, Any]:
    """A valid request for ``spec`` (random state within [-1, 1], random images)."""
    size = size or spec.image_size
    obs: dict[str, Any] = {
        STATE_KEY: rng.uniform(-1, 1, spec.state_dim).astype(np.float32),
        PROMPT_KEY: "pick up the object",
    }
    for cam in spec.cameras:
        obs[IMAGE_PREFIX + cam] = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    return obs


def _pick(rng: np.random.Generator, options: list) -> Any:
    return options[int(rng.integers(len(options)))]


def _nasty_floats(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    pool = np.array([np.nan, np.inf, -np.inf, 1e300, -1e300, 3.4e38, 3.5e38, 1e-320, 5.0, -5.0, 1.0000001, 0.0])
    out = rng.uniform(-1, 1, shape)
    mask = rng.random(shape) < 0.3
    out[mask] = rng.choice(pool, int(mask.sum()))
    with np.errstate(over="ignore", invalid="ignore"):
        return out.astype(dtype)


def _rtc(spec: PolicySpec, rng: np.random.Generator, prev: np.ndarray | None = None, frozen: Any = None) -> dict:
    length = int(rng.integers(0, spec.chunk_size + 1))
    if prev is None:
        prev = rng.uniform(-1, 1, (length, spec.action_dim)).astype(np.float32)
    if frozen is None:
        frozen = int(rng.integers(0, max(1, min(len(prev), spec.chunk_size - 1) + 1)))
    return {RTC_PREV_KEY: prev, RTC_FROZEN_KEY: frozen}


def _kinds(spec: PolicySpec) -> dict[str, Callable[[np.random.Generator], bytes | str]]:
    """Message makers by kind; each returns the frame to send."""
    pack = protocol.packb
    good = lambda rng: good_request(spec, rng)  # noqa: E731
    a_dim, h = spec.action_dim, spec.chunk_size
    image_keys = [IMAGE_PREFIX + c for c in spec.cameras]

    def missing(rng):
        obs = good(rng)
        drop = list(obs)[int(rng.integers(len(obs)))]
        return pack({k: v for k, v in obs.items() if k != drop})

    def image_dtype(rng):
        if not image_keys:
            return pack({**good(rng), STATE_KEY: np.zeros(spec.state_dim, np.int32)})
        dt = _pick(rng, [np.float16, np.int32, np.uint16, np.float64, np.int8, np.bool_])
        return pack({**good(rng), image_keys[-1]: np.zeros((spec.image_size, spec.image_size, 3), dt)})

    def image_size(rng):
        if not image_keys:
            return pack({**good(rng), STATE_KEY: np.zeros(spec.state_dim + 1, np.float32)})
        side = int(_pick(rng, [0, 1, spec.min_image - 1, spec.max_image + 1]))
        shape = [(side, side, 3), (spec.image_size, spec.image_size), (spec.image_size, spec.image_size, 4)][
            int(rng.integers(3))
        ]
        return pack({**good(rng), image_keys[0]: np.zeros(shape, np.uint8)})

    def state_shape(rng):
        shape = tuple(int(s) for s in rng.integers(0, 40, int(rng.integers(0, 4))))
        shape = (spec.state_dim + 1,) if shape == (spec.state_dim,) else shape
        return pack({**good(rng), STATE_KEY: np.zeros(shape, np.float32)})

    def state_values(rng):
        state = _nasty_floats(rng, (spec.state_dim,), _pick(rng, [np.float32, np.float64]))
        state[int(rng.integers(spec.state_dim))] = _pick(
            rng, [np.nan, np.inf, 1e300 if state.dtype == np.float64 else -np.inf]
        )
        return pack({**good(rng), STATE_KEY: state})

    def prompt(rng):
        return pack({**good(rng), PROMPT_KEY: [1, b"x", "", "x" * 5000, None, 3.5, ["a"]][int(rng.integers(7))]})

    def lying_header(rng):
        n = int(rng.integers(0, 64))
        return pack(
            {
                **good(rng),
                STATE_KEY: {
                    "__ndarray__": True,
                    "data": b"\x00" * n,
                    "dtype": _pick(rng, ["<f4", "|O", "<c8", "V8", "<U3", "xx", "<f4" * 9]),
                    "shape": _pick(rng, [[spec.state_dim], [-1], [2**40], [1] * 20, "15"]),
                },
            }
        )

    def scalar(rng):
        value = _pick(rng, [1e300, 2**64 - 1, -1, True, "x"])
        return pack(
            {
                **good(rng),
                RTC_FROZEN_KEY: {
                    "__npgeneric__": True,
                    "data": value,
                    "dtype": _pick(rng, ["<i1", "<u2", "<f2", "|b1"]),
                },
            }
        )

    def not_a_map(rng):
        return pack([[1, 2, 3], "text", 7, None, b"raw", 1.5][int(rng.integers(6))])

    def garbage(rng):
        if rng.random() < 0.5:
            return bytes(rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8))
        return pack(good(rng))[: int(rng.integers(1, 200))]  # truncated msgpack

    def text(rng):
        return ["not binary", "", '{"prompt": 1}', "\x00" * 100][int(rng.integers(4))]

    def deep(rng):  # arrays of one element nested 100..5000 deep (raw bytes: packb caps the depth)
        return b"\x91" * int(rng.integers(100, 5000)) + b"\x01"

    def rtc_values(rng):
        length = int(rng.integers(1, h + 1))
        prev = _nasty_floats(rng, (length, a_dim), _pick(rng, [np.float32, np.float64]))
        return pack({**good(rng), **_rtc(spec, rng, prev=prev)})

    def rtc_frozen(rng):
        prev = np.zeros((int(rng.integers(0, h + 1)), a_dim), np.float32)
        frozen = _pick(rng, [-1, h, h + 5, len(prev) + 1, 2**40, True, 1.5, "2", None])
        return pack({**good(rng), **_rtc(spec, rng, prev=prev, frozen=frozen)})

    def rtc_shape(rng):
        shape = [(h + 1, a_dim), (2, a_dim + 1), (a_dim,), (1, 2, a_dim)][int(rng.integers(4))]
        rtc = _rtc(spec, rng, prev=np.zeros(shape, np.float32), frozen=0)
        if rng.random() < 0.3:
            rtc.pop(RTC_FROZEN_KEY if rng.random() < 0.5 else RTC_PREV_KEY)
        return pack({**good(rng), **rtc})

    def valid(rng):
        return pack(good(rng))

    def valid_rtc(rng):
        if spec.family != "flow":
            return pack(good(rng))
        return pack({**good(rng), **_rtc(spec, rng)})

    def oversize(rng):
        return b"\x92" + b"\xc5\xff\xff" + b"\x00" * 65535 * 20

    return {
        "missing_key": missing,
        "extra_key": lambda rng: pack({**good(rng), f"extra{rng.integers(99)}": 1}),
        "image_dtype": image_dtype,
        "image_size": image_size,
        "state_shape": state_shape,
        "state_values": state_values,
        "prompt": prompt,
        "lying_header": lying_header,
        "scalar": scalar,
        "not_a_map": not_a_map,
        "garbage": garbage,
        "text": text,
        "deep": deep,
        "rtc_values": rtc_values,
        "rtc_frozen": rtc_frozen,
        "rtc_shape": rtc_shape,
        "valid": valid,
        "valid_rtc": valid_rtc,
        OVERSIZE: oversize,
    }


KINDS = tuple(_kinds(PolicySpec("flow", 7, 4, 15, ("a",), 32, 20.0)))


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=10) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - any failure to answer is a dead server here
        return False


def fuzz(
    port: int,
    *,
    messages: int = 10000,
    max_seconds: float = 600.0,
    seed: int = 0,
    api_key: str | None = None,
    reply_timeout: float = 30.0,
    oversize_every: int = 500,
    progress: bool = False,
) -> dict[str, Any]:
    """Send ``messages`` drawn from :data:`KINDS` to the server on ``127.0.0.1:port``; the summary."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    rng = np.random.default_rng(seed)
    headers = protocol.auth_headers(api_key)

    def open_ws():
        ws = connect(
            f"ws://{HOST}:{port}",
            additional_headers=headers,
            max_size=None,
            compression=None,
            open_timeout=reply_timeout,
        )
        meta = protocol.unpackb(ws.recv(timeout=reply_timeout))
        return ws, PolicySpec.from_metadata(meta)

    ws, spec = open_ws()
    makers = _kinds(spec)
    drawn = [k for k in makers if k != OVERSIZE]
    per_kind: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    started = time.perf_counter()
    sent = 0
    try:
        while sent < messages and time.perf_counter() - started < max_seconds:
            kind = (
                OVERSIZE
                if oversize_every and sent % oversize_every == oversize_every - 1
                else drawn[int(rng.integers(len(drawn)))]
            )
            msg = makers[kind](rng)
            sent += 1
            per_kind[kind]["sent"] += 1
            try:
                ws.send(msg)
                reply = ws.recv(timeout=reply_timeout)
            except TimeoutError:
                outcome = "unanswered"
            except ConnectionClosed as closed:
                # 1009: over the server's message limit, closed by design; any other close is a drop
                code = closed.rcvd.code if closed.rcvd is not None else None
                outcome = "closed" if code == 1009 else "dropped"
            else:
                if isinstance(reply, str):
                    outcome = "error_reply" if reply.startswith("error:") else "bad_reply"
                else:
                    try:
                        body = protocol.unpackb(reply)
                        problem = spec.check_actions(body.get("actions") if isinstance(body, dict) else None)
                    except protocol.ProtocolError as err:
                        problem = str(err)
                    outcome = "actions" if problem is None else "bad_actions"
            per_kind[kind][outcome] += 1
            totals[outcome] += 1
            if outcome in ("unanswered", "closed", "dropped"):
                try:
                    ws.close()
                except Exception:  # noqa: BLE001
                    pass
                if not _healthy(port):
                    totals["crashes"] += 1
                    break
                ws, _ = open_ws()
            if progress and sent % 1000 == 0:
                print(f"fuzz: {sent} messages, {dict(totals)}", file=sys.stderr, flush=True)
    finally:
        try:
            ws.close()
        except Exception:  # noqa: BLE001
            pass
    if totals["crashes"] == 0 and not _healthy(port):
        totals["crashes"] += 1
    seconds = time.perf_counter() - started
    return {
        "messages": sent,
        "seconds": round(seconds, 2),
        "kinds": len(per_kind),
        "crashes": totals["crashes"],
        "unanswered": totals["unanswered"],
        "bad_actions": totals["bad_actions"],
        "bad_replies": totals["bad_reply"],
        "dropped": totals["dropped"],
        "closed_oversize": totals["closed"],
        "error_replies": totals["error_reply"],
        "action_replies": totals["actions"],
        "per_kind": {k: dict(v) for k, v in sorted(per_kind.items())},
    }


def passed(summary: dict[str, Any]) -> bool:
    """No crash, no unanswered request, no reply with a bad action or of an unknown form, no drop."""
    return not any(summary[k] for k in ("crashes", "unanswered", "bad_actions", "bad_replies", "dropped"))


def _tiny_policy() -> Any:
    import torch

    import policies

    torch.manual_seed(0)
    return policies.make(
        "flow", chunk_size=6, d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m real_robot.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=10000)
    p.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long whatever the count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, help="fuzz an embodied-serve already listening on 127.0.0.1:PORT")
    p.add_argument("--api-key", default=None)
    p.add_argument("--checkpoint", help="serve this bundle in-process (default: a tiny random flow policy)")
    p.add_argument("--reply-timeout", type=float, default=30.0)
    p.add_argument("--out", help="write the JSON summary here")
    args = p.parse_args(argv)
    if args.messages < 1 or args.max_seconds <= 0:
        p.error("--messages must be >= 1 and --max-seconds > 0")
    if args.port is not None:
        summary = fuzz(
            args.port,
            messages=args.messages,
            max_seconds=args.max_seconds,
            seed=args.seed,
            api_key=args.api_key,
            reply_timeout=args.reply_timeout,
            progress=True,
        )
    else:
        import policies
        from real_robot.server import PolicyServer, ServerThread

        policy = policies.load(args.checkpoint) if args.checkpoint else _tiny_policy()
        server = PolicyServer(policy, api_key=args.api_key, max_message_bytes=1 << 20)
        with ServerThread(server) as port:
            summary = fuzz(
                port,
                messages=args.messages,
                max_seconds=args.max_seconds,
                seed=args.seed,
                api_key=args.api_key,
                reply_timeout=args.reply_timeout,
                progress=True,
            )
            summary["server"] = {
                "requests": server.requests,
                "errors": server.errors,
                "unsafe_replies": server.unsafe_replies,
            }
    summary["passed"] = passed(summary)
    text = json.dumps(summary, indent=2)
    if args.out:
        from embodied.runs import write_json

        write_json(Path(args.out), summary)
    print(text)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
