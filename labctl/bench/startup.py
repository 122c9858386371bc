"""`bench start`: what a run costs before a script's first line and after its last, every way of
starting one, side by side on one lab: docs/explanation/start-up.md's table.

Each way is timed as a user meets it, as a fresh process from the shell, to the moment every part
of the run has exited: `labctl run` on the warm path, with the static launcher and with torchrun;
the same by hand (`docker exec` on every node at once, torchrun or a static launch); a typical DDP
tutorial `train.py` (one epoch) warm and under torchrun; and TorchX's local_docker scheduler, where
a `torchx` command is given. The ways alternate, round after round, so a change in the machine's
load hits them all alike; each is reported as the median of its rounds and its ratio to the warm
path's. The lab (bench-start) is brought up for the bench and removed after it; its folder is
removed before, so that `up` keeps nothing (a --preload, packages) of an earlier bench.

Each round begins with what a user meets first: the lab taken down (its volume kept), then `labctl
up` and, at once, the first warm run (FIRST_CONTACT), timed from `up`'s start to that run's end; then
the bench waits until every node's fork server has imported its LATER modules, so the other ways
find the lab as a user finds it a while after `up`.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from labctl.core.proc import run
from labctl.engine.labels import container_name
from labctl.errors import CommandError, StateError
from labctl.lab.lifecycle import apply_down, lab_dir
from labctl.run.warm import IMPORTED_LATER, SERVER_LOG, later_modules

BENCH_LAB = "bench-start"
SCRIPTS = Path(__file__).resolve().parent / "scripts"  # noop_ddp.py, train.py: copied into the lab's folder
RUN_TIMEOUT_S = 300
FIRST_CONTACT = "labctl up, then its first run (warm)"
IDLE_WAIT_S = 60  # at most, for every server's LATER imports after FIRST_CONTACT


@dataclass(frozen=True)
class StartTiming:
    way: str
    seconds: tuple[float, ...]  # one per round

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def as_dict(self, warm_s: float) -> dict:
        return {**asdict(self), "median_s": round(self.median_s, 3), "vs_warm": round(self.median_s / warm_s, 2)}


@dataclass(frozen=True)
class StartReport:
    nodes: int
    rounds: int
    timings: list[StartTiming]

    @property
    def warm_s(self) -> float:
        return self.timings[0].median_s

    def as_dict(self) -> dict:
        return {"nodes": self.nodes, "rounds": self.rounds, "timings": [t.as_dict(self.warm_s) for t in self.timings]}


def timed(argvs: list[list[str]], cwd: Path) -> float:
    """Seconds from starting every argv at once to the last one's exit; a failure is an error."""
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for argv in argvs]
    outputs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    seconds = time.perf_counter() - started
    for argv, proc, output in zip(argvs, procs, outputs):
        if proc.returncode != 0:
            raise CommandError(argv, proc.returncode, output.decode(errors="replace"))
    return seconds


def timed_in_turn(argvs: list[list[str]], cwd: Path) -> float:
    """Seconds from starting the first argv to the last one's exit, each started when the one before ended."""
    return sum(timed([argv], cwd) for argv in argvs)


def first_contact(client, workspace: Path, up: list[str], first_run: list[str], names: list[str],
                  later: list[str]) -> float:
    """FIRST_CONTACT's seconds: the lab down (volume kept), `up`, and at once `first_run`; then wait
    (untimed) until the nodes' fork servers have imported `later`, what they import once idle."""
    apply_down(client, BENCH_LAB)
    seconds = timed_in_turn([up, first_run], workspace)
    wanted = [IMPORTED_LATER % name for name in later]
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        logs = [run(["docker", "exec", name, "cat", SERVER_LOG], check=False).stdout for name in names]
        if all(line in log for log in logs for line in wanted):
            return seconds
        if time.monotonic() > deadline:  # the other ways would be timed beside those imports
            raise StateError(f"the fork servers of {BENCH_LAB} had not imported {', '.join(later)} "
                             f"{IDLE_WAIT_S} s after its first run (each node's {SERVER_LOG} says why)",
                             hint="labctl bench start --preload " + " --preload ".join(later) + " imports it at once")
        time.sleep(0.2)


def ways(workspace: Path, nodes: int, master: str, master_port: int,
         torchx: str | None) -> dict[str, Callable[[], list[list[str]]]]:
    """Each way of starting a run, as the argvs to start at once (made afresh per round: a new rendezvous id)."""
    folder = lab_dir(workspace, BENCH_LAB)
    noop, train = str(folder / "noop_ddp.py"), str(folder / "train.py")
    labctl = [sys.executable, "-m", "labctl", "run", "--lab", BENCH_LAB]
    names = [container_name(BENCH_LAB, f"node{i}") for i in range(nodes)]

    def by_hand_torchrun() -> list[list[str]]:  # the env files' PET_* do the rest, node0 hosts the store
        rdzv = uuid.uuid4().hex[:8]
        return [["docker", "exec", "-e", f"PET_RDZV_ID={rdzv}", name, "torchrun", noop] for name in names]

    def by_hand_static() -> list[list[str]]:
        env = ["-e", f"WORLD_SIZE={nodes}", "-e", "LOCAL_RANK=0", "-e", f"MASTER_ADDR={master}",
               "-e", f"MASTER_PORT={master_port}"]
        return [["docker", "exec", "-e", f"RANK={i}", *env, name, "python", noop] for i, name in enumerate(names)]

    table = {
        "labctl run (warm)": lambda: [labctl + ["--", noop]],
        "labctl run --launcher static": lambda: [labctl + ["--launcher", "static", "--", noop]],
        "labctl run --launcher torchrun": lambda: [labctl + ["--launcher", "torchrun", "--", noop]],
        "by hand: docker exec ... torchrun": by_hand_torchrun,
        "by hand: docker exec ... python (static)": by_hand_static,
        "train.py, 1 epoch: labctl run (warm)": lambda: [labctl + ["--", train]],
        "train.py, 1 epoch: labctl run --launcher torchrun": lambda: [labctl + ["--launcher", "torchrun", "--", train]],
    }
    if torchx:
        table["TorchX local_docker (dist.ddp)"] = lambda: [[torchx, "run", "--scheduler", "local_docker", "--wait",
                                                            "dist.ddp", "-j", f"{nodes}x1", "--script", "noop_ddp.py",
                                                            "--image", image_of(names[0])]]
    return table


