"""Benchmarks whose numbers go in docs/explanation/measurements.md. Measured side by side in one run, reported as ratios,
because the machines are shared and noisy.

`bench up`: wall time of `labctl up --nodes N` (a fresh process, as a user types it: config,
render, compose up, wait until every node reports torch) against a raw `docker compose up -d` of
the very file labctl generated, alternating the two so drift in the machine's load hits both.

With packages (`bench up --with tqdm`, `--requirements FILE`), a third way joins the rounds: `labctl
up` with them, its lock and package image found from an untimed first one, which is the `up` a user
types again with unchanged requirements. Before the rounds, the first `up` with them is timed once
from nothing: a cache folder of its own (DDPLAB_CACHE_DIR: no lock, no wheel) and the package image
removed, so it resolves, downloads, installs and commits.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.core.proc import run
from labctl.engine.labels import container_name
from labctl.image.packages import base_of
from labctl.lab.lifecycle import apply_down, lab_dir, lab_status

BENCH_LAB = "bench-up"


@dataclass(frozen=True)
class UpTiming:
    nodes: int
    repeats: int
    labctl_s: float  # median
    compose_s: float  # median
    ratio: float
    packages_s: float | None = None  # median of `up` with the packages, their lock and image found
    first_packages_s: float | None = None  # the first `up` with them: resolve, download, install, commit

    @property
    def packages_added_s(self) -> float | None:
        """What the packages add to a plain `up`, once made."""
        return None if self.packages_s is None else self.packages_s - self.labctl_s

    def as_dict(self) -> dict:
        return {**asdict(self), "packages_added_s": self.packages_added_s}


def _timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    run(argv, cwd=cwd, timeout_s=900, env=env)
    return time.perf_counter() - started


def bench_up(client, workspace: Path, nodes_list: list[int], repeats: int, report,
             packages: list[str] | None = None) -> list[UpTiming]:
    """`packages`: `up`'s own arguments for them (["--with", "tqdm"]), timed as a third way."""
    results = []
    compose_file = lab_dir(workspace, BENCH_LAB) / "compose.yaml"
    labctl = [sys.executable, "-m", "labctl", "up", "--lab", BENCH_LAB]
    raw = ["docker", "compose", "-f", str(compose_file), "-p", BENCH_LAB, "up", "-d"]
    try:
        for nodes in nodes_list:
            plain = labctl + ["--nodes", str(nodes), "--requirements", "none"]
            ways = {"labctl": plain, "compose": raw}
            first = None
            if packages:
                ways["packages"] = labctl + ["--nodes", str(nodes), *packages]
                first = time_first_up(client, workspace, ways["packages"])
                report(f"{nodes} nodes: the first labctl up with {' '.join(packages)} took {first:.2f} s "
                       "(resolve, download, install, commit)")
            apply_down(client, BENCH_LAB)
            # One untimed labctl up renders the compose file the raw runs use, and warms caches.
            run(plain, cwd=workspace, timeout_s=600)
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            for i in range(repeats):
                order = list(ways)[i % len(ways):] + list(ways)[:i % len(ways)]  # a different way first each round
                for way in order:
                    apply_down(client, BENCH_LAB)
                    seconds[way].append(_timed(ways[way], workspace))
            median = {way: statistics.median(s) for way, s in seconds.items()}
            timing = UpTiming(nodes, repeats, median["labctl"], median["compose"], median["labctl"] / median["compose"],
                              median.get("packages"), first)
            extra = f", with the packages {timing.packages_s:.2f} s" if packages else ""
            report(f"{nodes} nodes: labctl up {timing.labctl_s:.2f} s, docker compose up -d {timing.compose_s:.2f} s, "
                   f"ratio {timing.ratio:.2f}{extra}")
            results.append(timing)
    finally:
        apply_down(client, BENCH_LAB, volumes=True)
    return results


def time_first_up(client, workspace: Path, up: list[str]) -> float:
    """The first `up` with packages, from nothing: an untimed one names the package image it runs,
    which then goes with the lab; the timed one has a cache folder of its own (no lock, no wheel)."""
    apply_down(client, BENCH_LAB)
    run(up, cwd=workspace, timeout_s=900)
    images = {client.containers.get(container_name(BENCH_LAB, n.name)).image.id for n in lab_status(client, BENCH_LAB)}
    apply_down(client, BENCH_LAB)
    for image in images:
        if any(base_of(tag) != tag for tag in client.images.get(image).tags):
            client.images.remove(image, force=True)
    with tempfile.TemporaryDirectory(prefix="ddplab-bench-cache-") as cache:
        seconds = _timed(up, workspace, env={**os.environ, "DDPLAB_CACHE_DIR": cache})
    apply_down(client, BENCH_LAB)
    return seconds
