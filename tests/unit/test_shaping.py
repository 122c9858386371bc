"""tc command construction against golden files (UPDATE_GOLDEN=1 to accept a change), and reading
links back from tc's output."""

import shlex

import pytest
from test_render import check_golden

from labctl.errors import ConfigError, LabError
from labctl.net.tc import (
    LinkState,
    Shape,
    build_apply,
    build_clear,
    build_netem_probe,
    build_plan,
    build_undo,
    burst_bytes,
    describe_link,
    netem_limit,
    netem_missing,
    parse_link_state,
    parse_shape,
    parse_shape_request,
)
from labctl.spec.units import parse_duration_s


def as_text(commands) -> str:
    return "".join(("-" if c.may_fail else "") + shlex.join(c.argv) + "\n" for c in commands)


@pytest.mark.parametrize("name, commands", [
    ("tc-100mbit.txt", build_apply(Shape(100_000_000))),
    ("tc-1gbit-ingress.txt", build_apply(Shape(10**9, ingress=True))),
    ("tc-clear.txt", build_clear("eth0")),
    ("tc-netem-probe.txt", build_netem_probe()),
    ("tc-undo-30s.txt", build_undo(30)),
])
def test_commands_golden(name, commands):
    check_golden(name, as_text(commands))


COMBOS = {"delay": dict(delay_us=10_000), "delay-jitter": dict(delay_us=10_000, jitter_us=2_000),
         "loss": dict(loss_pct=1.0), "delay-loss": dict(delay_us=10_000, loss_pct=0.5),
         "delay-jitter-loss": dict(delay_us=10_000, jitter_us=2_000, loss_pct=1.0)}


@pytest.mark.parametrize("direction", ["egress", "ingress"])
@pytest.mark.parametrize("rate", [None, 100_000_000])
@pytest.mark.parametrize("netem", list(COMBOS))
def test_every_netem_combination_golden(netem, rate, direction):
    """Without a rate netem is the root qdisc; with one it is tbf's child; --ingress repeats it on ifb0."""
    shape = Shape(rate, ingress=direction == "ingress", **COMBOS[netem]).validate()
    commands = build_apply(shape)
    check_golden(f"tc-{'100mbit' if rate else 'norate'}-{netem}-{direction}.txt", as_text(commands))
    netem_lines = [c.argv for c in commands if "netem" in c.argv]
    assert len(netem_lines) == (2 if shape.ingress else 1)
    assert all(argv[5:7] == (("parent", "1:1") if rate else ("root", "handle")) for argv in netem_lines)
    assert sum("tbf" in c.argv for c in commands) == (0 if rate is None else len(netem_lines))


def test_netem_limit_holds_the_delayed_traffic():
    assert netem_limit(Shape(loss_pct=1.0)) == 1000  # no delay: netem's own default
    assert netem_limit(Shape(10**8, delay_us=10_000)) == 1000  # 100mbit x 10ms is 84 packets
    assert netem_limit(Shape(delay_us=10_000)) == 16_667  # unshaped veth: 10gbit x 10ms, twice, in 1500 B
    assert netem_limit(Shape(10**9, delay_us=100_000, jitter_us=20_000)) == 20_000


def test_plan_with_duration_undoes_after_it():
    plan = build_plan(Shape(10**8), duration_s=30)
    assert plan.commands == build_apply(Shape(10**8))
    assert plan.undo[0].argv == ("sleep", "30") and plan.undo[1:] == build_clear("eth0")
    assert build_plan(Shape(10**8)).undo == [] and build_plan(None).commands == build_clear("eth0")


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("2m", 120), ("1.5m", 90), ("1h", 3600), (45, 45)])
def test_parse_duration(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text, fragment", [("30", "add a unit"), ("0s", "from 1s to 24h"), ("25h", "from 1s to 24h"),
                                            ("soon", "such as 30s")])
