"""The traps themselves, as data: how each breaks a 2-node lab (an environment, and for some a
change to the machine), what torch prints, and the fix. `scenarios.py` runs them.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass, field
from typing import Callable

from labctl import remote
from labctl.engine.docker import apply_node_cpus
from labctl.engine.labels import container_name
from labctl.errors import LabError
from labctl.net.apply import run_on_nodes
from labctl.net.tc import Command

TRAINER = ["-m", "trainer", "--epochs", "1", "--samples", "1024"]
PG_TIMEOUT_S = 12  # the trainer's process-group timeout in the broken runs (torch's default: 30 min)
RDZV_READ_TIMEOUT_S = 10  # torchrun's store read timeout in the broken runs (default: 60 s)

Env = dict[str, dict[str, str]]  # node -> environment overrides


@dataclass
class Context:
    client: object
    lab: str
    nodes: list  # NodeState
    iface: str
    run_id: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def ip(self, node: str) -> str:
        return next(n.ip for n in self.nodes if n.name == node)


@dataclass
class Scenario:
    name: str
    title: str
    lesson: str
    # the whole scenario, bring-up to tear-down. 120 s for those that run torchrun or python twice: on
    # the 2-core EPYC of 2026-12-01, beside make test's other integration tests, wrong-nic took 92 s
    # (its fixed run stopped at what was left of 90) and hostname-trap 90 s.
    bound_s: int
    symptom: str  # regex for the line torch prints
    launcher: str  # "torchrun" or "static"
    broken: Callable[[Context], Env]
    fixed: Callable[[Context], Env]
    fix: str  # what the user changes, in words
    prepare: Callable[[Context], None] | None = None  # a change to the machine, before the broken run
    repair: Callable[[Context], None] | None = None  # undoing it, before the fixed run
    trainer: list[str] = field(default_factory=lambda: list(TRAINER))
    other_torch_on_last_node: bool = False  # version-mismatch: the last node runs another torch release
    symptom_required: bool = True  # False where the honest symptom may be "nothing at all"
    timeline: bool = False  # diagnose the broken run with its timeline too (labctl trace): who waited for whom
    packages: tuple[str, ...] = ()  # the lab's packages (`up --with`): its nodes run the package image
    drift: str = ""  # package-drift: the requirement the last node gets besides its image's (ctx.notes["drift"])
    fixed_without_symptom: bool = False  # the fixed run must not show the symptom (it ends well either way)
    # Given the broken run's symptom line and the fixed run's, whether the fixed run still has the problem;
    # None: any symptom line at all is the problem still there.
    still_there: Callable[[str, str], bool] | None = None


# ------------------------------------------------------------------------------ environments


def torchrun_env(ctx: Context, **extra: str) -> Env:
    """What bare `torchrun` on each node reads: the node's env file, with a fresh rendezvous id."""
    return {node: {"PET_RDZV_ID": ctx.run_id, "DDPLAB_PG_TIMEOUT_S": str(PG_TIMEOUT_S), **extra} for node in ctx.names}


def static_env(ctx: Context, ranks: list[int]) -> Env:
    """A by-hand static launch: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT exported per node."""
    return {node: {"RANK": str(rank), "NODE_RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(ctx.names)),
                   "DDPLAB_PG_TIMEOUT_S": str(PG_TIMEOUT_S)} for node, rank in zip(ctx.names, ranks)}


def with_conf(ctx: Context, conf_for: Callable[[str], str], **extra: str) -> Env:
    env = torchrun_env(ctx, **extra)
    for node in ctx.names:
        env[node]["PET_RDZV_CONF"] = conf_for(node)
    return env


# ------------------------------------------------------------------------------ machine changes

MESH_PREFIX = "100.101.0."  # Tailscale's CGNAT range, 100.64.0.0/10


def add_mesh(ctx: Context) -> None:
    """A second address on every node, as a Tailscale mesh gives each machine: node0's mesh
    address is on its interface but is not what its hostname resolves to, which is exactly what
    torchrun's is-this-me guess misses."""
    addresses = {node: f"{MESH_PREFIX}{10 + i}" for i, node in enumerate(ctx.names)}
    results = run_on_nodes(ctx.client, ctx.lab, ctx.names,
                           lambda node: [Command(("ip", "addr", "add", f"{addresses[node]}/24", "dev", ctx.iface))])
    for node, code, output in results:
        if code != 0:
            raise LabError(f"could not add the mesh address on {node}: {output.strip()}")
        ctx.notes[f"mesh-ip:{node}"] = addresses[node]


def mesh_endpoint(ctx: Context) -> str:
    return f"{ctx.notes[f'mesh-ip:{ctx.names[0]}']}:29500"


