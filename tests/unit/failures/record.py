"""Record what real failed runs print, for tests/unit/test_failures.py.

    .venv/bin/python tests/unit/failures/record.py LAB [CASE...]

Runs tests/integration/scripts/fail_how.py on the running 3-node lab LAB in each way it can fail,
and meets_a_limit.py where a case names it (a known limit of the nodes' torch), through labctl's
API with check=False, and writes each run's raw outcomes (every process's lines,
exit status, end time; the ranks still running and the OOM kills labctl's stop found) to
tests/unit/failures/<case>.json. The tests read these back; nothing in them is written by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from labctl.api import Lab

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SCRIPT = "tests/integration/scripts/fail_how.py"
LIMIT_SCRIPT = "tests/integration/scripts/meets_a_limit.py"

# case: (fail_how.py arguments, options of Lab.run, a node to `docker kill` after the group forms)
CASES = {
    "exit3": (["exit", "1", "3"], {}, None),
    "raise": (["raise", "1"], {}, None),
    "sigkill": (["kill", "1"], {}, None),
    "sigsegv": (["segv", "1"], {}, None),
    "hang-timeout": (["hang", "1"], {"timeout_s": 8}, None),
    "lost-node-nnodes": (["loop", "-1"], {"nnodes": "2:3", "timeout_s": 60}, "node1"),
    "static-exit3": (["exit", "2", "3"], {"launcher": "static"}, None),
    "static-raise": (["raise", "0"], {"launcher": "static"}, None),
    "static-sigkill": (["kill", "1"], {"launcher": "static"}, None),
    "limit-gloo-no-future": ([LIMIT_SCRIPT, "gloo-no-future"], {}, None),
    "limit-no-compiler-torchrun": ([LIMIT_SCRIPT, "no-compiler"], {"launcher": "torchrun"}, None),
}


def record(lab: Lab, case: str) -> dict:
    args, options, victim = CASES[case]
    script, args = (args[0], args[1:]) if args[0].endswith(".py") else (SCRIPT, args)
    killer = None
    if victim:
        def kill_when_ready() -> None:
            time.sleep(12)  # the group has formed and every rank waits in its collective
            subprocess.run(["docker", "kill", f"{lab.name}-{victim}"], check=True, capture_output=True)

        killer = threading.Thread(target=kill_when_ready)
        killer.start()
    result = lab.run(script, *args, preflight=False, check=False, **options)
    if killer:
        killer.join()
    return {
        "case": case, "argv": [script, *args], "options": options,
        "ok": result.ok, "timed_out": result.timed_out, "interrupted": result.interrupted,
        "min_nodes": result.min_nodes, "timeout_s": result.timeout_s,
        "live_ranks": result.live_ranks, "oom_kills": result.oom_kills,
        # argv: enough of it to tell a torchrun agent (the `torchrun` command, or `python -m` its module)
        "outcomes": [{"label": o.launch.label, "node": o.launch.node,
                      "argv": ["torchrun"] if o.launch.torchrun else o.launch.argv[:1],
                      "rank": o.launch.env.get("RANK"), "exit_code": o.exit_code, "stopped": o.stopped,
                      "ended_at": o.ended_at, "lines": o.lines} for o in result.outcomes],
        "labctl_said": result.explain().splitlines(), "exit_status": result.exit_status,
    }


def main() -> None:
    name, cases = sys.argv[1], sys.argv[2:] or list(CASES)
    lab = Lab(name, workspace=ROOT)
    for case in cases:
        data = record(lab, case)
        (HERE / f"{case}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"{case}: exit {data['exit_status']}: {data['labctl_said'][0]}", flush=True)
        if CASES[case][2]:
            lab.up()  # the killed node back


if __name__ == "__main__":
    main()
