"""SSH, rsync and the remote command line, without a remote: argv compared whole, the command line
and the scripts run by a real local shell and Python, ssh's own messages read back."""

import subprocess
import sys
from pathlib import Path

import pytest

from labctl.hosts.inventory import Host
from labctl.hosts.ssh import (
    MARKER, classify, explain, key_fingerprint, remote_command, resolve_argv,
    rsync_pull_argv, rsync_push_argv, rsync_stats, scanned_fingerprints, ssh_argv, sync_excludes,
)

HOST = Host(name="node1", address="172.28.0.11", iface="eth0", user="root", identity_file=Path("/lab/ssh/id_ed25519"),
            known_hosts=Path("/lab/ssh/known_hosts"), python="/opt/venv/bin/python", workspace="ddplab-workspace")
STRICT = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
          "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR", "-p", "22",
          "-o", "UserKnownHostsFile=/lab/ssh/known_hosts", "-i", "/lab/ssh/id_ed25519", "-o", "IdentitiesOnly=yes",
          "-l", "root"]


def test_ssh_argv_checks_host_keys_strictly_and_never_prompts():
    assert ssh_argv(HOST, "true") == ["ssh", *STRICT, "-T", "--", "172.28.0.11", "true"]


def test_accept_new_is_the_only_relaxation_and_it_still_refuses_changed_keys():
    argv = ssh_argv(HOST, "true", accept_new=True)
    assert "StrictHostKeyChecking=accept-new" in argv
    assert not any("StrictHostKeyChecking=no" in a for a in argv)


def test_plain_host_uses_sshs_own_defaults_and_quotes_a_known_hosts_path_with_a_space():
    plain = Host(name="h", address="h.example", iface="eth0", port=2222)
    argv = ssh_argv(plain, "true")
    assert "-i" not in argv and "-l" not in argv and not any("UserKnownHostsFile" in a for a in argv)
    spaced = Host(name="h", address="h", iface="eth0", known_hosts=Path("/my docs/known hosts"))
    assert 'UserKnownHostsFile="/my docs/known hosts"' in ssh_argv(spaced, "true")


@pytest.mark.parametrize("address, port, name", [("172.28.0.11", 22, "172.28.0.11"), ("h.example", 2222, "[h.example]:2222"),
                                                 ("fd00::1", 2201, "[fd00::1]:2201")])
def test_known_hosts_names_follow_ssh(address, port, name):
    assert Host(name="h", address=address, iface="eth0", port=port).known_hosts_name == name


def test_python_and_torchrun_resolve_to_the_hosts_own_interpreter():
    assert resolve_argv(HOST, ["python", "-c", "x"]) == ["/opt/venv/bin/python", "-c", "x"]
    assert resolve_argv(HOST, ["torchrun", "-m", "trainer"]) == ["/opt/venv/bin/python", "-m", "torch.distributed.run",
                                                                "-m", "trainer"]
    assert resolve_argv(HOST, ["ss", "-lt"]) == ["ss", "-lt"]


def test_remote_command_quotes_every_word():
    line = remote_command(["~/venv/bin/python", "-c", "print('a b')", "$HOME"], workdir="ddp ws",
                          env_file=".lab/x/node0.env", env={"A": "1 2"})
    assert line == ("cd 'ddp ws' && set -a && . .lab/x/node0.env && set +a && exec env 'A=1 2' "
                    "\"$HOME\"/venv/bin/python -c 'print('\"'\"'a b'\"'\"')' '$HOME'")


