"""Links between groups of nodes (`labctl shape --to`): the htb, classes and filters built for them
(golden files; UPDATE_GOLDEN=1 to accept a change), tc's own output parsed back, the ring's hops
priced from it, on labctl's side (text) and in the trainer's step model (JSON)."""

import pytest
from test_render import check_golden
from test_shaping import as_text

from labctl.errors import LabError
from labctl.net.apply import slowest_link
from labctl.net.routes import Route, build_node, lab_ring, merge_routes, parse_routed_link, routes_of, shape_of
from labctl.net.tc import LinkState, RouteState, Shape, check_to, describe_link
from trainer.tclinks import parse_classes, parse_qdiscs, ring_steps
from trainer.tclinks import ring_hops as trainer_hops

A, B, C = "172.28.0.12", "172.28.0.13", "172.28.0.11"
SPINE = Route((A, B), Shape(100_000_000))


@pytest.mark.parametrize("name, rest, routes", [
    ("tc-routes-unshaped-rest.txt", None, [SPINE]),
    ("tc-routes-1gbit-rest.txt", Shape(10**9), [SPINE]),
    ("tc-routes-delay-and-ingress.txt", Shape(10**9, delay_us=1_000, ingress=True),
     [Route((A,), Shape(100_000_000, delay_us=5_000)), Route((B,), Shape(delay_us=20_000, loss_pct=0.5))]),
])
def test_routed_egress_golden(name, rest, routes):
    commands = build_node(rest, routes)
    check_golden(name, as_text(commands))
    assert [c.argv[:3] for c in commands[:3]] == [("tc", "qdisc", "del"), ("tc", "qdisc", "del"), ("ip", "link", "del")]
    filters = [c.argv for c in commands if c.argv[1] == "filter" and "u32" in c.argv and "dst" in c.argv]
    assert [f[f.index("dst") + 1] for f in filters] == [f"{d}/32" for r in routes for d in r.dsts]
    assert ("default", "1") == tuple(commands[3].argv[-2:]) if rest else "default" not in commands[3].argv


def test_no_routes_is_the_plain_link():
    assert build_node(None, []) == build_node(None, [])[:3]  # a clear
    added = [c.argv[5:7] for c in build_node(Shape(10**8), []) if c.argv[:3] == ("tc", "qdisc", "add")]
    assert added == [("root", "handle"), ("parent", "1:1"), ("parent", "20:1"), ("parent", "20:2")]  # tbf, small_first's
    assert "tbf" in as_text(build_node(Shape(10**8), []))


def test_merging_routes_lets_the_newer_request_win():
    routes = merge_routes([SPINE], (B, C), Shape(50_000_000))
    assert routes == [Route((A,), SPINE.shape), Route((B, C), Shape(50_000_000))]
    assert merge_routes(routes, (A,), None) == [Route((B, C), Shape(50_000_000))]  # a clear
    assert merge_routes([SPINE], (A, B), None) == []


# `tc qdisc/class/filter show dev eth0` in a lab node (iproute2 6.1) after `labctl shape --node node0 --bw
# 1gbit` and `labctl shape --node node0 --to node2,node3 --bw 100mbit`; the netem line for route 1:2
# follows iproute2's q_netem.c print format, as test_shaping's do (this kernel has no netem).
QDISCS = "qdisc htb 1: root refcnt 3 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 1000\n"
CLASSES = ("class htb 1:1 root prio 0 rate 1Gbit ceil 1Gbit burst 131000b cburst 131000b \n"
           "class htb 1:2 root prio 0 rate 100Mbit ceil 100Mbit burst 131050b cburst 131050b \n")
FILTERS = """filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:2 not_in_hw 
  match ac1c000c/ffffffff at 16
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 *flowid 1:2 not_in_hw 
  match ac1c000d/ffffffff at 16
"""  # noqa: W291 -- tc's trailing spaces, as it prints them
NETEM_2 = "qdisc netem 20: parent 1:2 limit 1000 delay 5ms\n"
NAMES = {A: "node2", B: "node3"}


def test_a_routed_link_reads_back_as_the_rest_and_its_routes():
    state = parse_routed_link(QDISCS, CLASSES, FILTERS)
    assert (state.kind, state.rate_bps) == ("htb", 10**9)
    assert [(r.dsts, r.state.rate_bps, r.state.delay_us) for r in state.routes] == [((A, B), 10**8, None)]
    assert describe_link(state, NAMES) == "1gbit; to node2,node3: 100mbit"
    assert describe_link(state) == f"1gbit; to {A},{B}: 100mbit"
    with_delay = parse_routed_link(QDISCS + NETEM_2, CLASSES, FILTERS)
    assert describe_link(with_delay, NAMES) == "1gbit; to node2,node3: 100mbit +5ms"
    assert routes_of(with_delay) == [Route((A, B), Shape(10**8, delay_us=5_000))]
    assert shape_of(with_delay) == Shape(10**9)


