"""What the examples share (not an example itself): ``embodied-serve`` as a process on a free local port,
and the tiny randomly initialised checkpoint their ``--tiny`` runs use."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

#: the folder of this interpreter's console scripts (embodied-serve, embodied-eval, ...)
BIN = Path(sys.executable).parent
#: the tiny flow policy of the --tiny runs (seconds on a CPU; it has learned nothing)
TINY_POLICY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1, chunk_size=4)


def tiny_checkpoint(path: Path, **fields: object) -> Path:
    """A randomly initialised tiny flow policy saved as a bundle at ``path`` (``fields``: its state,
    actions and cameras)."""
    import policies

    policies.save(policies.make("flow", **TINY_POLICY, **fields), path)
    return path


@contextlib.contextmanager
def embodied_serve(checkpoint: Path, log: Path, *keys: str, timeout_s: float = 300.0) -> Iterator[int]:
    """``embodied-serve checkpoint=... port=0 KEYS`` in its own process, its output in ``log``; yields the
    port once the warm-up inference is done, and stops the server after."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "embodied-serve"), f"checkpoint={checkpoint}", "port=0", *keys],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while "listening on port" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"embodied-serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        line = next(x for x in log.read_text().splitlines() if "listening on port" in x)
        yield int(line.rsplit(" ", 1)[1])
    finally:
        proc.terminate()
        proc.wait(15)
