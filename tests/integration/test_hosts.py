"""`labctl hosts` against SSH-reachable nodes: a lab brought up with --ssh, driven by address over SSH
alone. Every `labctl hosts` call here runs with DOCKER_HOST pointing nowhere, so nothing it does can
go through the engine. The tests look at the hosts with plain `ssh`, written out below, not with
labctl's own SSH code; docker is used only to play the attacker (a changed host key).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NO_RUNS, REPO, drop_lab, interruptible, labctl, new_lab_name, summary_of
from labctl.hosts.inventory import load_inventory

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/labctl-hosts-must-not-use-docker.sock"}
SCRIPTS = "tests/integration/scripts"

# Run on a host: the processes of any labctl run alive there (found as labctl's stop finds them),
# one line each, "pid state command line": a test that finds one left says which it is.
LEFTOVERS = r"""
import os
for p in os.listdir("/proc"):
    try:
        if p.isdigit() and b"DDPLAB_RUN_ID=" in open(f"/proc/{p}/environ", "rb").read():
            state = open(f"/proc/{p}/stat").read().rpartition(")")[2].split()[0]
            print("RUN_PROCESS", p, state, open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ")[:150].decode())
    except OSError:
        pass
"""


def hosts_cmd(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return labctl("hosts", *args, env=NO_DOCKER, timeout=timeout, **kwargs)


def plain_ssh(inventory: Path, host_name: str, command: str) -> subprocess.CompletedProcess:
    host = load_inventory(inventory).host(host_name)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR",
            "-o", f"UserKnownHostsFile={host.known_hosts}", "-i", str(host.identity_file), "-o", "IdentitiesOnly=yes",
            "-p", str(host.port), f"{host.user}@{host.address}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def run_processes(inventory: Path, host_name: str) -> list[str]:
    """The run processes alive on the host ("pid state command line"); [] when none is."""
    result = plain_ssh(inventory, host_name, f"/opt/venv/bin/python -c {shlex.quote(LEFTOVERS)}")
    assert result.returncode == 0, result.stderr
    return [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("RUN_PROCESS ")]


def ssh_lab_up(nodes: int = 2) -> tuple[str, Path, dict]:
    name = new_lab_name()
    # --warm off: `labctl hosts run` starts torchrun over SSH as on real machines, never the fork servers
    result = labctl("up", "--lab", name, "--nodes", str(nodes), "--ssh", "--json", *NO_RUNS, check=True)
    return name, REPO / ".lab" / name / "hosts.toml", json.loads(result.stdout)


@pytest.fixture(scope="module")
def ssh_lab(docker_client, node_image):
    name, inventory, status = ssh_lab_up()
    yield name, inventory, status
    drop_lab(name)


@pytest.fixture
def own_ssh_lab(docker_client, node_image):
    """A lab of its own, for a test that changes a node."""
    name, inventory, status = ssh_lab_up()
    yield name, inventory, status
    drop_lab(name)


def wait_for_lines(proc: subprocess.Popen, pattern: str, count: int, timeout_s: float) -> list[str]:
    seen, found = [], []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            found.append(line)
    assert len(found) == count, f"wanted {count} lines matching {pattern!r}, saw:\n{''.join(seen)}"
    return found


def test_up_ssh_describes_the_nodes_as_hosts_with_their_keys(ssh_lab):
    name, inventory, status = ssh_lab
    inv = load_inventory(inventory)
    assert inv.name == name and inv.names == ["node0", "node1"]
    assert [h.address for h in inv.hosts] == [n["ip"] for n in status["nodes"]]
    assert {h.user for h in inv.hosts} == {"root" if os.getuid() == 0 else "ddplab"}
    known = inventory.parent / "ssh" / "known_hosts"
    assert [line.split()[0] for line in known.read_text().splitlines()] == [h.address for h in inv.hosts]
    assert oct((inventory.parent / "ssh" / "id_ed25519").stat().st_mode & 0o777) == "0o600"


def test_hosts_check_runs_doctors_checks_over_ssh(ssh_lab):
    name, inventory, _ = ssh_lab
    started = time.monotonic()
    result = hosts_cmd("check", "--inventory", str(inventory), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and time.monotonic() - started < 30
    checks = {(f["check"], f["node"]) for f in report["findings"] if f["ok"]}
    assert {("ssh", "all"), ("env", "all"), ("versions", "all"), ("iface", "all"), ("rendezvous", "all"),
            ("ports", "all")} <= checks
    assert {n: i["torch"] for n, i in report["nodes"].items()} == {"node0": "2.13.0+cpu", "node1": "2.13.0+cpu"}
    table = hosts_cmd("check", "--inventory", str(inventory))
    assert table.returncode == 0 and "socket iface" in table.stdout and "no problems found" in table.stdout


def test_hosts_run_runs_a_plain_ddp_script_on_two_ssh_hosts(ssh_lab):
    """The issue's bar: a DDP script written only against torchrun's environment, to completion."""
    name, inventory, _ = ssh_lab
    result = hosts_cmd("run", "--inventory", str(inventory), "--", f"{SCRIPTS}/plain_ddp.py")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "PLAIN_DDP" in line]
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert "world=2" in line and "rank_sum=1" in line and "replicas_equal=True" in line
    assert any(line.split("|")[0].strip() == "node0" for line in lines)
    assert any(line.split("|")[0].strip() == "node1" for line in lines)
    assert "Traceback" not in result.stdout + result.stderr
    runs = REPO / ".lab" / name / "runs"
    latest = (runs / "latest").resolve()
    assert "PLAIN_DDP" in (latest / "node0.log").read_text() and "PLAIN_DDP" in (latest / "node1.log").read_text()
    # It ran from the copy sync put in each host's own workspace, without the local .venv and .lab.
    for host in ("node0", "node1"):
        ws = "ddplab-workspace"
        probe = plain_ssh(inventory, host, f"test -f {ws}/{SCRIPTS}/plain_ddp.py && test ! -e {ws}/.venv && "
                          f"test ! -e {ws}/.lab/wheelhouse && test ! -e {ws}/.git && test -f {ws}/.lab/{name}/{host}.env")
        assert probe.returncode == 0, (host, probe.stdout, probe.stderr)
        assert run_processes(inventory, host) == []


def test_hosts_run_trains_the_trainer_and_brings_its_metrics_home(ssh_lab):
    name, inventory, _ = ssh_lab
    result = hosts_cmd("run", "--inventory", str(inventory), "--", "-m", "trainer", "--epochs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = summary_of(result.stdout)
    assert summary["world_size"] == 2 and summary["replicas_consistent"] is True
    run_dir = (REPO / ".lab" / name / "runs" / "latest").resolve()
    assert sorted(p.name for p in run_dir.glob("metrics-rank*.jsonl")) == ["metrics-rank0.jsonl", "metrics-rank1.jsonl"]


def test_a_host_seen_for_the_first_time_needs_accept_new(ssh_lab, tmp_path):
    name, inventory, _ = ssh_lab
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    text = inventory.read_text().replace('known_hosts = "ssh/known_hosts"', f'known_hosts = "{empty}"')
    copy = inventory.parent / "hosts-unknown.toml"
    copy.write_text(text)
    try:
        refused = hosts_cmd("run", "--inventory", str(copy), "--", f"{SCRIPTS}/plain_ddp.py")
        assert refused.returncode == 1, refused.stdout + refused.stderr  # the host's state, not the command
        assert "labctl does not trust a key it has never seen" in refused.stdout + refused.stderr
        real = plain_ssh(inventory, "node1", "ssh-keygen -lf ~/.ddplab-sshd/ssh_host_ed25519_key.pub").stdout.split()[1]
        assert f"presents ssh-ed25519 {real}" in refused.stdout + refused.stderr
        assert empty.read_text() == ""
        accepted = hosts_cmd("check", "--inventory", str(copy), "--accept-new")
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert f"node1: recorded its host key ED25519 {real}" in accepted.stderr
        assert len(empty.read_text().splitlines()) == 2
        again = hosts_cmd("check", "--inventory", str(copy))
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        copy.unlink()


def test_a_changed_host_key_is_refused_with_its_fingerprint(own_ssh_lab, docker_client):
    name, inventory, _ = own_ssh_lab
    # Play the attacker (or a reinstall): node1 gets a new host key and sshd takes it up.
    rekey = ("d=$(getent passwd $(id -u) | cut -d: -f6)/.ddplab-sshd; [ -d \"$d\" ] || d=/tmp/ddplab-home/.ddplab-sshd; "
             "rm -f $d/ssh_host_ed25519_key*; ssh-keygen -q -t ed25519 -N '' -f $d/ssh_host_ed25519_key && "
             "kill -HUP $(cat $d/sshd.pid) && ssh-keygen -lf $d/ssh_host_ed25519_key.pub")
    node = docker_client.containers.get(f"{name}-node1")
    code, out = node.exec_run(["sh", "-c", rekey], environment={
        "LD_PRELOAD": "libnss_wrapper.so", "NSS_WRAPPER_PASSWD": "/tmp/ddplab-passwd",
        "NSS_WRAPPER_GROUP": "/tmp/ddplab-group"} if os.getuid() != 0 else {})
    assert code == 0, out
    new_fingerprint = out.decode().split()[1]
    time.sleep(0.5)
    known_before = (inventory.parent / "ssh" / "known_hosts").read_text()
    for accept_new in ([], ["--accept-new"]):
        refused = hosts_cmd("run", "--inventory", str(inventory), *accept_new, "--", f"{SCRIPTS}/plain_ddp.py")
        output = refused.stdout + refused.stderr
        assert refused.returncode == 1, output
        assert "REFUSED, its host key has CHANGED" in output and new_fingerprint in output, output
        assert "preflight found 1 problem; the run was not started" in output and "PLAIN_DDP" not in output
    assert (inventory.parent / "ssh" / "known_hosts").read_text() == known_before
    checked = hosts_cmd("check", "--inventory", str(inventory))
    assert checked.returncode == 1 and f"node1: node1 ({load_inventory(inventory).host('node1').destination}): " \
        f"REFUSED" in checked.stdout.replace("\n", " ")
    assert not (REPO / ".lab" / name / "runs").exists() or not any((REPO / ".lab" / name / "runs").glob("*/node*.log"))


def test_ctrl_c_leaves_no_process_on_any_host(ssh_lab):
    name, inventory, _ = ssh_lab
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "hosts", "run", "--inventory", str(inventory), "--",
                             f"{SCRIPTS}/sleeper.py"], cwd=REPO, preexec_fn=interruptible, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **NO_DOCKER, "COLUMNS": "200"})
    try:
        wait_for_lines(proc, r"SLEEPER_READY rank=\d", 2, timeout_s=120)
        assert run_processes(inventory, "node1")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, proc.stdout.read()
    assert time.monotonic() - started < 30
    for host in ("node0", "node1"):
        assert run_processes(inventory, host) == [], host
    listening = plain_ssh(inventory, "node0", "ss -Hltn 'sport = :29500'")
    assert listening.returncode == 0 and listening.stdout.strip() == ""


def test_a_killed_labctl_leaves_no_process_either(ssh_lab):
    """kill -9 gives labctl no chance to stop anything: each host's watchdog sees its SSH session end."""
    name, inventory, _ = ssh_lab
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "hosts", "run", "--inventory", str(inventory),
                             "--no-sync", "--", f"{SCRIPTS}/sleeper.py"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **NO_DOCKER, "COLUMNS": "200"})
    try:
        wait_for_lines(proc, r"SLEEPER_READY rank=\d", 2, timeout_s=120)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 20
    left = {"node0": ["?"], "node1": ["?"]}
    while any(left.values()) and time.monotonic() < deadline:
        left = {host: run_processes(inventory, host) for host in left}
        time.sleep(0.5)
    assert left == {"node0": [], "node1": []}


