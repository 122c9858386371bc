"""The traps of a mesh VPN, each on a real one (`up --overlay`: WireGuard in user space, as
Tailscale runs it): the rendezvous endpoint on node0's tunnel address, which its hostname does not
resolve to (hostname-trap); gloo on the physical NIC when only the tunnel joins the nodes
(wrong-nic --overlay tailscale); a path that carries less than the tunnel's MTU and drops the ICMP
that would say so (mtu-blackhole). Each reproduced, diagnosed by doctor, fixed, within 60 s on an
idle machine (the bound, 120 s, leaves room for make test's other workers)."""

from __future__ import annotations

import pytest
from conftest import labctl, lab_resources, run_scenario


@pytest.mark.parametrize("name, options", [("hostname-trap", ()), ("wrong-nic", ("--overlay", "tailscale")),
                                           ("mtu-blackhole", ())], ids=["hostname-trap", "wrong-nic", "mtu-blackhole"])
def test_a_mesh_trap_shows_diagnoses_and_fixes(name, options, docker_client, node_image):
    outcome = run_scenario(name, docker_client, *options)
    assert outcome["overlay"] == {"hostname-trap": "tailscale", "wrong-nic": "tailscale",
                                  "mtu-blackhole": "wireguard"}[name]
    doctor = "; ".join(outcome["doctor"])
    if name == "hostname-trap":  # the endpoint is node0's 100.64.0.x, on its tunnel
        assert "100.64.0.1, 29500" in outcome["symptom"] and "is_host=true on no node" in doctor, outcome
    elif name == "wrong-nic":  # gloo unset: the hostname's (the bridge's) address, where nothing connects
        assert "GLOO_SOCKET_IFNAME is not set" in doctor and "GLOO_SOCKET_IFNAME=tailscale0" in doctor, doctor
    else:  # small all_reduces pass, a large one stalls; doctor names node1, wg0's MTU and what passes
        assert outcome["symptom"].startswith("all_reduce of ") and "stalled" in outcome["symptom"], outcome
        assert "256 B" in outcome["symptom"].split("passed")[0], outcome["symptom"]
        assert "node1: packets of " in doctor and "wg0's MTU on node1 is 1420" in doctor, doctor


def test_a_scenario_on_a_network_it_cannot_be_met_on_is_refused_before_any_starts(docker_client):
    # here, not beside the bridge's scenarios: the lab wrong-nic would get is this module's to bring up
    result = labctl("scenario", "run", "wrong-nic", "straggler", "--overlay", "tailscale")
    assert result.returncode == 2, result.stderr
    assert "invalid --overlay='tailscale': not a network these scenarios can be met on: straggler on none" \
        in result.stderr, result.stderr
    for lab in ("scn-wrong-nic-tailscale", "scn-straggler-tailscale"):
        assert lab_resources(docker_client, lab) == {"containers": [], "networks": [], "volumes": []}
