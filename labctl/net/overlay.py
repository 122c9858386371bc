"""A mesh VPN between the lab's nodes, as two or three home machines run one: WireGuard, in user
space, with the addresses, interface and MTU that Tailscale gives them (`labctl up --overlay`).

Tailscale is WireGuard plus a control plane: interface `tailscale0`, addresses from its CGNAT block
100.64.0.0/10 (tailscale's net/tsaddr), MTU 1280 (net/tstun/mtu.go: IPv6's minimum, because
wireguard-go's own default of 1420, device/tun.go, breaks on paths under 1500, tailscale#246), and
a full mesh: every node a peer of every other. Plain WireGuard here means `wg0`, a private /24 the
lab picks beside its bridge, and MTU 1420.

This kernel has no WireGuard module, so the tunnel is wireguard-go (Debian's package), in a helper
container per node that joins the node's network namespace with NET_ADMIN and /dev/net/tun, as
Tailscale's sidecar does in Kubernetes; the node itself gets no capability and no device
(overlay_apply.py runs it). The tunnel's packets ride the lab's bridge (eth0), UDP to each peer's
bridge address: `labctl shape` keeps shaping that underlay.

Pure: the choices, each node's address, its WireGuard configuration (which holds its private key:
it goes into the node's helper as a file, never into a log, an env file or an image) and the
commands that bring the interface up.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Mapping

from labctl.errors import ConfigError
from labctl.net.tc import Command

NONE = "none"
SOCKET_DIR = "/var/run/wireguard"  # where wireguard-go puts its control socket, IFACE.sock (wg finds it there)
CONFIG_DIR = "/run/ddplab-overlay"  # in the helper: the interface's configuration, mode 0600
# wireguard-go refuses to start on Linux, where a kernel module is the usual way, unless this is set.
USERSPACE_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}
# Candidates for plain WireGuard's range: the first that does not overlap the lab's bridge.
WIREGUARD_RANGES = ("10.200.0.0/24", "10.201.0.0/24", "172.31.200.0/24", "192.168.200.0/24")
FIRST_HOST = 1  # node i gets the range's address number FIRST_HOST + i


@dataclass(frozen=True)
class Overlay:
    """One kind of mesh: what its nodes' tunnels are called, where their addresses come from, their
    MTU and the UDP port each listens on."""

    kind: str
    iface: str
    network: str  # the block the addresses come from (a route for all of it goes into the tunnel)
    mtu: int
    port: int

    def address(self, rank: int) -> str:
        """Node `rank`'s address on the overlay."""
        net = ipaddress.ip_network(self.network)
        return str(net.network_address + FIRST_HOST + rank)


OVERLAYS = {
    "tailscale": Overlay("tailscale", "tailscale0", "100.64.0.0/10", 1280, 41641),
    "wireguard": Overlay("wireguard", "wg0", WIREGUARD_RANGES[0], 1420, 51820),
}
CHOICES = (NONE, *OVERLAYS)


def overlay_for(kind: str, bridge_subnet: str) -> Overlay | None:
    """The overlay of `kind` for a lab on `bridge_subnet` (None for `none`). Tailscale's block is
    fixed, so a bridge inside it is refused; plain WireGuard takes the first of its ranges the
    bridge does not overlap."""
    if kind == NONE:
        return None
    overlay = OVERLAYS[kind]
    bridge = ipaddress.ip_network(bridge_subnet)
    if kind == "tailscale":
        if bridge.overlaps(ipaddress.ip_network(overlay.network)):
            raise ConfigError("--subnet", bridge_subnet, f"overlaps the tailscale overlay's {overlay.network}",
                              hint="pick a bridge subnet outside 100.64.0.0/10, or leave --subnet auto")
        return overlay
    for candidate in WIREGUARD_RANGES:
        if not bridge.overlaps(ipaddress.ip_network(candidate)):
            return Overlay(overlay.kind, overlay.iface, candidate, overlay.mtu, overlay.port)
    raise AssertionError("a /24 bridge overlaps at most one of the ranges")


def check_combination(kind: str, scheduler: str, key: str = "--overlay") -> None:
    """An overlay where it can carry a job's traffic: not beside Slurm, whose jobs find their nodes by
    the names in slurm.conf, which resolve to the bridge (the tunnel would carry nothing of theirs)."""
    if kind != NONE and scheduler == "slurm":
        raise ConfigError(key, kind, "cannot be combined with --scheduler slurm: Slurm's jobs find their nodes by "
                          "the names in slurm.conf, which resolve to the bridge, so the tunnel would carry none of "
                          "their traffic", hint="leave out --overlay, or --scheduler")


def addresses(overlay: Overlay, names: list[str]) -> dict[str, str]:
    """Each node's overlay address, in node-rank order."""
    return {name: overlay.address(rank) for rank, name in enumerate(names)}


