"""doctor's path-MTU check over a lab's tunnel (labctl/diagnose/tunnel.py, labctl/remote/mtu_probe.py),
the machine changes of the mesh traps (labctl/diagnose/breakage.py), and which network each scenario
is met on (labctl.diagnose.scenarios.scenario_overlays)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labctl import remote
from labctl.diagnose.scenarios import SCENARIOS, scenario_lab, scenario_overlays
from labctl.diagnose import tunnel
from labctl.diagnose.breakage import firewall_commands, path_limit_commands, prefix_blocks
from labctl.diagnose.doctor import gloo_address
from labctl.errors import ConfigError
from labctl.net.overlay import OVERLAYS

SENT = [576, 1024, 1200, 1216, 1232, 1248, 1264, 1280, 1296, 1312, 1328, 1344, 1360, 1376, 1392, 1408, 1420]


def report(mtu: int, sent: list[int], received: dict[str, list[int]]) -> dict:
    return {"mtu": mtu, "sent": sent, "send_errors": {}, "received": received}


def test_full_size_packets_between_every_pair_pass():
    reports = {"node0": report(1280, SENT[:8], {"node1": SENT[:8]}), "node1": report(1280, SENT[:8], {"node0": SENT[:8]})}
    [finding] = tunnel.check_mtu(reports, "tailscale0")
    assert finding.ok and finding.message == "packets of the full MTU (1280) pass through tailscale0 between all 2 node pairs"


def test_a_node_whose_large_packets_vanish_is_named_with_its_mtu_and_what_passes():
    # node1's path carries 1400 bytes: WireGuard adds 60 and pads to 16, so 1328 arrive and 1344 do not
    reports = {"node0": report(1420, SENT, {"node1": SENT[:11]}), "node1": report(1420, SENT, {"node0": SENT})}
    [finding] = tunnel.check_mtu(reports, "wg0")
    assert not finding.ok and finding.node == "node1"
    assert finding.message.startswith("packets of 1344 bytes and more that node1 sends through wg0 never reach node0 "
                                      "(1328 bytes do), but wg0's MTU on node1 is 1420")
    assert "`ip link set wg0 mtu 1328`" in finding.fix and "1280" in finding.fix


def test_a_tunnel_that_carries_nothing_is_down_not_too_small():
    reports = {"node0": report(1280, SENT[:8], {}), "node1": report(1280, SENT[:8], {"node0": SENT[:8]})}
    [finding] = tunnel.check_mtu(reports, "tailscale0")
    assert finding.node == "node1" and "nothing node1 sent through tailscale0 reached node0" in finding.message


def test_a_probe_that_could_not_run_says_so():
    reports = {"node0": {"error": "no such file /sys/class/net/wg0/mtu"}, "node1": report(1420, SENT, {})}
    findings = tunnel.check_mtu(reports, "wg0")
    assert [f.node for f in findings] == ["node0"] and "could not run on node0" in findings[0].message


def test_the_probe_sends_each_size_below_the_mtu_and_hears_its_own():
    config = tunnel.probe_config("a", "lo", 47113, {"a": "127.0.0.1", "b": "127.0.0.1"})
    config["targets"] = [["a", "127.0.0.1"]]  # itself, over loopback
    result = subprocess.run([sys.executable, "-c", remote.load("mtu_probe.py"), json.dumps(config)],
                            capture_output=True, text=True, timeout=20)
    got = json.loads(result.stdout)
    assert got["sent"] == list(tunnel.LADDER) and got["received"] == {"a": list(tunnel.LADDER)}, got
    assert set(got["send_errors"]) == {str(got["mtu"])}  # loopback's 65536 is more than a UDP packet holds


def test_the_tunnel_addresses_come_from_the_nodes_interfaces():
    info = {"node0": {"ifaces": {"eth0": ["172.28.0.10/24"], "wg0": ["10.200.0.1/32"]}}, "node1": {"ifaces": {}}}
    assert tunnel.tunnel_addresses(info, "wg0") == {"node0": "10.200.0.1"}
    mesh = OVERLAYS["wireguard"]
    assert gloo_address(info["node0"], {"GLOO_SOCKET_IFNAME": "wg0"}, mesh, "172.28.0.10") == "10.200.0.1"
    assert gloo_address(info["node0"], {"GLOO_SOCKET_IFNAME": ""}, mesh, "172.28.0.10") == "172.28.0.10"
    assert gloo_address(info["node0"], {"GLOO_SOCKET_IFNAME": "wg0"}, None, "172.28.0.10") == "172.28.0.10"


def test_a_range_of_packet_lengths_is_matched_exactly_by_its_blocks():
    blocks = prefix_blocks(1401, 0xFFFF)
    matched = [n for n in range(0x10000) if any(n & mask == value for value, mask in blocks)]
    assert matched == list(range(1401, 0x10000)) and len(blocks) == 10
    first = path_limit_commands("eth0", 1400)[4].argv
    assert first[first.index("u16") + 1:first.index("u16") + 5] == ("0x0579", "0xffff", "at", "2")


def test_a_firewall_without_an_allowed_port_drops_every_new_connection():
    assert any("dport" in c.argv for c in firewall_commands("eth0", 29500))
    assert not any("dport" in c.argv for c in firewall_commands("eth0", None))


def test_each_scenario_is_met_on_its_own_network_unless_another_is_asked_for():
    assert scenario_overlays(["hostname-trap", "mtu-blackhole", "straggler"], None) == {
        "hostname-trap": "tailscale", "mtu-blackhole": "wireguard", "straggler": "none"}
    assert scenario_overlays(["wrong-nic"], "tailscale") == {"wrong-nic": "tailscale"}
    with pytest.raises(ConfigError) as refused:
        scenario_overlays(["wrong-nic", "straggler", "mtu-blackhole"], "tailscale")
    assert "straggler on none; mtu-blackhole on wireguard" in refused.value.message
    assert all(s.overlays for s in SCENARIOS.values())


def test_a_scenario_met_on_another_network_gets_a_lab_of_its_own():
    # wrong-nic on the bridge and on a mesh can run side by side (two make test workers do)
    assert scenario_lab("wrong-nic", None) == scenario_lab("wrong-nic", "none") == "scn-wrong-nic"
    assert scenario_lab("wrong-nic", "tailscale") == "scn-wrong-nic-tailscale"
    assert scenario_lab("hostname-trap", "tailscale") == "scn-hostname-trap"
    assert scenario_lab("hostname-trap", "wireguard") == "scn-hostname-trap-wireguard"