def test_parse_duration_refuses(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_duration_s(text)


def test_apply_clears_first_and_never_stacks():
    commands = build_apply(Shape(10**8))
    assert commands[: len(build_clear("eth0"))] == build_clear("eth0")
    assert not any(c.may_fail for c in commands[len(build_clear("eth0")):])


def test_burst_covers_two_ticks():
    assert burst_bytes(100_000_000) == 131072
    assert burst_bytes(10**9) == 131072  # 1 ms at 1gbit is 125,000 B: the floor wins
    assert burst_bytes(10 * 10**9) == 1_250_000


def test_parse_shape_checks_everything_first():
    assert parse_shape("100mbit", "10ms", "2ms", "1") == Shape(10**8, 10_000, 2_000, 1.0)
    assert parse_shape("1gbit").needs_netem is False
    assert parse_shape(None, "10ms") == Shape(None, 10_000) == Shape(delay_us=10_000)
    assert parse_shape(loss="1", ingress=True) == Shape(loss_pct=1.0, ingress=True)
    with pytest.raises(LabError, match="nothing to shape"):
        parse_shape(ingress=True)
    with pytest.raises(ConfigError, match="needs --delay"):
        parse_shape(jitter="2ms")
    with pytest.raises(ConfigError, match="--jitter"):
        parse_shape("1gbit", jitter="2ms")
    with pytest.raises(ConfigError, match="must not exceed --delay"):
        parse_shape("1gbit", delay="1ms", jitter="2ms")
    with pytest.raises(ConfigError, match="--delay"):
        parse_shape("1gbit", delay="10")


@pytest.mark.parametrize("args, kwargs, expected", [
    ((None, "10ms"), {}, Shape(delay_us=10_000)),
    (("1gbit",), {"duration": "30s"}, Shape(10**9)),
    ((None, None, None, "1", True), {}, Shape(loss_pct=1.0, ingress=True)),
    ((None,), {"clear": True}, None),
    ((None,), {"show": True}, None),
])
def test_shape_request(args, kwargs, expected):
    assert parse_shape_request(*args, **kwargs) == expected


@pytest.mark.parametrize("args, kwargs, fragment", [
    ((None,), {}, "got none"),
    ((None,), {"duration": "30s"}, "got none"),
    ((None, None, None, None, True), {}, "--ingress says where to shape, not what"),
    (("1gbit", "5ms"), {"clear": True}, r"got a shape \(--bw, --delay\) and --clear"),
    ((None,), {"clear": True, "duration": "30s"}, "--duration goes with a shape, not with --clear"),
    ((None,), {"show": True, "ingress": True}, "--ingress goes with a shape"),
    ((None, "5ms"), {"duration": "5"}, "add a unit"),
])
def test_shape_request_refuses(args, kwargs, fragment):
    with pytest.raises(LabError, match=fragment):
        parse_shape_request(*args, **kwargs)


# Real output of `tc qdisc show dev eth0` (iproute2 6.1, Debian bookworm) in a lab node after
# `labctl shape --bw 100mbit --ingress`; the netem lines follow iproute2's q_netem.c print format
# (limit, then "delay TIME  JITTER" with two spaces, then "loss PCT%"), as its tc-testing suite matches it.
TBF = "qdisc tbf 1: root refcnt 2 rate 100Mbit burst 131062b lat 100ms \n"
INGRESS = "qdisc ingress ffff: parent ffff:fff1 ---------------- \n"
NETEM = "qdisc netem 10: parent 1:1 limit 1000 delay 10ms  2ms loss 1%\n"
ROOT_NETEM = "qdisc netem 10: root refcnt 2 limit 10000 delay 10ms  2ms loss 1%\n"
# tbf's child that sends short packets first (tc.small_first), as a node printed it (iproute2 6.1, 2026-11-29)
SMALL_FIRST = ("qdisc bfifo 21: parent 20:1 limit 381072b\n"
               "qdisc htb 20: parent 1:1 r2q 10 default 0x2 direct_packets_stat 0 direct_qlen 1000\n"
               "qdisc bfifo 22: parent 20:2 limit 381072b\n")


@pytest.mark.parametrize("qdiscs, ifb, expected, text", [
    ("qdisc noqueue 0: root refcnt 2 \n", "", LinkState(kind="none"), "unshaped"),
    (TBF, "", LinkState(kind="tbf", rate_bps=10**8), "100mbit"),
    (TBF + SMALL_FIRST, "", LinkState(kind="tbf", rate_bps=10**8), "100mbit"),
    (TBF.replace("100Mbit", "1Gbit") + INGRESS, TBF.replace("100Mbit", "1Gbit"),
     LinkState(kind="tbf", rate_bps=10**9, ingress=True, inbound=LinkState(kind="tbf", rate_bps=10**9)), "1gbit in+out"),
    (TBF + NETEM, "", LinkState(kind="tbf+netem", rate_bps=10**8, delay_us=10_000, jitter_us=2_000, loss_pct=1.0),
     "100mbit +10ms±2ms 1% loss"),
    (ROOT_NETEM, "", LinkState(kind="netem", delay_us=10_000, jitter_us=2_000, loss_pct=1.0), "+10ms±2ms 1% loss"),
    ("qdisc netem 10: root refcnt 2 limit 1000 loss 0.5%\n", "", LinkState(kind="netem", delay_us=0, jitter_us=0,
                                                                          loss_pct=0.5), "0.5% loss"),
    ("qdisc netem 10: root refcnt 2 limit 16667 delay 12.5ms\n", "",
     LinkState(kind="netem", delay_us=12_500, jitter_us=0, loss_pct=0.0), "+12.5ms"),
    (ROOT_NETEM + INGRESS, ROOT_NETEM, LinkState(kind="netem", delay_us=10_000, jitter_us=2_000, loss_pct=1.0, ingress=True,
     inbound=LinkState(kind="netem", delay_us=10_000, jitter_us=2_000, loss_pct=1.0)), "in+out +10ms±2ms 1% loss"),
    (TBF + NETEM + INGRESS, TBF + NETEM, LinkState(kind="tbf+netem", rate_bps=10**8, delay_us=10_000, jitter_us=2_000,
     loss_pct=1.0, ingress=True, inbound=LinkState(kind="tbf+netem", rate_bps=10**8, delay_us=10_000, jitter_us=2_000,
     loss_pct=1.0)), "100mbit in+out +10ms±2ms 1% loss"),
    (TBF + INGRESS, TBF.replace("100Mbit", "50Mbit") + NETEM.replace("10ms  2ms", "5ms"),
     LinkState(kind="tbf", rate_bps=10**8, ingress=True, inbound=LinkState(kind="tbf+netem", rate_bps=5 * 10**7,
     delay_us=5_000, jitter_us=0, loss_pct=1.0)), "100mbit (in: 50mbit +5ms 1% loss)"),
    (TBF + INGRESS, "qdisc noqueue 0: root refcnt 2 \n", LinkState(kind="tbf", rate_bps=10**8), "100mbit"),
    ("qdisc cake 8001: root refcnt 2 bandwidth 100Mbit\n", "", LinkState(kind="other:cake"), "other:cake"),
])
def test_parse_link_state(qdiscs, ifb, expected, text):
    state = parse_link_state(qdiscs, ifb)
    assert state == expected
    assert describe_link(state) == text


def test_netem_missing_recognises_tc():
    assert netem_missing("FAILED: tc qdisc add dev x root netem delay 1ms\nError: Specified qdisc kind is unknown.")
    assert not netem_missing("RTNETLINK answers: Operation not permitted")