def firewall_commands(iface: str, allowed_port: int) -> list:
    """New TCP connections to any port but `allowed_port` are dropped: rendezvous works, every
    back-connect times out. This kernel has neither tc's action modules (`action drop`) nor the prio
    qdisc, so it is built from htb classification alone, on each node's egress: a TCP SYN (SYN set,
    ACK clear: byte 33 of an option-less IPv4 packet) goes to a class whose queue holds nothing
    (pfifo limit 0), unless it is for the allowed port."""
    u32 = ("protocol", "ip", "u32", "match", "ip", "protocol", "6", "0xff")
    return [
        Command(("tc", "qdisc", "add", "dev", iface, "root", "handle", "1:", "htb", "default", "10")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:30", "htb", "rate", "1mbit")),
        Command(("tc", "qdisc", "add", "dev", iface, "parent", "1:30", "handle", "30:", "pfifo", "limit", "0")),
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "1", *u32,
                 "match", "ip", "dport", str(allowed_port), "0xffff", "flowid", "1:10")),
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "2", *u32,
                 "match", "u8", "0x02", "0x12", "at", "33", "flowid", "1:30")),
    ]


def firewall_on(ctx: Context) -> None:
    for node, code, output in run_on_nodes(ctx.client, ctx.lab, ctx.names,
                                           lambda _node: firewall_commands(ctx.iface, 29500)):
        if code != 0:
            raise LabError(f"could not set up the firewall on {node}: {output.strip()}")


def firewall_off(ctx: Context) -> None:
    run_on_nodes(ctx.client, ctx.lab, ctx.names, lambda _node: [Command(("tc", "qdisc", "del", "dev", ctx.iface, "root"), True)])


def drift_last(ctx: Context) -> None:
    """Someone ran `pip install` on one node: the last node gets another version of a package, from the
    wheel the runner fetched (ctx.notes["drift"]), into its own container, as root."""
    wheel = ctx.notes["drift"]
    node = container_name(ctx.lab, ctx.names[-1])
    container = ctx.client.containers.get(node)
    container.put_archive("/tmp", tar_of(wheel))
    code, output = container.exec_run(["python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                                       f"/tmp/{wheel.name}"], user="0:0")
    if code != 0:
        raise LabError(f"could not install {wheel.name} on {ctx.names[-1]}: {output.decode(errors='replace')[-300:]}")


def tar_of(path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(path, arcname=path.name)
    return buffer.getvalue()


def slow_last(ctx: Context) -> None:
    # A CPU limit is a quota per 100 ms CFS period: a step must want more CPU than that (the
    # straggler's 32 sequences a rank: about 60 ms) or, on a loaded machine where steps take 100 ms
    # and more anyway, it fits in one period's quota and the node is not slowed (docs/how-to/failed-run.md).
    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], 0.25)


def unslow_last(ctx: Context) -> None:
    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], None)


WAITED_RE = re.compile(r"waited ([0-9.]+) s")


def still_waiting(broken: str, fixed: str) -> bool:
    """The straggler is still there when the others still wait for it: at least a quarter of what they
    waited in the broken run. Two unlimited nodes sharing a busy machine's cores can still differ by the
    1.2x that makes the trainer name a straggler, but they no longer wait for each other: in the broken
    run the others waited 2.31 s over 11 steps, in a fixed run on the same busy machine a tenth of that."""
    before, after = WAITED_RE.search(broken), WAITED_RE.search(fixed)
    return not (before and after) or float(after.group(1)) > float(before.group(1)) / 4


# ------------------------------------------------------------------------------ the traps

