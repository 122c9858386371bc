"""torch.compile on the lab: the node image carries a C++ compiler and the Python headers, so a
DDP script that compiles its model runs on every node, and the nodes keep inductor's cache on the
lab's shared volume (labctl/lab/compose.py's compile_cache_dir), so a second run reuses what the
first compiled. doctor names a node that cannot compile."""

from __future__ import annotations

import random
import re
from typing import NamedTuple

import pytest

from conftest import SCRIPTS, labctl, summary_of

pytestmark = pytest.mark.integration
LINE = re.compile(r"COMPILED rank=(\d+) compile_s=([\d.-]+) step_ms=([\d.]+) checksum=(\S+) cache_hits=(\d+) "
                  r"cache_misses=(\d+)")


class Rank(NamedTuple):
    """What one rank of compiled_ddp.py printed."""

    compile_s: float
    checksum: str
    hits: int  # graphs inductor found in the cache
    misses: int  # graphs it compiled


def compiled_run(lab: str, width: int, *options: str, said: list | None = None) -> dict[int, Rank]:
    """Each rank's line from one run of compiled_ddp.py (its terminal output appended to `said`)."""
    result = labctl("run", "--lab", lab, *options, "--", str(SCRIPTS / "compiled_ddp.py"), "5", str(width),
                    check=True, timeout=600)
    if said is not None:
        said.append(result.stdout + result.stderr)
    lines = LINE.findall(result.stdout)
    found = {int(r): Rank(float(c), s, int(hits), int(misses)) for r, c, _, s, hits, misses in lines}
    assert sorted(found) == [0, 1, 2], result.stdout[-3000:]
    return found


def test_a_compiled_ddp_script_runs_on_every_node_and_the_second_run_reuses_the_shared_cache(lab3):
    lab3, _ = lab3
    width = random.randint(65, 4096)  # a graph no earlier run on this lab compiled: the first run is cold
    headers = 'ls /opt/inductor-headers/*.gch'  # the image's precompiled C++ header (the Dockerfile)
    baked = labctl("exec", "--lab", lab3, "node2", "--", "sh", "-c", headers, check=True).stdout.split()
    assert baked, "the image has no precompiled header for inductor"
    first = compiled_run(lab3, width)
    assert len({r.checksum for r in first.values()}) == 1, first  # DDP kept every rank in step
    assert all(r.hits == 0 and r.misses > 0 for r in first.values()), first
    second = compiled_run(lab3, width)
    # Every graph came from the shared cache (the hits and misses say so); what is left of the compile
    # time is dynamo's tracing and torch's checks (its source hash, the header's preprocessing), 3.5 to
    # 4 s on an idle machine against a cold 9 to 15 s with the image's precompiled header
    # (docs/how-to/compile.md). That ratio is the machine's: beside two other test workers on a machine
    # at half speed, 14.3 s against 22.7 (2026-12-07), so the test asks only that reuse is quicker.
    assert all(r.hits > 0 and r.misses == 0 for r in second.values()), second
    for rank, cold in first.items():
        assert second[rank].compile_s < cold.compile_s, (rank, first, second)
    checksums = {r.checksum for r in first.values()}
    assert {r.checksum for r in second.values()} == checksums, (first, second)
    # A corrupt entry is never fatal: each rank compiles afresh and labctl says so once per rank. This
    # run is torchrun's too: its workers compile to the same parameters as the fork servers' ranks.
    labctl("exec", "--lab", lab3, "node0", "--", "sh", "-c",
           'for f in $(find "$TORCHINDUCTOR_CACHE_DIR/fxgraph" -type f); do echo garbage > "$f"; done', check=True)
    said: list[str] = []
    corrupt = compiled_run(lab3, width, "--launcher", "torchrun", said=said)
    assert {r.checksum for r in corrupt.values()} == checksums, (first, corrupt)
    assert said[0].count("an entry of the compile cache could not be used") == 3, said[0][-3000:]
    assert "codecache.py" not in said[0], said[0][-3000:]  # torch's warnings went to the logs
    # The graphs and kernels are on the shared volume; the node's own /tmp keeps only the link to the
    # image's precompiled C++ header (torch._inductor.codecache._HEADER_DIR, not moved by the variable),
    # which served the cold compile: no rank made a header of its own.
    shared = labctl("exec", "--lab", lab3, "node2", "--", "sh", "-c", 'ls "$TORCHINDUCTOR_CACHE_DIR"', check=True)
    local = labctl("exec", "--lab", lab3, "node2", "--", "sh", "-c", "ls /tmp/torchinductor_* 2>/dev/null || true",
                   check=True)
    link = labctl("exec", "--lab", lab3, "node2", "--", "sh", "-c", "readlink /tmp/torchinductor_*/precompiled_headers",
                  check=True)
    assert {"fxgraph", "aotautograd"} <= set(shared.stdout.split()), shared.stdout
    assert local.stdout.split() == ["precompiled_headers"] and link.stdout.strip() == "/opt/inductor-headers", \
        (local.stdout, link.stdout)
    assert labctl("exec", "--lab", lab3, "node2", "--", "sh", "-c", headers, check=True).stdout.split() == baked


