"""Writes the task table of LIBERO's standard suites (``sims/libero/tasks.json``) from the LIBERO
package: per task its index, name, instruction, goal predicates and movable objects, parsed from its
BDDL file (no simulation).

    python -m reference.task_table --out sims/libero/tasks.json        (in .venv-libero)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def table() -> dict:
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    root = Path(get_libero_path("bddl_files"))
    out = {}
    for name in SUITES:
        suite = benchmark.get_benchmark(name)(task_order_index=0)
        rows = []
        for index in range(suite.n_tasks):
            task = suite.get_task(index)
            problem = robosuite_parse_problem(str(root / task.problem_folder / task.bddl_file))
            objects = sorted(o for names in problem["objects"].values() for o in names)
            rows.append(
                {
                    "index": index,
                    "name": task.name,
                    "language": task.language,
                    "goal": [list(p) for p in problem["goal_state"]],
                    "objects": objects,
                }
            )
        out[name] = rows
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.task_table", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(table(), indent=1) + "\n")
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
