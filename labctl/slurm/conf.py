"""slurm.conf for a lab: its nodes, one partition, and the few settings a container needs.

Pure: `build_slurm_conf` returns the text that `labctl up --scheduler slurm` writes to
.lab/<lab>/slurm/slurm.conf (with a munge key made there too, never in an image layer); every node's
entry point links it where Debian's Slurm reads it (compose/node-entrypoint.sh).

The choices, each for a reason:
- SlurmUser=root: slurmctld and slurmd must run as root to start job steps as the job's user.
- ProctrackType=proctrack/linuxproc and TaskPlugin=task/none: nothing that needs cgroups, since
  an unprivileged container cannot write a cgroup tree; and cgroup.conf (build_cgroup_conf) names
  the one plugin slurmd 22.05 can initialise read-only, on cgroup v1 and v2 hosts alike.
- SelectType=select/linear: a job gets whole nodes, as a multi-node training job wants.
- No accounting (AccountingStorageType=accounting_storage/none): jobs are followed with scontrol,
  which keeps a finished job for MinJobAge seconds.
- ReturnToService=2: a node that went DOWN (`labctl fault kill`) comes back when its slurmd registers.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTITION = "lab"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
MIN_JOB_AGE_S = 3600  # how long scontrol still shows a finished job (`labctl slurm status`)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    ip: str


def cluster_name(lab: str) -> str:
    """Slurm's ClusterName: lowercase letters, digits and '_' only, as it keeps state under it."""
    return "ddplab_" + "".join(c if c.isalnum() else "_" for c in lab.lower())


def build_cgroup_conf() -> str:
    """cgroup.conf: the cgroup/v1 plugin, on cgroup v1 and v2 hosts alike.

    slurmd 22.05 always initialises a cgroup plugin (slurmd.c calls cgroup_g_init whatever the
    other plugins are; CgroupPlugin=disabled came in 24.05). Autodetect picks cgroup/v2 on a v2
    host, whose init needs a writable, systemd-delegated tree (container support came in 23.02.1),
    which an unprivileged node has not. The v1 plugin's init opens no file, and with
    proctrack/linuxproc, task/none and no CoreSpec/MemSpecLimit nothing calls into it later: slurmd
    starts with /sys/fs/cgroup read-only (cgroup v1 or v2) or not mounted at all."""
    return ("# cgroup.conf of a ddplab Slurm lab, written by `labctl up --scheduler slurm`: see labctl/slurm/conf.py.\n"
            "CgroupPlugin=cgroup/v1\n")


def build_slurm_conf(lab: str, nodes: list[SlurmNode], cpus: int) -> str:
    """The whole slurm.conf: node0 is the controller, every node a compute node with `cpus` CPUs
    (what slurmd finds in a container: the host's, as Docker's --cpus limits time, not CPUs)."""
    controller = nodes[0]
    lines = [
        f"# slurm.conf of lab {lab}, written by `labctl up --scheduler slurm`; edits are overwritten.",
        f"ClusterName={cluster_name(lab)}",
        f"SlurmctldHost={controller.name}({controller.ip})",
        "SlurmUser=root",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/linear",
        "ReturnToService=2",
        "SlurmdTimeout=10",  # a killed node is DOWN, and its job failed, within seconds
        "InactiveLimit=0",
        "KillWait=5",
        f"MinJobAge={MIN_JOB_AGE_S}",
        "",
    ]
    lines += [f"NodeName={n.name} NodeAddr={n.ip} NodeHostname={n.name} CPUs={cpus} State=UNKNOWN" for n in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
