"""doctor's reachability probe (labctl.diagnose.doctor.probe_reach) run for real on this machine, as
a one-node lab: labctl/remote/probe.py listening and connecting here. A probe port drawn at random
that some process already holds is drawn again, not reported as the node's (nor, through the
refused connections of the others, as a firewall); a port given is probed once."""

from __future__ import annotations

import json
import subprocess
import sys

from test_remote import free_port, held_port  # noqa: F401 (held_port: the fixture)

from labctl.diagnose import doctor
from labctl.diagnose.doctor import check_reach, probe_reach


class HereNodes:
    """A lab of this machine: each node's command run here, as `docker exec` runs it on a node."""

    def __init__(self):
        self.ports: list[int] = []

    def run(self, node: str, argv: list[str]) -> tuple[int, str]:
        self.ports.append(json.loads(argv[-1])["listen"][0])
        done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60, check=False)
        return done.returncode, done.stdout + done.stderr


def probe(monkeypatch, draws: list[int], probe_port: int | None = None):
    nodes, master = HereNodes(), ("node0", "127.0.0.1", free_port())
    drawn = iter(draws)
    monkeypatch.setattr(doctor.random, "randint", lambda low, high: next(drawn))
    port, results = probe_reach(nodes, {"node0": "127.0.0.1"}, master, probe_port, connect_s=0.5)
    return nodes.ports, port, check_reach(results, master, port, connect_s=0.5)


def test_a_drawn_port_that_is_taken_is_drawn_again_and_the_probe_passes(monkeypatch, held_port):  # noqa: F811
    other = free_port()
    tried, port, findings = probe(monkeypatch, [held_port, other])
    assert tried == [held_port, other] and port == other
    assert [(f.check, f.ok) for f in findings] == [("rendezvous", True), ("ports", True)], findings


def test_a_port_given_is_probed_once_and_a_bind_error_on_it_is_reported(monkeypatch, held_port):  # noqa: F811
    tried, port, findings = probe(monkeypatch, [], probe_port=held_port)
    assert tried == [held_port] and port == held_port
    bad = [f for f in findings if not f.ok]
    assert [(f.check, f.node) for f in bad] == [("ports", "node0")], findings
    assert f"cannot listen on probe port {held_port}" in bad[0].message


def test_draws_that_all_collide_end_in_the_finding(monkeypatch, held_port):  # noqa: F811
    tried, port, findings = probe(monkeypatch, [held_port] * doctor.PROBE_DRAWS)
    assert tried == [held_port] * doctor.PROBE_DRAWS and port == held_port
    assert any(not f.ok and "cannot listen on probe port" in f.message for f in findings), findings
