"""The recordings in this folder (written by record.py) rebuilt as the RunResult the executor made."""

from __future__ import annotations

import json
from pathlib import Path

from labctl.run.launch import Launch
from labctl.run.result import Outcome, RunResult

HERE = Path(__file__).resolve().parent


def recorded_lines(case: str, node: str) -> list[str]:
    """One node's output in recorded run `case`, as labctl read it."""
    data = json.loads((HERE / f"{case}.json").read_text())
    return next(o["lines"] for o in data["outcomes"] if o["node"] == node and o["label"] == node)


def recorded_run(case: str, run_dir: Path = Path("/runs/r1"), write_logs: bool = False) -> RunResult:
    """The RunResult of recorded run `case`; with `write_logs`, each node's log written to `run_dir`
    as the executor writes it."""
    data = json.loads((HERE / f"{case}.json").read_text())
    outcomes = []
    for o in data["outcomes"]:
        env = {"RANK": o["rank"]} if o["rank"] is not None else {}
        outcome = Outcome(Launch(o["label"], o["node"], [*o["argv"], "x.py"], env), o["exit_code"], o["stopped"],
                          list(o["lines"]))
        outcome.ended_at = o["ended_at"]
        outcomes.append(outcome)
        if write_logs:
            with open(run_dir / f"{o['node']}.log", "a") as log:
                log.writelines(line + "\n" for line in o["lines"])
    return RunResult(run_dir, outcomes, None, data["interrupted"], data["timed_out"], data["min_nodes"],
                     data["timeout_s"], data["live_ranks"], data["oom_kills"])
