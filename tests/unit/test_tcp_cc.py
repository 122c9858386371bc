"""The nodes' TCP congestion control (labctl.lab.tcp): what `up` asks of Compose on each kind of host."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import StateError
from labctl.lab import tcp
from labctl.lab.compose import ComposePlan, build_compose, load_template
from labctl.spec.labspec import ConfigError, resolve_config

BBR_HOST = tcp.HostTcp(default="bbr", allowed=("reno", "bbr"))  # this project's machines, as they come
CUBIC_HOST = tcp.HostTcp(default="cubic", allowed=("reno", "cubic"))  # Linux as it comes
WORKSPACE = Path("/work/space")


def test_cubic_by_default_where_the_host_allows_it():
    assert tcp.plan_tcp_cc("cubic", False, CUBIC_HOST) == ("cubic", None)
    assert tcp.plan_tcp_cc("cubic", False, tcp.HostTcp("bbr", ("reno", "bbr", "cubic"))) == ("cubic", None)


def test_a_bbr_host_that_does_not_allow_cubic_keeps_its_own_and_up_says_how_to_allow_it():
    value, note = tcp.plan_tcp_cc("cubic", False, BBR_HOST)
    assert value is None
    assert "host's TCP congestion control, bbr, not cubic" in note
    assert 'tcp_allowed_congestion_control="reno bbr cubic"' in note


def test_asked_for_by_name_and_not_allowed_is_refused_with_the_sysctl_that_allows_it():
    with pytest.raises(StateError) as refused:
        tcp.plan_tcp_cc("cubic", True, BBR_HOST)
    assert refused.value.exit_code == 1
    assert "choose only reno, bbr" in str(refused.value)
    assert 'sysctl -w net.ipv4.tcp_allowed_congestion_control="reno bbr cubic"' in refused.value.hint
    assert "--tcp-cc host" in refused.value.hint


def test_asked_for_by_name_and_not_in_the_kernel_is_refused_with_the_module_to_load_first():
    host = tcp.HostTcp("bbr", ("reno", "bbr"), available=("reno", "bbr", "cubic"))
    with pytest.raises(StateError) as refused:
        tcp.plan_tcp_cc("vegas", True, host)
    assert refused.value.exit_code == 1
    assert "no TCP congestion control vegas loaded (it has: reno, bbr, cubic" in str(refused.value)
    assert "modprobe tcp_vegas, then sysctl -w net.ipv4.tcp_allowed_congestion_control=\"reno bbr vegas\"" in refused.value.hint
    # loaded but not allowed is the other refusal, and an unread list refuses as not allowed
    with pytest.raises(StateError, match="choose only reno, bbr"):
        tcp.plan_tcp_cc("cubic", True, host)
    with pytest.raises(StateError, match="choose only reno, bbr"):
        tcp.plan_tcp_cc("vegas", True, BBR_HOST)


def test_host_keeps_the_hosts_and_an_unknown_host_leaves_the_choice_to_the_engine():
    assert tcp.plan_tcp_cc("host", True, BBR_HOST) == (None, None)
    assert tcp.plan_tcp_cc("bbr", True, BBR_HOST) == ("bbr", None)
    assert tcp.plan_tcp_cc("cubic", False, None) == ("cubic", None)  # Docker Desktop's VM: Compose applies it
    assert tcp.plan_tcp_cc("host", False, None) == (None, None)


def test_read_host_tcp_reads_proc_and_gives_up_quietly(tmp_path):
    (tmp_path / "tcp_congestion_control").write_text("bbr\n")
    (tmp_path / "tcp_allowed_congestion_control").write_text("reno bbr\n")
    assert tcp.read_host_tcp(True, tmp_path) == BBR_HOST  # without the available list: not known
    (tmp_path / "tcp_available_congestion_control").write_text("reno bbr cubic\n")
    assert tcp.read_host_tcp(True, tmp_path) == tcp.HostTcp("bbr", ("reno", "bbr"), ("reno", "bbr", "cubic"))
    assert tcp.read_host_tcp(False, tmp_path) is None
    assert tcp.read_host_tcp(True, tmp_path / "missing") is None


def test_compose_sets_the_sysctl_on_every_node_only_when_one_is_chosen():
    config = resolve_config()
    plan = ComposePlan(subnet="172.28.5.0/24", workspace=WORKSPACE, user="1000:1000", tcp_cc="cubic")
    nodes = build_compose(config, plan, load_template())["services"].values()
    assert [n["sysctls"] for n in nodes] == [{"net.ipv4.tcp_congestion_control": "cubic"}] * config.nodes
    plain = ComposePlan(subnet="172.28.5.0/24", workspace=WORKSPACE, user="1000:1000")
    assert all("sysctls" not in n for n in build_compose(config, plain, load_template())["services"].values())


def test_the_setting_defaults_to_cubic_and_names_what_it_takes():
    assert resolve_config().tcp_cc == "cubic"
    assert resolve_config(environ={"DDPLAB_TCP_CC": "host"}).tcp_cc == "host"
    with pytest.raises(ConfigError, match="congestion control such as cubic"):
        resolve_config(flags={"tcp_cc": "cubic; rm"})