def test_doctor_names_a_node_that_cannot_compile(lab3, docker_client):
    lab, _ = lab3
    ok = labctl("doctor", "--lab", lab, check=True)
    assert re.search(r"ok +compiler +g\+\+ \S+ and the Python headers on every node", ok.stdout), ok.stdout
    node1 = docker_client.containers.get(f"{lab}-node1")
    moved = node1.exec_run(["mv", "/usr/bin/g++", "/usr/local/g++.away"], user="0")
    assert moved.exit_code == 0, moved.output
    try:
        warned = labctl("doctor", "--lab", lab, check=True)  # a warning: runs that do not compile still work
        assert re.search(r"WARN compiler +node1: cannot build torch.compile's kernels: no C\+\+ compiler",
                         warned.stdout), warned.stdout
        assert "node0: cannot build" not in warned.stdout and "node2: cannot build" not in warned.stdout
    finally:
        assert node1.exec_run(["mv", "/usr/local/g++.away", "/usr/bin/g++"], user="0").exit_code == 0


def test_the_trainers_compile_flag_compiles_on_every_rank_and_says_for_how_long(lab3):
    lab, _ = lab3
    # --fresh-compile-cache empties the shared folder first (a file left there goes) and the run fills it again.
    labctl("exec", "--lab", lab, "node1", "--", "sh", "-c", 'mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && '
           'touch "$TORCHINDUCTOR_CACHE_DIR/left-before"', check=True)
    result = labctl("run", "--lab", lab, "--fresh-compile-cache", "--", "-m", "trainer", "--compile", "--epochs", "1",
                    "--samples", "768", "--hidden", str(random.randint(65, 4096)), check=True, timeout=600)
    assert re.search(r"node0, node1, node2: compile cache /shared/compile/[0-9a-f]{12} emptied", result.stderr), \
        result.stderr[-2000:]
    after = labctl("exec", "--lab", lab, "node2", "--", "sh", "-c", 'ls "$TORCHINDUCTOR_CACHE_DIR"', check=True)
    assert "left-before" not in after.stdout.split() and "fxgraph" in after.stdout.split(), after.stdout
    said = re.findall(r"\[rank (\d)/3 \S+\] compiled in ([\d.]+) s", result.stdout)
    assert sorted(rank for rank, _ in said) == ["0", "1", "2"], result.stdout[-3000:]
    summary = summary_of(result.stdout)
    assert summary["replicas_consistent"] and len(summary["compile_s_per_rank"]) == 3, summary
    assert summary["compile_s"] == max(summary["compile_s_per_rank"]) > 0, summary
    printed = {int(rank): float(s) for rank, s in said}  # to 2 decimals; the SUMMARY's to 3
    assert all(abs(printed[r] - s) <= 0.006 for r, s in enumerate(summary["compile_s_per_rank"])), (printed, summary)
