"""`hosts check`'s findings from what the hosts reported: each problem named with its host and fix,
and nothing claimed of a host that was not checked."""

from pathlib import Path

from labctl.errors import LabError
from labctl.hosts.actions import Reached, host_findings, env_file_values
from labctl.hosts.inventory import parse_inventory
from labctl.hosts.ssh import SSHError

INV = parse_inventory('[defaults]\niface = "tailscale0"\n[[hosts]]\nname = "ws"\naddress = "100.64.0.1"\n'
                      '[[hosts]]\nname = "laptop"\naddress = "100.64.0.2"\n', Path("/x/cluster.toml"))


def info(address: str, torch: str | None = "2.13.0+cpu", iface: str = "tailscale0", rsync: bool = True) -> dict:
    return {"torch": torch, "python": "3.11.2", "cuda": None, "nccl": None, "rsync": rsync,
            "ifaces": {"lo": ["127.0.0.1/8"], iface: [f"{address}/32"]}}


def by_check(findings):
    return {(f.check, f.node, f.ok) for f in findings}


def test_two_good_hosts_pass_every_check():
    findings = host_findings(INV, Reached({"ws": info("100.64.0.1"), "laptop": info("100.64.0.2")}, {}))
    assert all(f.ok for f in findings)
    assert {("ssh", "all", True), ("env", "all", True), ("versions", "all", True), ("iface", "all", True)} == \
        by_check(findings)


def test_a_host_not_reached_is_named_and_nothing_is_claimed_for_every_node():
    failed = {"laptop": SSHError(INV.hosts[1], "laptop (100.64.0.2:22): cannot reach it over SSH (Connection timed "
                                 "out)", hint="is it up?", kind="unreachable")}
    findings = host_findings(INV, Reached({"ws": info("100.64.0.1")}, failed))
    [ssh] = [f for f in findings if not f.ok]
    assert (ssh.check, ssh.node, ssh.fix) == ("ssh", "laptop", "is it up?") and "Connection timed out" in ssh.message
    assert not any(f.ok and f.check in ("ssh", "versions", "iface") for f in findings)


def test_a_python_that_does_not_run_is_a_python_problem():
    failed = {"ws": LabError("ws (100.64.0.1:22): python3 did not run there: not found", hint="set python")}
    [bad] = [f for f in host_findings(INV, Reached({"laptop": info("100.64.0.2")}, failed)) if not f.ok]
    assert (bad.check, bad.node) == ("python", "ws")


def test_mixed_releases_and_a_host_without_torch_are_named():
    findings = host_findings(INV, Reached({"ws": info("100.64.0.1", torch=None), "laptop": info("100.64.0.2")}, {}))
    [missing] = [f for f in findings if f.check == "versions"]
    assert missing.node == "ws" and "has no torch" in missing.message
    mixed = host_findings(INV, Reached({"ws": info("100.64.0.1", torch="2.14.1+cu130"),
                                        "laptop": info("100.64.0.2")}, {}))
    [odd] = [f for f in mixed if f.check == "versions" and not f.ok]  # the one unlike the most common release
    assert "2.14.1+cu130" in odd.message and "2.13.0+cpu" in odd.message and "torch never checks" in odd.message


def test_a_wrong_interface_points_at_the_inventory_and_ip_route_get():
    findings = host_findings(INV, Reached({"ws": info("100.64.0.1"), "laptop": info("192.168.1.7", iface="wlan0")},
                                          {}))
    [bad] = [f for f in findings if f.check == "iface"]
    assert bad.node == "laptop" and "no such interface" in bad.message and "wlan0 (192.168.1.7/32)" in bad.message
    assert bad.fix.startswith("set iface for laptop in /x/cluster.toml to the interface")
    assert "`ip route get 100.64.0.1`" in bad.fix


def test_rsync_missing_on_a_host_is_a_problem_for_sync():
    findings = host_findings(INV, Reached({"ws": info("100.64.0.1"), "laptop": info("100.64.0.2", rsync=False)}, {}))
    assert ("tools", "laptop", False) in by_check(findings)


def test_env_files_as_the_hosts_will_load_them():
    env = env_file_values(INV.env_files()["laptop"])
    assert env["NODE_RANK"] == "1" and env["MASTER_ADDR"] == "100.64.0.1" and env["PET_RDZV_CONF"] == "is_host=false"
