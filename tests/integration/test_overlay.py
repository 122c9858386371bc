"""A mesh VPN between the nodes (`labctl up --overlay`, labctl/net/overlay.py): WireGuard in user
space, one helper per node with the TUN device, and the nodes themselves as unprivileged as ever.
A plain torchrun DDP script's traffic goes through the tunnel (the bridge with `run --ifname eth0`),
and `down` leaves nothing."""

from __future__ import annotations

import ipaddress
import json
import re
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, SCRIPTS, labctl, lab_resources

pytestmark = pytest.mark.integration
LINE = re.compile(r"VPN_DDP rank=(\d) world=(\d) iface=(\S+) grad_bytes=(\d+) steps=(\d+) loss=\S+ replicas_equal=(\w+)")
LOSS = re.compile(r"VPN_DDP rank=(\d) .* loss=(\S+) ")
VPN_SCRIPT = str(SCRIPTS / "vpn_classifier.py")


def counters(client, lab: str, nodes: list[str], iface: str) -> dict[str, int]:
    """Bytes each node has sent through `iface`, as its kernel counts them."""
    path = f"/sys/class/net/{iface}/statistics/tx_bytes"
    return {n: int(client.containers.get(f"{lab}-{n}").exec_run(["cat", path]).output) for n in nodes}


def by_hand(lab: str, names: list[str]) -> str:
    """A bare torchrun on every node at once, each with its own env file from `labctl env --overlay`
    loaded first: what each of two home machines runs. Their outputs, joined."""
    def one(node: str) -> str:
        load = f"set -a; . .lab/{lab}/overlay-env/{node}.env; set +a"
        return labctl("exec", "--lab", lab, node, "--", "sh", "-c", f"{load}; torchrun {VPN_SCRIPT}",
                      check=True, timeout=300).stdout

    with ThreadPoolExecutor(len(names)) as pool:
        return "".join(pool.map(one, names))


