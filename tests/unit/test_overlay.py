"""The overlay's pure half (labctl/net/overlay.py): which range, which addresses, what each node's
WireGuard configuration says, and the commands that bring a tunnel up."""

from __future__ import annotations

import pytest

from labctl.errors import ConfigError
from labctl.net import overlay as ov
from labctl.spec.labspec import resolve_config

KEY = "A" * 43 + "="  # the form of a WireGuard key: 32 bytes in base64


def test_tailscale_is_tailscale0_in_its_cgnat_block_at_ipv6s_minimum_mtu():
    mesh = ov.overlay_for("tailscale", "172.28.5.0/24")
    assert (mesh.iface, mesh.network, mesh.mtu, mesh.port) == ("tailscale0", "100.64.0.0/10", 1280, 41641)
    assert ov.addresses(mesh, ["node0", "node1", "node2"]) == {"node0": "100.64.0.1", "node1": "100.64.0.2",
                                                               "node2": "100.64.0.3"}
    assert ov.overlay_for("none", "172.28.5.0/24") is None


def test_a_bridge_inside_tailscales_block_is_refused_and_wireguard_steps_around_the_bridge():
    with pytest.raises(ConfigError, match=r"overlaps the tailscale overlay's 100.64.0.0/10"):
        ov.overlay_for("tailscale", "100.64.5.0/24")
    assert ov.overlay_for("wireguard", "172.28.5.0/24").network == "10.200.0.0/24"
    moved = ov.overlay_for("wireguard", "10.200.0.0/24")
    assert (moved.iface, moved.network, moved.mtu) == ("wg0", "10.201.0.0/24", 1420)


def test_each_node_has_every_other_as_a_peer_at_its_bridge_address_and_its_own_key_alone():
    mesh = ov.OVERLAYS["tailscale"]
    public = {"node0": "P0" + KEY[2:], "node1": "P1" + KEY[2:], "node2": "P2" + KEY[2:]}
    bridge = {"node0": "172.28.5.10", "node1": "172.28.5.11", "node2": "172.28.5.12"}
    text = ov.build_config(mesh, "node1", "SECRET" + KEY[6:], public, ov.addresses(mesh, list(bridge)), bridge)
    assert text.count("[Peer]") == 2 and public["node1"] not in text
    assert "PrivateKey = SECRET" in text and "ListenPort = 41641" in text
    assert "AllowedIPs = 100.64.0.1/32\nEndpoint = 172.28.5.10:41641" in text
    assert "AllowedIPs = 100.64.0.3/32\nEndpoint = 172.28.5.12:41641" in text


def test_the_tunnel_comes_up_with_its_address_mtu_and_a_route_for_the_whole_block():
    argvs = [c.argv for c in ov.build_up(ov.OVERLAYS["tailscale"], "100.64.0.2")]
    assert argvs[1] == ("wg", "setconf", "tailscale0", "/run/ddplab-overlay/tailscale0.conf")
    assert ("ip", "address", "replace", "100.64.0.2/32", "dev", "tailscale0") in argvs
    assert ("ip", "link", "set", "tailscale0", "mtu", "1280", "up") in argvs
    assert argvs[-1] == ("ip", "route", "replace", "100.64.0.0/10", "dev", "tailscale0")
    assert ov.helper_argv(ov.OVERLAYS["wireguard"]) == ["wireguard-go", "--foreground", "wg0"]


def test_keys_are_read_in_pairs_and_a_bad_answer_shows_none_of_them():
    assert ov.parse_keys(f"{KEY} {KEY}\n{KEY} {KEY}\n", 2) == [(KEY, KEY), (KEY, KEY)]
    with pytest.raises(ValueError) as caught:
        ov.parse_keys(f"{KEY} {KEY}\n", 2)
    assert KEY not in str(caught.value)


def test_an_interface_address_is_read_from_ip_o():
    said = "5: tailscale0    inet 100.64.0.2/32 scope global tailscale0\\       valid_lft forever preferred_lft forever\n"
    assert ov.parse_iface_address(said) == "100.64.0.2"
    assert ov.parse_iface_address("") is None


@pytest.mark.parametrize("raw, expected", [("", None), ("tailscale", "tailscale"), ("WireGuard", "wireguard"),
                                           ("none", "none")])
def test_the_setting_takes_a_kind_or_leaves_it_to_the_running_lab(raw, expected):
    assert resolve_config(environ={"DDPLAB_OVERLAY": raw}).overlay == expected


def test_an_unknown_overlay_setting_is_refused_naming_the_kinds():
    with pytest.raises(ConfigError, match="must be one of none, tailscale, wireguard"):
        resolve_config(environ={"DDPLAB_OVERLAY": "zerotier"})


ENV = {"MASTER_ADDR": "172.28.5.10", "MASTER_PORT": "29500", "PET_RDZV_ENDPOINT": "172.28.5.10:29500",
       "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "NODE_RANK": "1"}


def test_a_run_on_an_overlay_lab_takes_the_tunnel_unless_the_bridge_is_named():
    mesh = ov.OVERLAYS["tailscale"]
    moved = ov.envs_on({"node1": ENV}, mesh, "eth0", None)["node1"]
    assert moved == {**ENV, "MASTER_ADDR": "100.64.0.1", "PET_RDZV_ENDPOINT": "100.64.0.1:29500",
                     "GLOO_SOCKET_IFNAME": "tailscale0", "NCCL_SOCKET_IFNAME": "tailscale0",
                     "PET_LOCAL_ADDR": "100.64.0.2"}  # torchrun's own store on node1's tunnel address
    assert ov.envs_on({"node1": ENV}, mesh, "eth0", "eth0") == {"node1": ENV}
    assert ov.envs_on({"node1": ENV}, None, "eth0", None) == {"node1": ENV}


def test_an_interface_the_lab_does_not_have_is_refused_naming_those_it_has():
    with pytest.raises(ConfigError, match="must be one of the lab's interfaces: eth0, tailscale0"):
        ov.envs_on({"node1": ENV}, ov.OVERLAYS["tailscale"], "eth0", "wg0")
    with pytest.raises(ConfigError, match="must be one of the lab's interfaces: eth0\n") as caught:
        ov.envs_on({"node1": ENV}, None, "eth0", "tailscale0")
    assert "--overlay" in caught.value.hint


def test_an_overlay_beside_slurm_is_refused_saying_why():
    ov.check_combination("none", "slurm")
    ov.check_combination("tailscale", "none")
    with pytest.raises(ConfigError, match="cannot be combined with --scheduler slurm") as caught:
        ov.check_combination("tailscale", "slurm")
    assert caught.value.exit_code == 2