def test_every_rate_reads_back_whatever_unit_tc_prints_its_bucket_in():
    classes = CLASSES.replace("100Mbit", "50Mbit").replace("131050b", "128Kb")
    assert describe_link(parse_routed_link(QDISCS, classes, FILTERS), NAMES) == "1gbit; to node2,node3: 50mbit"


def test_a_routed_link_with_an_unshaped_rest():
    state = parse_routed_link(QDISCS.replace(" default 0x1", ""), CLASSES.splitlines()[1], FILTERS)
    assert describe_link(state, NAMES) == "unshaped; to node2,node3: 100mbit"
    assert shape_of(state) is None


def links(route_from: str, route_to: str) -> tuple[dict[str, LinkState], dict[str, str]]:
    """Four unshaped nodes but for one 100mbit route; and their addresses."""
    ips = {"node0": "10.0.0.10", "node1": "10.0.0.11", "node2": "10.0.0.12", "node3": "10.0.0.13"}
    out = {n: LinkState(kind="none") for n in ips}
    out[route_from] = LinkState(kind="none", routes=(RouteState((ips[route_to],), LinkState(kind="htb", rate_bps=10**8)),))
    return out, ips


def test_the_ring_turns_as_gloo_s_all_reduce_does():
    """gloo's all-reduce sends to rank r-1: node1 -> node0 is on its ring, node0 -> node1 is not."""
    on_ring, ips = links("node1", "node0")
    assert slowest_link(on_ring, ips) == ("node1", "node0", 10**8)
    assert slowest_link(on_ring, ips, steps=(1,)) is None  # all-gather's ring turns the other way
    off_ring, _ = links("node0", "node1")
    assert slowest_link(off_ring, ips) is None
    assert slowest_link(off_ring, ips, steps=(-1, 1)) == ("node0", "node1", 10**8)
    assert [(h.sender, h.receiver) for h in lab_ring(on_ring, ips)][:2] == [("node0", "node3"), ("node1", "node0")]


def test_to_goes_with_a_shape_or_clear_only():
    check_to(False, False, None)
    for args, fragment in (((False, True, None), "--ingress has no place"), ((False, False, "3s"), "stay until cleared"),
                           ((True, False, None), "drop --to")):
        with pytest.raises(LabError, match=fragment):
            check_to(*args)


# The trainer reads the same link with `tc -j` (qdiscs, filters) and `tc class show` (htb prints no JSON).
JSON_QDISCS = [{"kind": "noqueue", "dev": "lo", "root": True},
               {"kind": "htb", "handle": "1:", "dev": "eth0", "root": True, "options": {"r2q": 10, "default": "0x1"}},
               {"kind": "netem", "handle": "20:", "dev": "eth0", "parent": "1:2", "options": {"delay": {"delay": 0.005}}}]
JSON_FILTERS = [{"parent": "1:", "kind": "u32"},
                {"parent": "1:", "kind": "u32", "options": {"fh": "800::800", "flowid": "1:2",
                 "match": {"value": "ac1c000c", "mask": "ffffffff", "offmask": "", "off": 16}}},
                {"parent": "1:", "kind": "u32", "options": {"fh": "800::801", "flowid": "1:2",
                 "match": {"value": "ac1c000d", "mask": "ffffffff", "offmask": "", "off": 16}}}]


def test_the_trainer_reads_each_route_and_the_rest_of_the_link():
    classes = parse_classes(CLASSES)
    assert classes["1:2"] == {"rate_bps": 1e8, "burst_bytes": 131050.0}
    # below about 800mbit tc prints the 128 KiB bucket in KiB
    assert parse_classes("class htb 1:3 root prio 0 rate 50Mbit ceil 50Mbit burst 128Kb cburst 128Kb \n") == \
        {"1:3": {"rate_bps": 5e7, "burst_bytes": 131072.0}}
    shaping = parse_qdiscs(JSON_QDISCS, {"eth0": classes}, {"eth0": JSON_FILTERS})
    assert shaping["egress"] == {"rate_bps": 1e9, "burst_bytes": 131000.0}  # the route's netem is not the rest's
    assert shaping["routes"] == {ip: {"rate_bps": 1e8, "burst_bytes": 131050.0, "delay_s": 0.005} for ip in (A, B)}


def test_the_trainer_prices_the_hop_to_the_receivers_address():
    shaping = {"n1": parse_qdiscs(JSON_QDISCS, {"eth0": parse_classes(CLASSES)}, {"eth0": JSON_FILTERS})}
    ips = {"n0": C, "n1": "172.28.0.10", "n2": A}
    assert [h["rate_bps"] for h in trainer_hops(["n0", "n1", "n2"], shaping, ips)] == [None, 1e9, None]  # n1 -> n0: the rest
    hops = trainer_hops(["n0", "n1", "n2"], shaping, ips, steps=(1,))  # n1 -> n2: its route to A
    assert [h["rate_bps"] for h in hops] == [None, 1e8, None] and hops[1]["delay_s"] == 0.005
    assert ring_steps("ddp", "gloo") == (-1,) and ring_steps("fsdp", "gloo") == (-1, 1) and ring_steps("ddp", "nccl") == (-1, 1)
