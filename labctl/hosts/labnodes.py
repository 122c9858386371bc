"""`labctl up --ssh`: the lab's nodes as SSH hosts, described in an inventory as real machines are.

labctl makes one key pair for the lab (.lab/<lab>/ssh/id_ed25519) and hands its public half to every
node; each node starts sshd and makes its own host key (compose/node-entrypoint.sh). The host keys
reach known_hosts through the engine, from the DDPLAB_SSH_HOSTKEY line each node logged as it
started, the way a cloud's console log vouches for a new machine's key. Then .lab/<lab>/hosts.toml
describes the nodes as plain hosts (address, user, key, known_hosts), and `labctl hosts` drives
them by address over SSH alone, with no docker exec.
"""

from __future__ import annotations

from pathlib import Path

from labctl.core.proc import run
from labctl.engine.labels import container_name
from labctl.errors import LabError
from labctl.hosts.inventory import render_inventory
from labctl.hosts.ssh import require_tools
from labctl.run.launch import threads_per_process
from labctl.spec.labspec import LabSpec

HOSTKEY_PREFIX = "DDPLAB_SSH_HOSTKEY"
INVENTORY_FILE = "hosts.toml"
KEY_FILE = "id_ed25519"
KNOWN_HOSTS_FILE = "known_hosts"
NODE_PYTHON = "/opt/venv/bin/python"  # the image's venv (see the Dockerfile)
NODE_WORKSPACE = "ddplab-workspace"  # under the SSH user's home on each node, apart from the bind mount


def ssh_dir(lab_directory: Path) -> Path:
    return lab_directory / "ssh"


def lab_public_key(lab_directory: Path, lab: str, *, make: bool) -> str:
    """The public half of the lab's SSH key pair, which is made once, here, when `make` says so (a
    dry run changes nothing: it shows a placeholder until the key exists)."""
    key = ssh_dir(lab_directory) / KEY_FILE
    if not key.is_file() and not make:
        return f"<the public key `labctl up --ssh` makes at {key}.pub>"
    if not key.is_file():
        require_tools("ssh-keygen")
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ddplab-{lab}", "-f", str(key)])
    return key.with_name(KEY_FILE + ".pub").read_text().strip()


def parse_hostkey_line(line: str) -> tuple[str, str]:
    """'DDPLAB_SSH_HOSTKEY user=root ssh-ed25519 AAAA...' -> ('root', 'ssh-ed25519 AAAA...')."""
    fields = line.split()
    if len(fields) != 4 or fields[0] != HOSTKEY_PREFIX or not fields[1].startswith("user="):
        raise ValueError(f"not a host key line: {line!r}")
    return fields[1].removeprefix("user="), f"{fields[2]} {fields[3]}"


def build_known_hosts(keys: dict[str, str]) -> str:
    """known_hosts lines for {address: 'type base64'}, on port 22 (so the bare address, as ssh writes it)."""
    return "".join(f"{address} {key}\n" for address, key in keys.items())


def build_lab_inventory(config: LabSpec, nodes: list[tuple[str, str]], user: str, threads: int) -> str:
    """hosts.toml for the lab's nodes, [(name, ip)] in rank order, reached as `user`."""
    comment = (f"The nodes of lab {config.lab} as SSH hosts, written by `labctl up --ssh`; rewritten by every\n"
               "`labctl up --ssh`, so copy it before editing. An example inventory for real machines, too.\n"
               f"  labctl hosts check --inventory THIS_FILE\n"
               f"  labctl hosts run --inventory THIS_FILE -- -m trainer --epochs 3\n"
               "Relative paths are relative to this file's folder; a relative workspace is under the SSH user's home.")
    defaults = {
        "user": user,
        "port": 22,
        "identity_file": f"ssh/{KEY_FILE}",
        "known_hosts": f"ssh/{KNOWN_HOSTS_FILE}",
        "iface": config.iface,
        "nproc_per_node": config.nproc_per_node,
        "python": NODE_PYTHON,
        "workspace": NODE_WORKSPACE,
        # As on the lab's own runs: the machine's CPUs shared out between the nodes' processes, and
        # the image's trainer importable as `-m trainer` from any workspace.
        "env": {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": "/opt/ddplab"},
    }
    return render_inventory(name=config.lab, master_port=config.master_port, comment=comment, defaults=defaults,
                            hosts=[{"name": name, "address": ip} for name, ip in nodes])


def node_hostkeys(client, lab: str, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each node's (user, host key) from the line its entry point logged at its latest start."""
    out = {}
    for name in names:
        lines = client.api.logs(container_name(lab, name), tail=50).decode(errors="replace").splitlines()
        announced = [line for line in lines if line.startswith(HOSTKEY_PREFIX)]
        if not announced:
            raise LabError(f"{name} announced no SSH host key", hint=f"`docker logs {container_name(lab, name)}` "
                           "shows its start; `labctl build --force` rebuilds an image without sshd")
        out[name] = parse_hostkey_line(announced[-1])
    return out


def write_ssh_files(client, config: LabSpec, lab_directory: Path, nodes: list, cpus: int) -> Path:
    """known_hosts and hosts.toml for the running nodes (NodeState list); returns the inventory's path."""
    keys = node_hostkeys(client, config.lab, [n.name for n in nodes])
    users = {user for user, _ in keys.values()}
    if len(users) != 1:
        raise LabError(f"the nodes run sshd as different users ({', '.join(sorted(users))})",
                       hint=f"`labctl down --lab {config.lab}` and `labctl up --ssh` again")
    directory = ssh_dir(lab_directory)
    (directory / KNOWN_HOSTS_FILE).write_text(build_known_hosts({n.ip: keys[n.name][1] for n in nodes}))
    threads = threads_per_process(cpus, len(nodes), config.nproc_per_node)
    inventory = lab_directory / INVENTORY_FILE
    inventory.write_text(build_lab_inventory(config, [(n.name, n.ip) for n in nodes], users.pop(), threads))
    return inventory
