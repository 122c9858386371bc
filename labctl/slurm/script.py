"""The batch script of a training job under Slurm: what `labctl slurm export` writes for a real
cluster, and what `labctl slurm submit` (sbatch) and `labctl slurm run` (salloc) run in the lab,
byte for byte, so what was tested is what is taken away.

Everything cluster-specific comes from Slurm's variables at run time: the nodes from
SLURM_JOB_NODELIST, their count from SLURM_JOB_NUM_NODES, the rendezvous id from SLURM_JOB_ID, and
which node hosts the c10d store from SLURM_NODEID. One `srun` task per node starts torchrun, which
starts the node's processes (as torchrun's own docs run it under Slurm).

Pure: `build_job_script` returns the text; nothing here touches a node.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from labctl.errors import ConfigError
from labctl.run.launch import ELASTIC_RDZV_CONF

DEFAULT_TIME = "00:30:00"
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class JobSpec:
    """What the job runs and asks for; `args` is what follows torchrun's options (SCRIPT ARGS...,
    or -m MODULE ARGS...)."""

    args: tuple[str, ...]
    nodes: int = 2
    nproc_per_node: int = 1
    time: str = DEFAULT_TIME
    job_name: str = "ddplab"
    partition: str | None = None
    account: str | None = None
    iface: str = "eth0"
    port: int = DEFAULT_PORT
    min_nodes: int | None = None  # elastic: the job goes on with this many nodes (torchrun --nnodes MIN:MAX)
    max_restarts: int = 0  # torchrun restarts every worker up to this many times after a failure
    packages: str | None = None  # the lab's lock in pip's hash-checking form: its file name, beside the script

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None or self.max_restarts > 0


def check_time(text: str) -> str:
    """Slurm's --time forms this accepts: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    if not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", str(text).strip()):
        raise ConfigError("--time", text, "must be a Slurm time limit such as 30, 00:30:00 or 1-00:00:00",
                          hint="minutes, or [D-]HH:MM:SS as sbatch takes it")
    return str(text).strip()


def _sbatch(option: str, value: object | None, comment: str = "") -> str:
    line = f"#SBATCH --{option}={value}" if value is not None else f"##SBATCH --{option}=CHANGE-ME"
    return f"{line:<40} # {comment}" if comment else line


LOCK_DIR_VAR = "DDPLAB_LOCK_DIR"  # where the job finds the lock's files; default: the folder sbatch ran in


def packages_block(requirements: str | None) -> list[str]:
    """The lines that give the job's environment the lab's packages, from the lock's file `requirements`."""
    if not requirements:
        return []
    return ["# --- your project's packages: the lab's lock, beside this script as a pylock.toml and, in pip's",
            f"# hash-checking form, as {requirements}. Into the environment above: what it has at the lock's",
            "# versions stays as it is, the rest comes from your index, every wheel checked against the lock's",
            "# sha256. torch stays your cluster's own (the lock's torch line is left out).",
            f"python -m pip install --quiet --no-deps --require-hashes -r \"${{{LOCK_DIR_VAR}:-$SLURM_SUBMIT_DIR}}/{requirements}\"",
            ""]


def build_job_script(spec: JobSpec) -> str:
    """The whole script: the #SBATCH header, the environment and the packages, the rendezvous from
    Slurm's variables, and the srun step that starts torchrun on every node."""
    if not spec.args:
        raise ConfigError("SCRIPT", "", "is missing: give the training script and its arguments after --",
                          hint="labctl slurm export -- -m trainer --workload gpt --steps 50")
    return "\n".join([*header_lines(spec), *environment_lines(spec), *rendezvous_lines(spec), *srun_lines(spec), ""])


def header_lines(spec: JobSpec) -> list[str]:
    """What to change on a cluster, and the #SBATCH lines."""
    return [
        "#!/bin/bash",
        "# Multi-node PyTorch training under Slurm, written by `labctl slurm export` (ddplab).",
        "# The lab ran this same script (`labctl slurm submit` with sbatch, `labctl slurm run` with salloc).",
        "#",
        "# On your cluster, change:",
        "#   - the #SBATCH lines: nodes and time, and the partition and account your site gives you",
        "#     (uncomment them: a line starting ##SBATCH is a comment to sbatch);",
        "#   - the environment block below: your module loads or virtual environment;",
        "#   - NET_IFNAME: the interface that joins the nodes (`ip -br addr` on a node: eth0, ib0, bond0...);",
        "#   - NPROC_PER_NODE: the processes per node, one per GPU on GPU nodes.",
        _sbatch("job-name", spec.job_name),
        _sbatch("nodes", spec.nodes),
        _sbatch("ntasks-per-node", 1, "one torchrun per node; it starts the processes"),
        _sbatch("time", spec.time),
        _sbatch("output", "%x-%j.out"),
        _sbatch("partition", spec.partition),
        _sbatch("account", spec.account),
        *(["#SBATCH --no-kill                        # elastic: a failed node does not end the job"] if spec.elastic else []),
        "set -euo pipefail",
        "",
    ]


