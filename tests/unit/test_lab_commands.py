"""`labctl ls` from what the engine lists (its label data, as the list calls return it), `down`'s
message about what it kept, and `exec`'s command line: no engine needed."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from labctl.cli import main, render
from labctl.engine.docker import docker_exec_argv
from labctl.lab.listing import LabListing, age_text, build_listings, shaping_text, user_name


def container(lab, node, state="running", created=1000, workspace="/home/ann/ddp", rank=None, **extra):
    labels = {"io.ddplab.lab": lab, "io.ddplab.workspace": workspace, "com.docker.compose.project": lab}
    if node:
        labels |= {"io.ddplab.node": node, "io.ddplab.node-rank": str(rank if rank is not None else node[-1])}
    return {"Id": f"{lab}-{node}", "Names": [f"/{lab}-{node}"], "State": state, "Created": created,
            "Labels": labels | extra}


def test_labs_from_label_data():
    containers = [
        container("b", "node1", created=1200), container("b", "node0", created=1100),
        container("b", "node2", state="exited", created=1300),
        container("b", None, role="shaper"),  # a helper container carries the lab's label, not a node's
        container("a", "node0", workspace="/srv/ws"),
        {"Id": "x", "State": "running", "Created": 1, "Labels": {"com.docker.compose.project": "other"}},
    ]
    networks = [{"Name": "a-net", "Labels": {"io.ddplab.lab": "a"}}, {"Name": "b-net", "Labels": {"io.ddplab.lab": "b"}},
                {"Name": "bridge", "Labels": {}}]
    volumes = [{"Name": "c-shared", "Labels": {"io.ddplab.lab": "c", "io.ddplab.workspace": "/tmp/old"}},
               {"Name": "b-shared", "Labels": {"io.ddplab.lab": "b"}}]
    assert build_listings(containers, networks, volumes) == [
        LabListing("a", 1, 1, 1000, "/srv/ws", networks=["a-net"]),
        LabListing("b", 2, 3, 1100, "/home/ann/ddp", networks=["b-net"], volumes=["b-shared"]),
        LabListing("c", 0, 0, None, "/tmp/old", volumes=["c-shared"]),  # only its volume is left
    ]


def test_workspace_from_composes_label_when_labctls_is_missing():
    node = container("a", "node0")
    del node["Labels"]["io.ddplab.workspace"]
    node["Labels"]["com.docker.compose.project.working_dir"] = "/home/ann/ddp/.lab/a"
    assert build_listings([node], [], [])[0].workspace == "/home/ann/ddp"


def test_no_labs():
    assert build_listings([], [{"Name": "bridge", "Labels": None}], []) == []


@pytest.mark.parametrize("shaping, text", [
    ({}, "-"),
    ({"node0": "unshaped", "node1": "unshaped"}, "unshaped"),
    ({"node0": "100mbit", "node1": "100mbit"}, "100mbit"),
    ({"node0": "1gbit", "node1": "50mbit"}, "node0=1gbit, node1=50mbit"),
])
def test_shaping_text(shaping, text):
    assert shaping_text(shaping) == text


@pytest.mark.parametrize("seconds, text", [(-3, "0 s"), (0, "0 s"), (59.9, "59 s"), (60, "1 min"), (3599, "59 min"),
                                           (3600, "1 h"), (86399, "23 h"), (86400, "1 d"), (10 * 86400, "10 d")])
def test_age_text(seconds, text):
    assert age_text(seconds) == text


def test_user_name():
    me = os.getuid()
    import pwd

    assert user_name(f"{me}:{os.getgid()}") == pwd.getpwuid(me).pw_name
    assert user_name("4000123:4000123") == "uid 4000123"  # nobody here has it
    assert user_name("") is None and user_name(None) is None


def test_ls_table_and_json(capsys):
    labs = [LabListing("a", 2, 3, 1000.0, "/srv/ws", "ann", {"node0": "100mbit", "node1": "100mbit"}, ["a-net"]),
            LabListing("old", 0, 0, None, "/tmp/old", volumes=["old-shared"])]
    render.print_labs(labs, as_json=False, now=1000.0 + 7200)
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if " a " in line)
    for cell in ("2/3", "100mbit", "2 h", "/srv/ws", "ann"):
        assert cell in row
    assert "no nodes, only a volume or network left: old (`labctl down --lab NAME --volumes`" in " ".join(err.split())
    render.print_labs(labs[:1], as_json=True, now=1060.0)
    import json

    assert json.loads(capsys.readouterr().out) == [{
        "lab": "a", "running": 2, "nodes": 3, "shaping": {"node0": "100mbit", "node1": "100mbit"}, "created": 1000.0,
        "age_s": 60, "workspace": "/srv/ws", "user": "ann", "networks": ["a-net"], "volumes": [], "owner": {}}]


def test_ls_with_no_labs_is_one_friendly_line(capsys):
    render.print_labs([], as_json=False, now=0)
    out, err = capsys.readouterr()
    assert out == "" and "no labs on this engine" in err
    render.print_labs([], as_json=True, now=0)
    assert capsys.readouterr().out.strip() == "[]"


def test_down_names_the_volume_it_kept(capsys):
    render.print_down("demo", {"containers": 3, "networks": 1, "volumes": 0},
                      {"containers": [], "networks": [], "volumes": ["demo-shared"]})
    message = " ".join(capsys.readouterr().err.split())
    assert "lab demo: removed 3 containers, 1 network; kept volume demo-shared" in message
    assert "`labctl down --lab demo --volumes` removes it" in message
    render.print_down("demo", {"containers": 0, "networks": 0, "volumes": 1},
                      {"containers": [], "networks": [], "volumes": []})
    message = " ".join(capsys.readouterr().err.split())
    assert message.endswith("lab demo: removed 0 containers, 0 networks, 1 volume")


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
    from labctl.session import LabSession
    from labctl.spec.labspec import load_config

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