SCENARIOS = {s.name: s for s in [
    Scenario(
        name="hostname-trap",
        title="Nobody hosts the rendezvous store",
        lesson="torchrun guesses whether it hosts the c10d store by matching the endpoint against the machine's "
               "hostname and addresses. Over a VPN (here each node gets a second, Tailscale-style 100.101.0.x "
               "address) node0 does not recognise its own mesh address, every node becomes a client, and all of "
               "them time out dialing a store nobody started.",
        bound_s=120,
        symptom=r"client socket has timed out.*|RendezvousConnectionError.*|DistNetworkError.*",
        launcher="torchrun",
        prepare=add_mesh,
        broken=lambda ctx: with_conf(ctx, lambda node: f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                     PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fixed=lambda ctx: with_conf(ctx, lambda node: f"is_host={'true' if node == ctx.names[0] else 'false'},"
                                                      f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                    PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fix="--rdzv-conf is_host=true on the store's node and is_host=false on the others "
            "(PET_RDZV_CONF; labctl's env files set it)",
    ),
    Scenario(
        name="duplicate-rank",
        title="Two nodes both export RANK=0",
        lesson="With a static launch each process is told its rank by hand. Two rank-0 processes each host a "
               "store of their own and wait for a peer that never arrives: a hang at 0% CPU with no error until "
               "the process-group timeout, which is 30 minutes by default.",
        bound_s=120,
        symptom=r"DistStoreError.*|could not form a gloo process group.*|Timed out.*",
        launcher="static",
        broken=lambda ctx: static_env(ctx, [0] * len(ctx.names)),
        fixed=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fix="give every node its own RANK, 0..N-1 (NODE_RANK in labctl's env files)",
    ),
    Scenario(
        name="wrong-nic",
        title="gloo on the wrong network interface",
        lesson="gloo binds the interface named by GLOO_SOCKET_IFNAME and tells its peers that address. Pointed at "
               "loopback, every rank advertises 127.0.0.1: rendezvous succeeds (it uses MASTER_ADDR), then the "
               "full-mesh connect dials each peer's loopback and fails or hangs.",
        bound_s=120,
        symptom=r".*(connectFullMesh|Connection refused|timed out|Timeout|could not form).*",
        launcher="torchrun",
        broken=lambda ctx: torchrun_env(ctx, GLOO_SOCKET_IFNAME="lo"),
        fixed=lambda ctx: torchrun_env(ctx, GLOO_SOCKET_IFNAME=ctx.iface),
        fix="GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) = the interface on the cluster network; "
            "find it with `ip route get MASTER_ADDR`",
    ),
    Scenario(
        name="firewall",
        title="The firewall opens 29500 and nothing else",
        lesson="Rendezvous goes through one port, so opening 29500 makes it pass; then gloo and NCCL connect "
               "back between every pair of nodes on ephemeral ports, and a firewall that drops those makes the job "
               "hang right after rendezvous.",
        bound_s=120,
        symptom=r".*(connectFullMesh|timed out|Timeout|could not form|Connection).*",
        launcher="torchrun",
        prepare=firewall_on,
        repair=firewall_off,
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="allow TCP between the nodes on the ephemeral range (32768-60999), not only the rendezvous port",
    ),
    Scenario(
        name="version-mismatch",
        title="Two torch releases in one job",
        lesson="torch never compares versions between nodes. With one node on another release the job may "
               "fail in an unrelated-looking way, or run and give subtly different numbers; nothing says why. "
               "Here node1 runs torch 2.14.1 (a CUDA build, on CPU) against 2.13.0 on node0.",
        bound_s=150,
        symptom=r".*(Error|error:|failed|Traceback).*",
        launcher="torchrun",
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="one torch release on every node: one image for all (`labctl up` does), or pin the release on "
            "every real machine",
        other_torch_on_last_node=True,
        symptom_required=False,
    ),
    Scenario(
        name="straggler",
        title="One slow node drags everyone",
        lesson="DDP is bulk-synchronous: every step waits for the slowest rank's gradients. A node with a "
               "fraction of a CPU (thermal throttling, a weaker laptop) sets everyone's pace; the trainer names it "
               "and says how long the others waited, and the run's timeline shows it.",
        bound_s=120,
        symptom=r"straggler: .*",
        launcher="torchrun",
        prepare=slow_last,
        repair=unslow_last,
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="find out why the node is slow (here: `labctl slow NODE --clear`), or give it less work with "
            "--rank-micro-batch (see `labctl bench straggler`)",
        trainer=["-m", "trainer", "--workload", "gpt", "--steps", "12", "--micro-batch", "32", "--threads", "1"],
        timeline=True,
        fixed_without_symptom=True,
        still_there=still_waiting,
    ),
    Scenario(
        name="package-drift",
        title="One node has another version of a package",
        lesson="The version-mismatch trap, for every package and not only torch. Every node was made from the "
               "lab's lock (tqdm 4.67.1); then someone ran `pip install tqdm==4.66.6` on node1, as happens on a "
               "cluster where one machine was set up by hand. Nothing compares versions between nodes: the job runs, "
               "each rank with its own node's tqdm, and a tokenizer or a data pipeline that changed between "
               "releases would quietly give the ranks different data.",
        bound_s=120,
        symptom=r"package drift: .*",
        launcher="static",
        broken=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fixed=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fix="make every node from the lab's image again: `labctl down && labctl up --requirements "
            ".lab/<lab>/pylock.toml` (what was installed into one node by hand lives in its container)",
        prepare=drift_last,
        trainer=["-c", remote.load("package_versions.py"), "tqdm"],
        packages=("tqdm==4.67.1",),
        drift="tqdm==4.66.6",
        fixed_without_symptom=True,
    ),
]}
