"""The traps themselves, as data: how each breaks a 2-node lab (an environment, and for some a
change to the machine: breakage.py), what torch prints, and the fix. `scenarios.py` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from labctl import remote
from labctl.diagnose.breakage import (PATH_BYTES, SAFE_MTU, Context, drift_last, drop_off, firewall_on, limit_path_last,
                                      slow_last, still_waiting, tunnel_mtu_down, tunnel_only, unslow_last)
from labctl.net.overlay import NONE

TRAINER = ["-m", "trainer", "--epochs", "1", "--samples", "1024"]
PG_TIMEOUT_S = 12  # the trainer's process-group timeout in the broken runs (torch's default: 30 min)
RDZV_READ_TIMEOUT_S = 10  # torchrun's store read timeout in the broken runs (default: 60 s)

Env = dict[str, dict[str, str]]  # node -> environment overrides


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
    # The overlays (`up --overlay`) the trap can be met on, its default first: `scenario run --overlay`
    # picks another of them.
    overlays: tuple[str, ...] = (NONE,)


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


def socket_ifname(iface: str) -> dict[str, str]:
    """gloo's and NCCL's interface; empty is unset to both (torch reads a name of one letter or none as no name)."""
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}


def mesh_endpoint(ctx: Context) -> str:
    """The rendezvous at node0's address on the mesh VPN: on its tunnel, not what its hostname resolves to."""
    return f"{ctx.overlay.address(0)}:29500"


# ------------------------------------------------------------------------------ the traps

SCENARIOS = {s.name: s for s in [
    Scenario(
        name="hostname-trap",
        title="Nobody hosts the rendezvous store",
        lesson="torchrun guesses whether it hosts the c10d store by matching the endpoint against the machine's "
               "hostname and the addresses the hostname resolves to. On a mesh VPN (here a real one: WireGuard "
               "as Tailscale runs it, tailscale0 with a 100.64.0.x address on each node) the endpoint is node0's "
               "tunnel address, which its hostname does not resolve to: node0 does not recognise itself, every "
               "node becomes a client, and all of them time out dialing a store nobody started.",
        bound_s=120,
        symptom=r"client socket has timed out.*|RendezvousConnectionError.*|DistNetworkError.*",
        launcher="torchrun",
        broken=lambda ctx: with_conf(ctx, lambda node: f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                     PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fixed=lambda ctx: with_conf(ctx, lambda node: f"is_host={'true' if node == ctx.names[0] else 'false'},"
                                                      f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                    PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fix="--rdzv-conf is_host=true on the store's node and is_host=false on the others "
            "(PET_RDZV_CONF; labctl's env files set it)",
        overlays=("tailscale", "wireguard"),
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
        lesson="gloo binds the interface named by GLOO_SOCKET_IFNAME and tells its peers that address; unset, it "
               "takes the address the hostname resolves to. Pointed at loopback, every rank advertises 127.0.0.1. "
               "With --overlay (a mesh VPN, the only way between the nodes, as between two homes) it is left "
               "unset: every rank advertises its physical NIC's address. Either way rendezvous succeeds (it uses "
               "the endpoint), then the full-mesh connect dials addresses the peers cannot reach and fails or hangs.",
        bound_s=120,
        symptom=r".*(connectFullMesh|Connection refused|timed out|Timeout|could not form).*",
        launcher="torchrun",
        prepare=tunnel_only,
        broken=lambda ctx: torchrun_env(ctx, **socket_ifname("" if ctx.overlay else "lo")),
        fixed=lambda ctx: torchrun_env(ctx, **socket_ifname(ctx.overlay.iface if ctx.overlay else ctx.iface)),
        fix="GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) = the interface that reaches the others: the cluster "
            "network's (`ip route get MASTER_ADDR` names it), the tunnel's on a mesh VPN (tailscale0)",
        overlays=(NONE, "tailscale", "wireguard"),
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
        repair=drop_off,
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
    Scenario(
        name="mtu-blackhole",
        title="Small collectives pass, large ones stall",
        lesson=f"A tunnel's MTU promises what its packets may hold; each goes out again, encrypted, 60 bytes larger. "
               f"Here the nodes run WireGuard at its default MTU of 1420, and the path under node1 carries "
               f"{PATH_BYTES} bytes (another tunnel on the way, a mobile link) and drops the ICMP that would say so. "
               "TCP's handshake and small messages pass; every segment filled to the MTU vanishes and is sent again "
               "until the timeout. The job hangs as if deadlocked.",
        bound_s=120,
        symptom=r"all_reduce of .* stalled.*",
        launcher="static",
        prepare=limit_path_last,
        repair=tunnel_mtu_down,
        broken=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fixed=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fix=f"the tunnel's MTU at what the path carries, on every node: {SAFE_MTU}, as Tailscale sets it "
            f"(`ip link set wg0 mtu {SAFE_MTU}`, or `labctl up --overlay tailscale`)",
        trainer=["-c", remote.load("allreduce_sizes.py")],
        overlays=("wireguard",),
    ),
]}
