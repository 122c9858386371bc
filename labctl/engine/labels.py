"""How a lab's resources are named and labelled on the engine: `down`, `ls`, `gc` and every exec
find a lab's containers, network and volume by these."""

from __future__ import annotations

# Labels on every container, network and volume of a lab: `down` finds what to remove by these.
LABEL_LAB = "io.ddplab.lab"
LABEL_NODE = "io.ddplab.node"
LABEL_RANK = "io.ddplab.node-rank"
LABEL_WORKSPACE = "io.ddplab.workspace"
LABEL_SSH = "io.ddplab.ssh"  # "true" on the nodes of a lab brought up with --ssh
LABEL_GPUS = "io.ddplab.gpus"  # the machine's GPU indices a node has ("0,1"), on GPU nodes
LABEL_SCHEDULER = "io.ddplab.scheduler"  # "slurm" on the nodes of a lab brought up with --scheduler slurm
LABEL_EXEC_USER = "io.ddplab.exec-user"  # uid:gid that labctl's execs run as, where the node itself runs as root


def network_name(lab: str) -> str:
    return f"{lab}-net"


def volume_name(lab: str) -> str:
    return f"{lab}-shared"


def container_name(lab: str, node: str) -> str:
    return f"{lab}-{node}"
