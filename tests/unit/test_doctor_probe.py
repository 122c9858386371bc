"""doctor's reachability probe (labctl.diagnose.doctor.probe_reach) run for real on this machine, as
a one-host lab: labctl/remote/probe.py listening and connecting here, through the hosts' own runner.
A probe port drawn at random that some process already holds is drawn again, not reported as the
node's (nor, through the refused connections of the others, as a firewall); a port given is probed
once."""

from __future__ import annotations

import json

from test_remote import free_port, held_port, host  # noqa: F401 (held_port, host: the fixtures)

from labctl.diagnose import doctor
from labctl.diagnose.doctor import check_reach, probe_reach


def probe(monkeypatch, host, draws: list[int], probe_port: int | None = None):  # noqa: F811
    """probe_reach on a one-host "lab" of this machine (test_remote's LocalHost, as `labctl hosts
    check` probes real hosts): (the probe ports tried, the port reported, check_reach's findings)."""
    tried, run = [], host.run

    def recording(node, argv, **kwargs):
        tried.append(json.loads(argv[-1])["listen"][0])
        return run(node, argv, **kwargs)

    monkeypatch.setattr(host, "run", recording)
    drawn = iter(draws)
    monkeypatch.setattr(doctor.random, "randint", lambda low, high: next(drawn))
    master = ("node0", "127.0.0.1", free_port())
    port, results = probe_reach(host, {"node0": "127.0.0.1"}, master, probe_port, connect_s=0.5)
    return tried, port, check_reach(results, master, port, connect_s=0.5)


def test_a_drawn_port_that_is_taken_is_drawn_again_and_the_probe_passes(monkeypatch, host, held_port):  # noqa: F811
    other = free_port()
    tried, port, findings = probe(monkeypatch, host, [held_port, other])
    assert tried == [held_port, other] and port == other
    assert [(f.check, f.ok) for f in findings] == [("rendezvous", True), ("ports", True)], findings


def test_a_port_given_is_probed_once_and_a_bind_error_on_it_is_reported(monkeypatch, host, held_port):  # noqa: F811
    tried, port, findings = probe(monkeypatch, host, [], probe_port=held_port)
    assert tried == [held_port] and port == held_port
    bad = [f for f in findings if not f.ok]
    assert [(f.check, f.node) for f in bad] == [("ports", "node0")], findings
    assert f"cannot listen on probe port {held_port}" in bad[0].message


def test_draws_that_all_collide_end_in_the_finding(monkeypatch, host, held_port):  # noqa: F811
    tried, port, findings = probe(monkeypatch, host, [held_port] * doctor.PROBE_DRAWS)
    assert tried == [held_port] * doctor.PROBE_DRAWS and port == held_port
    assert any(not f.ok and "cannot listen on probe port" in f.message for f in findings), findings