def build_config(overlay: Overlay, node: str, private_key: str, public_keys: Mapping[str, str],
                 overlay_ips: Mapping[str, str], bridge_ips: Mapping[str, str]) -> str:
    """`wg setconf`'s text for `node`: its key and port, and every other node as a peer reached at
    its bridge address. It holds the node's private key: a secret."""
    lines = ["[Interface]", f"PrivateKey = {private_key}", f"ListenPort = {overlay.port}"]
    for peer, public in public_keys.items():
        if peer == node:
            continue
        lines += ["", "[Peer]", f"PublicKey = {public}", f"AllowedIPs = {overlay_ips[peer]}/32",
                  f"Endpoint = {bridge_ips[peer]}:{overlay.port}"]
    return "\n".join(lines) + "\n"


def config_path(overlay: Overlay) -> str:
    return f"{CONFIG_DIR}/{overlay.iface}.conf"


def build_up(overlay: Overlay, address: str, wait_s: float = 10.0) -> list[Command]:
    """In the node's helper, once wireguard-go runs there: wait for its control socket, load the
    configuration (peers replaced, so a grown or shrunk lab gets its new list), then the address, the
    MTU and a route for the overlay's whole block into the tunnel."""
    socket = f"{SOCKET_DIR}/{overlay.iface}.sock"
    tries = max(1, int(wait_s / 0.1))
    wait = f"i=0; while [ ! -S {socket} ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i+1)); done; [ -S {socket} ]"
    return [
        Command(("sh", "-c", wait)),
        Command(("wg", "setconf", overlay.iface, config_path(overlay))),
        Command(("ip", "address", "replace", f"{address}/32", "dev", overlay.iface)),
        Command(("ip", "link", "set", overlay.iface, "mtu", str(overlay.mtu), "up")),
        Command(("ip", "route", "replace", overlay.network, "dev", overlay.iface)),
    ]


def helper_argv(overlay: Overlay) -> list[str]:
    """The helper's one process: wireguard-go in the foreground. The interface lives as long as it does."""
    return ["wireguard-go", "--foreground", overlay.iface]


GENKEY_SCRIPT = 'for i in $(seq "$1"); do k=$(wg genkey); echo "$k $(echo "$k" | wg pubkey)"; done'


def parse_keys(output: str, count: int) -> list[tuple[str, str]]:
    """(private, public) pairs from GENKEY_SCRIPT's lines; a short or odd answer is an error that
    shows nothing of what it read (it may hold keys)."""
    pairs = [tuple(line.split()) for line in output.splitlines() if line.strip()]
    if len(pairs) != count or any(len(p) != 2 or len(p[0]) != 44 or len(p[1]) != 44 for p in pairs):
        raise ValueError(f"expected {count} key pairs from wg genkey, got {len(pairs)} lines of another form")
    return [(p[0], p[1]) for p in pairs]


def over_tunnel(env: Mapping[str, str], overlay: Overlay) -> dict[str, str]:
    """A node's env file with the job on the overlay, as on machines joined by a mesh VPN: the
    rendezvous on node0's overlay address, gloo's and NCCL's sockets on the tunnel, and torchrun's
    own address the node's tunnel address (`--local-addr`, PET_LOCAL_ADDR): without it torchrun puts
    the store its workers bootstrap from on the machine's FQDN, the physical network's address,
    which the peers on the mesh may not reach."""
    master = overlay.address(0)  # node0, node rank 0, hosts the store
    port = env.get("MASTER_PORT", "29500")
    mine = {"PET_LOCAL_ADDR": overlay.address(int(env["NODE_RANK"]))} if env.get("NODE_RANK", "").isdigit() else {}
    return {**env, "MASTER_ADDR": master, "PET_RDZV_ENDPOINT": f"{master}:{port}",
            "GLOO_SOCKET_IFNAME": overlay.iface, "NCCL_SOCKET_IFNAME": overlay.iface, **mine}


def envs_on(envs: dict[str, dict[str, str]], overlay: Overlay | None, bridge_iface: str,
            ifname: str | None) -> dict[str, dict[str, str]]:
    """The nodes' env files for a run whose sockets use `ifname`: the tunnel's where the lab has an
    overlay and nothing else is asked (None), the bridge's as the files say it. Another name is
    refused, naming the lab's interfaces."""
    ifname = ifname or (overlay.iface if overlay else bridge_iface)
    if ifname == bridge_iface:
        return envs
    if overlay is None or ifname != overlay.iface:
        have = [bridge_iface, *([overlay.iface] if overlay else [])]
        raise ConfigError("--ifname", ifname, f"must be one of the lab's interfaces: {', '.join(have)}",
                          hint="`labctl up --overlay tailscale` gives the nodes a tunnel" if overlay is None else "")
    return {node: over_tunnel(env, overlay) for node, env in envs.items()}


def parse_iface_address(output: str) -> str | None:
    """The IPv4 address `ip -o -4 address show dev IFACE` lists first, without its prefix length."""
    for line in output.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None
