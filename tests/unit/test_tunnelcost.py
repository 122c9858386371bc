"""What a mesh VPN's tunnel costs a collective (labctl/bench/tunnelcost.py, `labctl cost --overlay`):
its headers at its MTU, by hand, and the ceiling the bench measured, on the lab's own link only."""

from __future__ import annotations

import pytest

from labctl.bench.cost import CostQuery, collective_time_s, links_to_price, step_report
from labctl.bench.tunnelcost import BY_HAND, Tunnel, measured_rate, payload_share, save_rate, tunnel_notes, tunnel_of
from labctl.errors import ConfigError
from labctl.net.overlay import OVERLAYS
from trainer.stepmodel import Link

TAILSCALE, WIREGUARD = OVERLAYS["tailscale"], OVERLAYS["wireguard"]


def test_a_full_packet_carries_its_mtu_less_52_bytes_of_headers_in_60_more_on_the_wire():
    assert payload_share(1500, False) == pytest.approx(1448 / 1538)  # plain Ethernet: 38 bytes a frame besides
    assert payload_share(1280, True) == pytest.approx(1228 / 1378)  # WireGuard's 60 around Tailscale's 1280
    assert Tunnel(TAILSCALE).share == pytest.approx((1228 / 1378) / (1448 / 1538))
    assert round(Tunnel(TAILSCALE).share, 3) == 0.947 and round(Tunnel(WIREGUARD).share, 3) == 0.957


def test_a_link_through_the_tunnel_loses_its_headers_and_meets_the_ceiling_only_where_asked():
    link = Link(1e9, stack_s=50e-6, name="1GbE")
    tunnel = Tunnel(TAILSCALE, ceiling_bps=170e6, ceiling_from=BY_HAND)
    plain = tunnel.through(link, 0.85, ceiling=False)
    assert plain.rate_bps == pytest.approx(1e9 * tunnel.share) and plain.name == "1GbE over tailscale0"
    capped = tunnel.through(link, 0.85, ceiling=True)
    assert capped.rate_bps * 0.85 == pytest.approx(170e6)  # the ceiling is a payload rate, as iperf3 saw it
    # a 100 MB all-reduce over 3 ranks at the ceiling: 4/3 x 100 MB at 170 Mbit/s, plus 4 hops of 50 us
    assert collective_time_s(100e6, 3, capped, 0.85) == pytest.approx(4 / 3 * 100e6 * 8 / 170e6 + 4 * 50e-6)


def test_on_a_lab_the_ceiling_it_measured_prices_its_own_link_and_no_preset(tmp_path):
    save_rate(tmp_path, TAILSCALE, 180e6)
    assert measured_rate(tmp_path, TAILSCALE)[0] == 180e6
    assert measured_rate(tmp_path, WIREGUARD) is None  # another tunnel's measurement is not this one's
    tunnel = Tunnel(TAILSCALE, 180e6, "labctl bench allreduce on lab x, today")
    links = links_to_price((), None, tunnel=tunnel, efficiency=0.85)
    assert [link.name for link in links] == ["lab (unshaped) over tailscale0", "1GbE over tailscale0",
                                             "2.5GbE over tailscale0", "10GbE over tailscale0"]  # no RDMA, no NVLink
    assert links[0].rate_bps * 0.85 == pytest.approx(180e6) and links[1].rate_bps == pytest.approx(1e9 * tunnel.share)
    shaped = links_to_price((), ("1gbit", 10**9), tunnel=tunnel, efficiency=0.85)
    assert shaped[0].name == "lab (1gbit) over tailscale0" and shaped[0].rate_bps * 0.85 == pytest.approx(180e6)
    rows = step_report(CostQuery(25e6, ranks="3"), 3, links)
    assert rows[0]["link"] == "lab (unshaped) over tailscale0" and rows[0]["comm_s"] > rows[1]["comm_s"]
    notes = tunnel_notes(tunnel)
    assert "94.7% of a link's payload rate" in notes[0] and "180 Mbit/s a hop" in notes[1]


def test_a_ceiling_by_hand_needs_a_tunnel_and_a_rate():
    with pytest.raises(ConfigError, match="prices a tunnel, and there is none here"):
        tunnel_of("none", "1gbit", None)
    with pytest.raises(ConfigError, match="must be a rate"):
        tunnel_of("tailscale", "fast", None)
    assert tunnel_of(None, None, None) is None and tunnel_of("wireguard", None, None) == Tunnel(WIREGUARD)
    assert tunnel_of("tailscale", "10gbit", None) == Tunnel(TAILSCALE, 1e10, BY_HAND)
