"""`labctl exec`'s command line and its checks of the lab and the node: no engine needed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from labctl.cli import main
from labctl.lab.docker import docker_exec_argv


def container(lab, node, state="running", created=1000, workspace="/home/ann/ddp", rank=None, **extra):
    labels = {"io.ddplab.lab": lab, "io.ddplab.workspace": workspace, "com.docker.compose.project": lab}
    if node:
        labels |= {"io.ddplab.node": node, "io.ddplab.node-rank": str(rank if rank is not None else node[-1])}
    return {"Id": f"{lab}-{node}", "Names": [f"/{lab}-{node}"], "State": state, "Created": created,
            "Labels": labels | extra}


def test_exec_argv():
    assert docker_exec_argv("lab-node1", ["hostname"]) == ["docker", "exec", "-i", "lab-node1", "hostname"]
    assert docker_exec_argv("lab-node0", ["bash", "-l"], tty=True) == ["docker", "exec", "-i", "-t", "lab-node0", "bash", "-l"]


def test_exec_without_a_command_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for argv in (["exec", "node1", "--"], ["exec", "node1"]):
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
        assert result.exit_code == 2, result.output
    result = CliRunner().invoke(main, ["exec", "node1", "--", "hostname"], catch_exceptions=False)
    assert result.exit_code == 1 and "no Docker engine answers" in result.output  # the machine's state, not the input


class FakeAPI:
    """What lab_status asks of the engine: the lab's containers, and each running node's log."""

    def __init__(self, containers):
        self._containers = containers

    def containers(self, all=False, filters=None):
        return self._containers

    def logs(self, container, tail=None):
        return b"DDPLAB_READY torch=2.13.0+cpu\n"


class FakeClient:
    def __init__(self, containers):
        self.api = FakeAPI(containers)


def lab_with(tmp_path, containers):
    from labctl.config import load_config
    from labctl.lab.session import LabSession

    return LabSession(load_config(tmp_path, {}, {"lab": "demo"}), tmp_path, FakeClient(containers))


def test_exec_checks_the_lab_and_the_node(tmp_path):
    from labctl.errors import LabError, StateError

    nodes = [container("demo", "node0"), container("demo", "node1", state="exited"),
             container("demo", "node2", state="paused")]
    lab = lab_with(tmp_path, nodes)
    assert lab.exec_argv("node0", ["--", "hostname"]) == ["docker", "exec", "-i", "demo-node0", "hostname"]
    assert lab.exec_argv("node0", ["sh", "-c", "exit 7"], tty=True)[-4:] == ["demo-node0", "sh", "-c", "exit 7"]
    with pytest.raises(LabError, match="no node 'node9' in lab demo") as caught:
        lab.exec_argv("node9", ["hostname"])
    assert caught.value.exit_code == 2 and caught.value.hint == "nodes: node0, node1, node2"
    with pytest.raises(StateError, match=r"node1 of lab demo is not running \(exited\)"):
        lab.exec_argv("node1", ["hostname"])
    with pytest.raises(StateError, match="paused") as caught:
        lab.exec_argv("node2", ["hostname"])
    assert "fault unpause node2" in caught.value.hint
    with pytest.raises(StateError, match="lab 'demo' is not up") as caught:
        lab_with(tmp_path, []).exec_argv("node0", ["hostname"])
    assert caught.value.exit_code == 1