def test_a_failing_host_stops_the_others_and_is_named(ssh_lab):
    name, inventory, _ = ssh_lab
    # The static launcher puts rank 1 on node1 (c10d ranks follow arrival order instead). Synced: a
    # script in the workspace runs from each host's copy of it.
    result = hosts_cmd("run", "--inventory", str(inventory), "--launcher", "static", "--json", "--",
                       f"{SCRIPTS}/fail_on_rank.py", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "run failed: rank 1 on node1 failed first" in result.stderr and "deliberate failure on rank 1" in result.stderr
    root = json.loads(result.stdout)["root_cause"]  # --json: the one document on stdout, as for `labctl run`
    assert (root["node"], root["rank"], root["error"]) == ("node1", 1, "ValueError: deliberate failure on rank 1")
    for host in ("node0", "node1"):
        assert run_processes(inventory, host) == [], host


def test_hosts_sync_gives_every_host_the_same_packages_and_check_compares_them(own_ssh_lab):
    """The lab's plain nodes as real hosts: the hosts' lock is resolved for their Python, the wheels
    go over with rsync (the nodes reach no index) and every host's job imports the lock's tqdm."""
    name, inventory, _ = own_ssh_lab
    synced = hosts_cmd("sync", "--inventory", str(inventory), "--with", "tqdm==4.67.1", timeout=600)
    assert synced.returncode == 0, synced.stderr
    assert re.search(r"packages [0-9a-f]{12}: node0 got \d+, node1 got \d+", synced.stderr), synced.stderr
    ran = hosts_cmd("run", "--inventory", str(inventory), "--", "examples/packages/tqdm_ddp.py", "--steps", "3")
    assert ran.returncode == 0, ran.stderr
    assert summary_of(ran.stdout)["tqdm"] == ["4.67.1", "4.67.1"]
    checked = json.loads(hosts_cmd("check", "--inventory", str(inventory), "--json").stdout)
    [packages] = [f for f in checked["findings"] if f["check"] == "packages"]
    assert packages["ok"] and f".lab/{name}/hosts-pylock.toml" in packages["message"], packages
    again = hosts_cmd("sync", "--inventory", str(inventory), check=True)  # the lock kept: nothing to install
    assert "node0 has them, node1 has them" in again.stderr, again.stderr
    # node1's copy of tqdm goes (as if its install had been cut short): check names the host and the package
    gone = plain_ssh(inventory, "node1", "rm -r ddplab-workspace/.lab/*/packages-*/tqdm*")
    assert gone.returncode == 0, gone.stderr
    checked = json.loads(hosts_cmd("check", "--inventory", str(inventory), "--json").stdout)
    problems = [(f["node"], f["message"]) for f in checked["findings"] if f["check"] == "packages" and not f["ok"]]
    assert problems and problems[0][0] == "node1" and "tqdm" in problems[0][1], checked["findings"]
    assert checked["ok"] is False


def test_sync_never_mirrors_into_a_folder_it_did_not_make(ssh_lab):
    name, inventory, _ = ssh_lab
    assert plain_ssh(inventory, "node1", "mkdir -p theirs && echo precious > theirs/notes.txt").returncode == 0
    copy = inventory.parent / "hosts-theirs.toml"
    copy.write_text(inventory.read_text().replace('workspace = "ddplab-workspace"', 'workspace = "theirs"'))
    try:
        result = hosts_cmd("sync", "--inventory", str(copy))
    finally:
        copy.unlink()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "theirs on " in result.stderr and "is not empty and was not made by labctl" in result.stderr
    assert plain_ssh(inventory, "node1", "ls theirs").stdout.split() == ["notes.txt"]
