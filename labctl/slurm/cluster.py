"""A lab's Slurm cluster (side effects): the files the nodes start it from, waiting until every
node is IDLE in the controller's view, and reading that view (doctor's Slurm checks,
labctl.diagnose.slurm, read it through here).

`labctl up --scheduler slurm` writes .lab/<lab>/slurm/slurm.conf (labctl.slurm.conf) and, once per
lab, a munge key beside it: 1024 random bytes readable only by the caller, never in an image layer
(each node's entry point copies it to where munged reads it). The nodes' entry point then starts
munged, slurmctld on node0 and slurmd (compose/slurm-node.sh).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from labctl.engine.detect import Engine
from labctl.engine.docker import exec_in, lab_containers
from labctl.engine.labels import LABEL_SCHEDULER, container_name
from labctl.errors import StateError
from labctl.slurm.conf import build_cgroup_conf

CONTROLLER = "node0"
NODE_SCRIPT = "/opt/ddplab/slurm-node.sh"  # compose/slurm-node.sh in the image
MUNGE_KEY_BYTES = 1024
READY_TIMEOUT_S = 60.0


def slurm_dir(lab_directory: Path) -> Path:
    return lab_directory / "slurm"


def refusal(engine: Engine) -> StateError | None:
    """Why this engine cannot host the lab's Slurm daemons, or None. A cgroup v2 host is not one of
    them: see labctl.slurm.conf.build_cgroup_conf."""
    if engine.kind == "podman":
        return StateError("--scheduler slurm runs slurmd and munged as root inside the nodes, which is tried "
                          "on Docker only", hint="use Docker Engine, or leave --scheduler out")
    return None


def write_files(lab_directory: Path, conf: str) -> Path:
    """slurm.conf and cgroup.conf (rewritten every `up`), and the munge key (made once: a running
    cluster keeps it)."""
    directory = slurm_dir(lab_directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "slurm.conf").write_text(conf)
    (directory / "cgroup.conf").write_text(build_cgroup_conf())
    key = directory / "munge.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(MUNGE_KEY_BYTES))
    return directory


def restart(client, lab: str, names: list[str]) -> None:
    """On a running lab: start any daemon that has stopped (the node script starts only those), then
    have them all reread slurm.conf (`up` rewrote it; a node it recreated read it anew)."""
    for name in names:
        code, output = exec_in(client, container_name(lab, name), [NODE_SCRIPT])
        if code != 0:
            raise StateError(f"Slurm on {name} of lab {lab} did not start again: {output.strip()[-300:]}",
                             hint=f"`labctl down --lab {lab}` then `labctl up --lab {lab} --scheduler slurm`")
    exec_in(client, container_name(lab, CONTROLLER), ["scontrol", "reconfigure"])


def is_slurm_lab(client, lab: str) -> bool:
    return any((c.get("Labels") or {}).get(LABEL_SCHEDULER) == "slurm" for c in lab_containers(client, lab))


def node_states(client, lab: str) -> dict[str, str]:
    """{node: Slurm state in lowercase (idle, alloc, down*, ...)} as the controller reports it."""
    code, output = exec_in(client, container_name(lab, CONTROLLER), ["sinfo", "--noheader", "--Node", "--format=%N %T"])
    if code != 0:
        return {}
    return dict(line.split(None, 1) for line in output.splitlines() if len(line.split()) == 2)


def wait_cluster_ready(client, lab: str, names: list[str], timeout_s: float = READY_TIMEOUT_S) -> dict[str, str]:
    """Until every node of `names` is idle in sinfo; a StateError naming those that are not."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(client, lab)
        if all(states.get(name) == "idle" for name in names):
            return states
        time.sleep(0.5)
    waiting = ", ".join(f"{name} ({states.get(name, 'not registered')})" for name in names if states.get(name) != "idle")
    raise StateError(f"the Slurm cluster of lab {lab} did not come up within {timeout_s:.0f} s: {waiting}",
                     hint=f"`labctl exec --lab {lab} node0 -- sinfo` shows the cluster; the daemons log to "
                          "/var/log/slurm/ in each node")
