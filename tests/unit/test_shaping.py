"""tc command construction against golden files, and reading links back from tc's output."""

import shlex

import pytest

from labctl.errors import ConfigError
from labctl.net.tc import (
    LinkState, Shape, build_apply, build_clear, build_netem_probe, burst_bytes, describe, netem_missing, parse_link_state,
    parse_shape,
)
from test_render import check_golden


def as_text(commands) -> str:
    return "".join(("-" if c.may_fail else "") + shlex.join(c.argv) + "\n" for c in commands)


@pytest.mark.parametrize("name, commands", [
    ("tc-100mbit.txt", build_apply(Shape(100_000_000))),
    ("tc-1gbit-ingress.txt", build_apply(Shape(10**9, ingress=True))),
    ("tc-100mbit-netem.txt", build_apply(Shape(100_000_000, delay_us=10_000, jitter_us=2_000, loss_pct=1.0))),
    ("tc-clear.txt", build_clear("eth0")),
    ("tc-netem-probe.txt", build_netem_probe()),
])
def test_commands_golden(name, commands):
    check_golden(name, as_text(commands))


def test_apply_clears_first_and_never_stacks():
    commands = build_apply(Shape(10**8))
    assert commands[: len(build_clear("eth0"))] == build_clear("eth0")
    assert not any(c.may_fail for c in commands[len(build_clear("eth0")):])


def test_burst_covers_two_ticks():
    assert burst_bytes(100_000_000) == 131072
    assert burst_bytes(10**9) == 10**9 // 8 // 125


def test_parse_shape_checks_everything_first():
    assert parse_shape("100mbit", "10ms", "2ms", "1") == Shape(10**8, 10_000, 2_000, 1.0)
    assert parse_shape("1gbit").needs_netem is False
    with pytest.raises(ConfigError, match="--jitter"):
        parse_shape("1gbit", jitter="2ms")
    with pytest.raises(ConfigError, match="must not exceed --delay"):
        parse_shape("1gbit", delay="1ms", jitter="2ms")
    with pytest.raises(ConfigError, match="--delay"):
        parse_shape("1gbit", delay="10")


# Real output of `tc qdisc show dev eth0` (iproute2 6.1, Debian bookworm) in a lab node after
# `labctl shape --bw 100mbit --ingress`; the netem line follows tc-netem(8)'s print format.
TBF = "qdisc tbf 1: root refcnt 2 rate 100Mbit burst 131062b lat 100ms \n"
INGRESS = "qdisc ingress ffff: parent ffff:fff1 ---------------- \n"
NETEM = "qdisc netem 10: parent 1:1 limit 1000 delay 10ms  2ms loss 1%\n"


@pytest.mark.parametrize("qdiscs, ifb, expected, text", [
    ("qdisc noqueue 0: root refcnt 2 \n", "", LinkState(kind="none"), "unshaped"),
    (TBF, "", LinkState(kind="tbf", rate_bps=10**8), "100mbit"),
    (TBF.replace("100Mbit", "1Gbit") + INGRESS, TBF, LinkState(kind="tbf", rate_bps=10**9, ingress=True), "1gbit in+out"),
    (TBF + NETEM, "", LinkState(kind="tbf+netem", rate_bps=10**8, delay_us=10_000, jitter_us=2_000, loss_pct=1.0),
     "100mbit +10ms±2ms 1% loss"),
    ("qdisc cake 8001: root refcnt 2 bandwidth 100Mbit\n", "", LinkState(kind="other:cake"), "other:cake"),
])
def test_parse_link_state(qdiscs, ifb, expected, text):
    state = parse_link_state(qdiscs, ifb)
    assert state == expected
    assert describe(state) == text


def test_netem_missing_recognises_tc():
    assert netem_missing("FAILED: tc qdisc add dev x root netem delay 1ms\nError: Specified qdisc kind is unknown.")
    assert not netem_missing("RTNETLINK answers: Operation not permitted")