def image_of(container: str) -> str:
    return run(["docker", "inspect", "--format", "{{.Config.Image}}", container]).stdout.strip()


TORCHX_LABEL = "torchx.pytorch.org/version"  # on the containers TorchX's local_docker runs and the images it builds
TORCHX_NETWORK = "torchx"


def torchx_objects(client) -> dict[str, set[str]]:
    """What TorchX's local_docker has left on the engine: its containers, its images, its network."""
    selector = {"label": TORCHX_LABEL}
    return {"containers": {c["Id"] for c in client.api.containers(all=True, filters=selector)},
            "images": {i["Id"] for i in client.api.images(filters=selector)},
            "networks": {n["Id"] for n in client.api.networks(names=[TORCHX_NETWORK])}}


def remove_torchx_objects(client, before: dict[str, set[str]]) -> None:
    """Remove what TorchX made during the bench (it leaves its exited containers, the image it built
    of the script's folder and its network behind), and nothing that was there before."""
    made = {kind: ids - before[kind] for kind, ids in torchx_objects(client).items()}
    for cid in made["containers"]:
        client.api.remove_container(cid, force=True)
    for iid in made["images"]:
        client.api.remove_image(iid, force=True)
    for nid in made["networks"]:
        client.api.remove_network(nid)


def measure(client, workspace: Path, nodes: int = 3, rounds: int = 5, torchx: str | None = None,
            report: Callable[[str], None] = lambda _line: None, up_args: list[str] | None = None,
            preload: tuple[str, ...] = ()) -> StartReport:
    """Bring up bench-start (with `up_args` besides, its packages, and `preload`, what its fork servers
    import too), time every way `rounds` times, alternating, and remove the lab."""
    if torchx and not shutil.which(torchx):
        raise StateError(f"no torchx command at {torchx}", hint="pip install torchx, then --torchx $(which torchx)")
    # --idle-imports on whatever the environment says: the bench times a lab as `up` leaves it by default
    up = [sys.executable, "-m", "labctl", "up", "--lab", BENCH_LAB, "--nodes", str(nodes), "--json",
          "--idle-imports", "on", *(up_args or []),
          *(a for module in preload for a in ("--preload", module))]
    later = later_modules(preload)
    apply_down(client, BENCH_LAB, volumes=True)
    # and what an earlier bench left in the lab's folder: `up` would keep its --preload and packages
    shutil.rmtree(lab_dir(workspace, BENCH_LAB), ignore_errors=True)
    torchx_before = torchx_objects(client) if torchx else None
    try:
        run(up, cwd=workspace, timeout_s=600)
        folder = lab_dir(workspace, BENCH_LAB)
        for script in ("noop_ddp.py", "train.py"):
            shutil.copy(SCRIPTS / script, folder / script)
        (folder / "torchx").mkdir(exist_ok=True)
        shutil.copy(SCRIPTS / "noop_ddp.py", folder / "torchx" / "noop_ddp.py")
        env = dict(line.split("=", 1) for line in (folder / "node0.env").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
        table = ways(workspace, nodes, env["MASTER_ADDR"], int(env["MASTER_PORT"]), torchx)
        # TorchX builds an image of the folder it runs from: one that holds the script alone
        workspace_for = {name: folder / "torchx" if name.startswith("TorchX") else workspace for name in table}
        timed(table["labctl run (warm)"](), workspace)  # untimed: waits out the fork servers' first import
        seconds: dict[str, list[float]] = {name: [] for name in [*table, FIRST_CONTACT]}
        names = [container_name(BENCH_LAB, f"node{i}") for i in range(nodes)]
        [warm_noop] = table["labctl run (warm)"]()
        for i in range(rounds):
            seconds[FIRST_CONTACT].append(first_contact(client, workspace, up, warm_noop, names, later))
            order = list(table)[i % len(table):] + list(table)[:i % len(table)]  # a different way first each round
            for name in order:
                seconds[name].append(timed(table[name](), workspace_for[name]))
            report(f"round {i + 1}/{rounds}: " + "; ".join(f"{n} {seconds[n][-1]:.2f} s" for n in seconds))
        return StartReport(nodes, rounds, [StartTiming(name, tuple(s)) for name, s in seconds.items()])
    finally:
        if torchx_before is not None:
            remove_torchx_objects(client, torchx_before)
        apply_down(client, BENCH_LAB, volumes=True)
