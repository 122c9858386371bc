"""Benchmarks whose numbers go in docs/explanation/measurements.md. Measured side by side in one run, reported as ratios,
because the machines are shared and noisy.

`bench up`: wall time of `labctl up --nodes N` (a fresh process, as a user types it: config,
render, compose up, wait until every node reports torch) against a raw `docker compose up -d` of
the very file labctl generated, alternating the two so drift in the machine's load hits both.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.lab.lifecycle import apply_down, lab_dir
from labctl.proc import run

BENCH_LAB = "bench-up"


@dataclass(frozen=True)
class UpTiming:
    nodes: int
    repeats: int
    labctl_s: float  # median
    compose_s: float  # median
    ratio: float

    def as_dict(self) -> dict:
        return asdict(self)


def _timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    run(argv, cwd=cwd, timeout_s=600)
    return time.perf_counter() - started


def bench_up(client, workspace: Path, nodes_list: list[int], repeats: int, report) -> list[UpTiming]:
    results = []
    compose_file = lab_dir(workspace, BENCH_LAB) / "compose.yaml"
    labctl = [sys.executable, "-m", "labctl", "up", "--lab", BENCH_LAB]
    raw = ["docker", "compose", "-f", str(compose_file), "-p", BENCH_LAB, "up", "-d"]
    try:
        for nodes in nodes_list:
            apply_down(client, BENCH_LAB)
            # One untimed labctl up renders the compose file the raw runs use, and warms caches.
            run(labctl + ["--nodes", str(nodes)], cwd=workspace, timeout_s=600)
            ours, theirs = [], []
            for i in range(repeats):
                order = [("labctl", labctl + ["--nodes", str(nodes)]), ("compose", raw)]
                for which, argv in order if i % 2 == 0 else reversed(order):
                    apply_down(client, BENCH_LAB)
                    (ours if which == "labctl" else theirs).append(_timed(argv, workspace))
            timing = UpTiming(nodes, repeats, statistics.median(ours), statistics.median(theirs),
                              statistics.median(ours) / statistics.median(theirs))
            report(f"{nodes} nodes: labctl up {timing.labctl_s:.2f} s, docker compose up -d {timing.compose_s:.2f} s, "
                   f"ratio {timing.ratio:.2f}")
            results.append(timing)
    finally:
        apply_down(client, BENCH_LAB, volumes=True)
    return results