def environment_lines(spec: JobSpec) -> list[str]:
    """The user's environment block, the lab's packages, the processes and the interface."""
    return [
        "# --- environment: what your cluster needs before python runs (examples) ---",
        "# module load python/3.11 cuda/12.4",
        "# source \"$HOME/venvs/train/bin/activate\"",
        "",
        *packages_block(spec.packages),
        f"export NPROC_PER_NODE=${{NPROC_PER_NODE:-{spec.nproc_per_node}}}",
        f"NET_IFNAME=${{NET_IFNAME:-{spec.iface}}}",
        "export GLOO_SOCKET_IFNAME=\"$NET_IFNAME\" NCCL_SOCKET_IFNAME=\"$NET_IFNAME\"",
        "",
    ]


def rendezvous_lines(spec: JobSpec) -> list[str]:
    """No PET_* from the submitting shell, and the store on the allocation's first node."""
    return [
        "# torchrun takes PET_* variables as defaults for its flags: none may leak in from the",
        "# environment that submitted the job, so that this script alone decides.",
        "for var in $(compgen -v PET_ || true); do unset \"$var\"; done",
        "",
        "# The c10d rendezvous store runs on the first node of the allocation, in torchrun's agent there.",
        "# (sed, not head: head exits early, and under pipefail scontrol's SIGPIPE would end the script)",
        "HEAD_NODE=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed -n 1p)",
        f"export RDZV_ENDPOINT=\"$HEAD_NODE:${{RDZV_PORT:-{spec.port}}}\"",
        "echo \"job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST) x $NPROC_PER_NODE processes, rendezvous $RDZV_ENDPOINT\"",
        "",
    ]


def srun_lines(spec: JobSpec) -> list[str]:
    """One srun task per node running torchrun: killed with the first failure, or elastic."""
    if spec.elastic:  # a lost node must not end the job: the survivors' torchrun agents go on without it
        nnodes = f"{spec.min_nodes or spec.nodes}:$SLURM_JOB_NUM_NODES"
        srun = ["# torchrun shares one worker store across restarts by default: restarted gloo workers then read",
                "# their predecessors' addresses and fail (Gloo connectFullMesh ... Connection refused). Unshared,",
                "# each attempt's rank 0 hosts a fresh store.",
                "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                "",
                "# Elastic: --no-kill keeps the job (and this step) when a node fails; torchrun's agents on the",
                "# survivors form a new rendezvous round of at least the minimum and resume from the checkpoint.",
                "# shellcheck disable=SC2016",
                "srun --no-kill --label bash -c '"]
        conf = f",{ELASTIC_RDZV_CONF}"  # as `labctl run` has it, for the same reasons
        restarts = [f"    --max-restarts={spec.max_restarts} \\"]
    else:
        nnodes = "$SLURM_JOB_NUM_NODES"
        srun = ["# One task per node; --kill-on-bad-exit ends every node's task when one fails, and srun then",
                "# names the node. The single quotes matter: each node expands SLURM_NODEID for itself.",
                "# shellcheck disable=SC2016",
                "srun --kill-on-bad-exit=1 --label bash -c '"]
        conf, restarts = "", []
    return [
        *srun,
        "  exec torchrun \\",
        f"    --nnodes=\"{nnodes}\" \\",
        "    --nproc-per-node=\"$NPROC_PER_NODE\" \\",
        "    --rdzv-backend=c10d \\",
        "    --rdzv-endpoint=\"$RDZV_ENDPOINT\" \\",
        "    --rdzv-id=\"$SLURM_JOB_ID\" \\",
        f"    --rdzv-conf=\"is_host=$([ \"$SLURM_NODEID\" = 0 ] && echo true || echo false){conf}\" \\",
        *restarts,
        f"    \"$@\"' torchrun-on-node {shlex.join(spec.args)}",
    ]
