"""Deploy a checkpoint to SimRobot through the policy server: the rehearsal before a real arm.

What it shows: ``embodied-serve`` (the checkpoint behind websocket + msgpack, openpi's wire format)
and ``embodied-deploy robot=sim`` (the fixed-rate robot client: asynchronous chunks, the safety filter,
the watchdog) driving ``SimRobot``, a suite scene stepped in real time; each episode's end reason and
the recorded episodes (``OUT/dataset``, usable by ``embodied-sft``) land in ``OUT/deploy.json``.

    python examples/deploy_sim_robot.py --checkpoint runs/pipeline/rl/checkpoint/policy --task 8 --episodes 3 --out runs/ex_deploy
    python examples/deploy_sim_robot.py --tiny --out /tmp/ex_deploy     # a tiny random checkpoint, 10 steps
    python examples/deploy_sim_robot.py ... -- mode=rtc sim.obs_latency_steps=2   # any other embodied-deploy key

For a real arm, run the same server on the GPU machine and ``embodied-deploy robot=network`` on the
robot's side (docs/guide/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from _helpers import BIN, embodied_serve, tiny_checkpoint


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a policy bundle made for the suite's scenes (state, cameras)")
    p.add_argument("--suite", default="goal")
    p.add_argument("--task", type=int, default=8)
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--tiny", action="store_true", help="test size: a tiny untrained checkpoint, 10 steps")
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="more embodied-deploy keys (after --)")
    args = p.parse_args(argv)
    if not args.checkpoint and not args.tiny:
        p.error("give --checkpoint BUNDLE (or --tiny)")

    out = Path(args.out)
    work = out.with_name(out.name + "_server")
    ckpt = args.checkpoint or tiny_checkpoint(work / "policy")  # our suites' 15-D state, two cameras
    steps = 10 if args.tiny else args.max_steps
    with embodied_serve(ckpt, work / "serve.log") as port:
        robot = ["robot=sim", f"sim.suite={args.suite}", f"sim.task={args.task}"]
        run = [f"server=ws://127.0.0.1:{port}", *robot, f"episodes={args.episodes}", f"max_steps={steps}"]
        subprocess.run([str(BIN / "embodied-deploy"), *run, f"out={out}", *args.overrides], check=True)

    report = json.loads((out / "deploy.json").read_text())
    for i, episode in enumerate(report["episodes"]):
        print(f"episode {i}: {episode['reason']} after {episode['steps']} steps")
    print(f"recorded episodes: {out / 'dataset'}")


if __name__ == "__main__":
    main()