def test_remote_command_runs_as_intended_in_a_real_shell(tmp_path):
    """cd, the env file, the launch's environment on top of it, and arguments arriving untouched."""
    workspace = tmp_path / "my workspace"
    (workspace / ".lab").mkdir(parents=True)
    (workspace / ".lab" / "n.env").write_text("# identity\nMASTER_ADDR=10.0.0.1\nPET_RDZV_ID=from-file\n")
    argv = [sys.executable, "-c", "import os, sys; print(os.getcwd(), os.environ['MASTER_ADDR'], "
            "os.environ['PET_RDZV_ID'], os.environ['X'], sys.argv[1:])", "a b", "$HOME", "'q'"]
    line = remote_command(argv, workdir=str(workspace), env_file=".lab/n.env", env={"PET_RDZV_ID": "run-1", "X": "x y"})
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{workspace} 10.0.0.1 run-1 x y ['a b', '$HOME', \"'q'\"]"


def test_rsync_mirrors_into_the_workspace_without_touching_excluded_paths():
    argv = rsync_push_argv(HOST, Path("/home/me/proj"), [".git/", "/venv-a/"])
    assert argv[:4] == ["rsync", "--archive", "--delete", "--stats"]
    assert argv[4:7] == ["--exclude=.git/", "--exclude=/venv-a/", f"--exclude=/{MARKER}"]
    assert argv[7] == "-e" and argv[8].startswith("ssh -o BatchMode=yes -o StrictHostKeyChecking=yes")
    assert argv[9:] == ["--", "/home/me/proj/", "172.28.0.11:ddplab-workspace/"]
    pull = rsync_pull_argv(Host(name="v6", address="fd00::2", iface="eth0", workspace="/srv/w"), ".lab/x/runs/r1",
                           Path("/local/r1"))
    assert pull[-2:] == ["[fd00::2]:/srv/w/.lab/x/runs/r1/", "/local/r1/"]


def test_sync_leaves_out_every_virtual_environment_whatever_its_name(tmp_path):
    for venv in ("env-torch", "tools/py311"):
        (tmp_path / venv).mkdir(parents=True)
        (tmp_path / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "src").mkdir()
    excludes = sync_excludes(tmp_path, ("*.ckpt",))
    assert {".venv/", ".lab/", "__pycache__/", "/env-torch/", "/tools/py311/", "*.ckpt"} <= set(excludes)
    assert "/src/" not in excludes


def test_the_exclusions_work_in_a_real_rsync(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "dst"
    for rel in ("train.py", "pkg/mod.py", "pkg/__pycache__/mod.pyc", ".venv/bin/python", "myenv/pyvenv.cfg",
                ".lab/demo/runs/r1/node0.log", ".git/HEAD", "vendor/lib/.git", "x.egg-info/PKG-INFO"):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("x")
    (dest / ".lab").mkdir(parents=True)
    (dest / ".lab" / "keep.env").write_text("on the host")
    (dest / MARKER).write_text("")
    (dest / "stale.py").write_text("removed at the source")
    argv = rsync_push_argv(HOST, source, sync_excludes(source))
    local = [a for a in argv if a not in ("-e",) and not a.startswith("ssh ")][:-1] + [f"{dest}/"]
    out = subprocess.run(local, capture_output=True, text=True, check=True).stdout
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == [MARKER, ".lab/keep.env", "pkg/mod.py", "train.py"]  # vendor/lib/.git: a submodule's, a file
    assert rsync_stats(out)["files"] == 2


def test_fingerprints_match_ssh_keygen(tmp_path):
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    key_type, blob = key.with_suffix(".pub").read_text().split()[:2]
    expected = subprocess.run(["ssh-keygen", "-lf", str(key.with_suffix(".pub"))], capture_output=True, text=True,
                              check=True).stdout.split()[1]
    assert key_fingerprint(key_type, blob) == expected
    assert scanned_fingerprints(f"# 10.0.0.1:22 SSH-2.0-OpenSSH_9.2\n10.0.0.1 {key_type} {blob}\n") == [
        (key_type, expected)]


# What OpenSSH 9.2 printed here when a node's host key was regenerated (tests/integration checks it live).
CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:acSC5v2sx8//Ye+CCHmMp+tTgGcQ7n812dyJzl3xZ0s.
Please contact your system administrator.
Add correct host key in kh2 to get rid of this message.
Offending ED25519 key in /lab/ssh/known_hosts:2
  remove with:
  ssh-keygen -f "kh2" -R "172.31.250.11"
Host key for 172.31.250.11 has changed and you have requested strict checking.
Host key verification failed.
"""


def test_a_changed_key_is_refused_naming_the_new_fingerprint_and_the_line_on_record():
    failure = classify(CHANGED)
    assert (failure.kind, failure.key_type, failure.fingerprint, failure.where) == (
        "changed", "ED25519", "SHA256:acSC5v2sx8//Ye+CCHmMp+tTgGcQ7n812dyJzl3xZ0s", "/lab/ssh/known_hosts:2")
    error = explain(HOST, "node1", failure, [])
    assert error.kind == "hostkey-changed" and "REFUSED" in error.message and "CHANGED" in error.message
    assert "SHA256:acSC5v2sx8//Ye+CCHmMp+tTgGcQ7n812dyJzl3xZ0s" in error.message
    assert "ssh-keygen -R '172.28.0.11' -f /lab/ssh/known_hosts" in error.hint


@pytest.mark.parametrize("stderr, kind", [
    ("No ED25519 host key is known for 172.28.0.11 and you have requested strict checking.\n"
     "Host key verification failed.\n", "unknown"),
    ("root@172.28.0.11: Permission denied (publickey).\n", "auth"),
    ("ssh: connect to host 172.28.0.11 port 22: Connection refused\n", "unreachable"),
    ("ssh: connect to host 10.9.9.9 port 22: Connection timed out\n", "unreachable"),
    ("ssh: Could not resolve hostname nosuch.example: Name or service not known\n", "unreachable"),
    ("Connection closed by 172.28.0.11 port 22\n", "unreachable"),
    ("Traceback: the remote command itself exited 255\n", None),
])
def test_sshs_failures_are_told_apart(stderr, kind):
    found = classify(stderr)
    assert (found.kind if found else None) == kind


def test_an_unknown_host_is_refused_with_what_it_presents_and_how_to_check_it():
    error = explain(HOST, "node1", classify("Host key verification failed.\n"), [("ssh-ed25519", "SHA256:abc")])
    assert "not in /lab/ssh/known_hosts" in error.message and "presents ssh-ed25519 SHA256:abc" in error.message
    assert "--accept-new" in error.hint