def test_a_tailscale_mesh_carries_a_torchrun_ddp_script_and_down_leaves_nothing(lab_name, docker_client):
    lab = lab_name
    up = labctl("up", "--lab", lab, "--nodes", "3", "--overlay", "tailscale", check=True, timeout=600)
    assert "overlay tailscale: tailscale0 (MTU 1280)" in up.stderr + up.stdout, up.stderr[-2000:]
    status = json.loads(labctl("status", "--lab", lab, "--json", check=True).stdout)
    assert status["overlay"] == {"kind": "tailscale", "iface": "tailscale0", "mtu": 1280}
    names = [n["name"] for n in status["nodes"]]
    addresses = {n["name"]: n["overlay_ip"] for n in status["nodes"]}
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network("100.64.0.0/10") for a in addresses.values()), addresses
    assert len(set(addresses.values())) == 3
    for name in names:
        node = docker_client.api.inspect_container(f"{lab}-{name}")["HostConfig"]
        assert not node["CapAdd"] and not node["Devices"] and not node["Privileged"], (name, node["CapAdd"])
        link = docker_client.containers.get(f"{lab}-{name}").exec_run(["ip", "-o", "link", "show", "tailscale0"])
        assert link.exit_code == 0 and " mtu 1280 " in link.output.decode(), link.output
    keys = REPO / ".lab" / lab / "overlay" / "keys.json"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
    private = [pair[0] for pair in json.loads(keys.read_text()).values()]
    env_files = "".join(p.read_text() for p in (REPO / ".lab" / lab).glob("*.env"))
    assert not any(key in env_files or key in up.stdout + up.stderr for key in private)

    # As on two home machines: `labctl env --overlay` writes each node's identity on the tunnel where
    # every node sees it, and each node loads its own and starts a bare torchrun (c10d rendezvous at
    # node0's 100.x address, is_host said, torchrun's own store on the node's tunnel address).
    written = labctl("env", "--overlay", "--lab", lab, check=True)
    node2 = (REPO / ".lab" / lab / "overlay-env" / "node2.env").read_text()
    assert "MASTER_ADDR=100.64.0.1\n" in node2 and "GLOO_SOCKET_IFNAME=tailscale0\n" in node2, node2
    assert "PET_RDZV_ENDPOINT=100.64.0.1:29500\n" in node2 and "PET_RDZV_CONF=is_host=false\n" in node2, node2
    assert "PET_LOCAL_ADDR=100.64.0.3\n" in node2, node2  # torchrun's own store on the tunnel, not the FQDN
    assert f"labctl exec --lab {lab} node2 -- sh -c 'set -a; . " in written.stdout, written.stdout

    # Then `labctl run`, which puts a run on the tunnel by itself, and `--ifname eth0` on the bridge
    # (both forked by the nodes' fork servers: no torch to import), where the tunnel counts nothing of
    # the job. The same data, the same loss, every way.
    ways = {"by hand": ("tailscale0", lambda: by_hand(lab, names)),
            "run": ("tailscale0", lambda: labctl("run", "--lab", lab, "--", VPN_SCRIPT, check=True).stdout),
            "bridge": ("eth0", lambda: labctl("run", "--lab", lab, "--ifname", "eth0", "--", VPN_SCRIPT,
                                              check=True).stdout)}
    runs = {}
    for way, (ifname, go) in ways.items():
        before = counters(docker_client, lab, names, "tailscale0")
        output = go()
        after = counters(docker_client, lab, names, "tailscale0")
        ranks = LINE.findall(output)
        assert sorted(int(r[0]) for r in ranks) == [0, 1, 2], output[-3000:]
        assert all(r[2] == ifname and r[5] == "True" for r in ranks), (way, ranks)
        runs[way] = ({n: after[n] - before[n] for n in names}, int(ranks[0][3]) * int(ranks[0][4]),
                     sorted(LOSS.findall(output)))
    _, gradients, losses = runs["by hand"]  # gradients: what DDP all-reduced; a ring sends 4/3 of it from each
    assert all(all(b >= gradients for b in runs[way][0].values()) for way in ("by hand", "run")), runs
    assert all(b < gradients / 10 for b in runs["bridge"][0].values()), runs["bridge"]
    assert losses == runs["run"][2] == runs["bridge"][2]

    # doctor on the mesh: the tunnel carries packets of its full MTU between every pair, and gloo's
    # back-connects are probed at the tunnel's addresses, where the runs put them.
    doctor = json.loads(labctl("doctor", "--lab", lab, "--json", check=True).stdout)
    assert [(f["ok"], f["message"]) for f in doctor["findings"] if f["check"] == "mtu"] == [
        (True, "packets of the full MTU (1280) pass through tailscale0 between all 6 node pairs")], doctor["findings"]

    # What the tunnel costs: bench allreduce reads the wire through the tunnel (every node sending to the
    # next at once) and on the bridge under it, and keeps the tunnel's rate, which `labctl cost` then
    # prices the lab's own link with.
    bench = " ".join(labctl("bench", "allreduce", "--lab", lab, "--sizes", "1M", "--iters", "2", check=True).stdout.split())
    wire = re.search(r"iperf3 wire (\d+) Mbit/s a hop through tailscale0 with every node sending at once "
                     r"\(MTU 1280; (\d+) Mbit/s on the bridge under it\)", bench)
    assert wire and int(wire[1]) < int(wire[2]) / 10, bench[:600]
    rows = json.loads(labctl("cost", "--lab", lab, "--params", "25M", "--json", check=True).stdout)
    assert [r["link"] for r in rows][:2] == ["lab (unshaped) over tailscale0", "1GbE over tailscale0"], rows
    assert rows[0]["rate_bps"] * 0.85 == pytest.approx(int(wire[1]) * 1e6, abs=0.6e6)  # the ceiling (the title rounds it)

    labctl("down", "--lab", lab, "--volumes", check=True)
    assert lab_resources(docker_client, lab) == {"containers": [], "networks": [], "volumes": []}
    assert not keys.parent.exists()


def test_bad_overlays_are_refused_before_anything_starts(lab_name, docker_client):
    unknown = labctl("up", "--lab", lab_name, "--overlay", "zerotier")
    assert unknown.returncode == 2 and "'zerotier' is not one of 'none', 'tailscale', 'wireguard'" in unknown.stderr, \
        unknown.stderr
    inside = labctl("up", "--lab", lab_name, "--overlay", "tailscale", "--subnet", "100.64.5.0/24")
    assert inside.returncode == 2 and "overlaps the tailscale overlay's 100.64.0.0/10" in inside.stderr, inside.stderr
    slurm = labctl("up", "--lab", lab_name, "--overlay", "wireguard", "--scheduler", "slurm")
    assert slurm.returncode == 2 and "invalid --overlay='wireguard': cannot be combined with --scheduler slurm" \
        in slurm.stderr, slurm.stderr
    nothing = labctl("env", "--overlay", "--lab", lab_name)
    assert nothing.returncode == 1 and f"lab {lab_name} has no overlay" in nothing.stderr, nothing.stderr
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}
