"""Render the lab's Compose project from the template in compose/lab.yaml. Pure: returns data and text
(the template's text is read by load_template, from the checkout or the installed package)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from labctl.core import assets
from labctl.engine.labels import (
    LABEL_EXEC_USER,
    LABEL_GPUS,
    LABEL_LAB,
    LABEL_NODE,
    LABEL_RANK,
    LABEL_SCHEDULER,
    LABEL_SSH,
    LABEL_WORKSPACE,
    container_name,
    network_name,
    volume_name,
)
from labctl.lab import tcp
from labctl.lab.gpus import GpuPlan
from labctl.spec.addresses import node_ip, node_mac
from labctl.spec.labspec import LabSpec

SSH_KEY_VAR = "DDPLAB_SSH_AUTHORIZED_KEY"  # the lab's public key; the node's entry point starts sshd for it


@dataclass(frozen=True, kw_only=True)
class ComposePlan:
    """Everything the rendered project depends on besides the config."""

    subnet: str
    workspace: Path
    user: str  # "uid:gid" of the invoking user, so files the nodes write in the workspace are theirs
    node_cpus: Mapping[str, float] = field(default_factory=dict)  # per-node CPU limits (stragglers)
    ssh_public_key: str | None = None  # `up --ssh`: every node an SSH host that accepts this key
    limits: bool = True  # False on an engine that ignores them: the file then claims none
    owner: Mapping[str, str] = field(default_factory=dict)  # labctl.lab.owner's labels, on everything
    gpus: GpuPlan | None = None  # each node's GPUs and image (labctl.lab.gpus); None: every node the CPU image
    slurm_dir: Path | None = None  # `--scheduler slurm`: the lab's slurm.conf and munge key, in the workspace
    tcp_cc: str | None = None  # every node's TCP congestion control (labctl.lab.tcp); None: the host's
    compile_caches: Mapping[str, str] = field(default_factory=dict)  # node -> its compile cache (compile_cache_dir)


COMPILE_CACHE_ROOT = "/shared/compile"  # on the lab's shared volume: removed with it (down/gc --volumes)


def compile_cache_dir(image_id: str) -> str:
    """Where the nodes of one image keep torch.compile's caches (inductor's, and Triton's on GPU
    nodes): on the lab's shared volume, as clusters share theirs on a network file system, so N
    ranks compile a graph once. Keyed by the image: one image is one torch release and one
    compiler, and a lab's nodes share one engine's CPU, so only identical nodes share entries;
    a rebuilt image starts a cache of its own."""
    return f"{COMPILE_CACHE_ROOT}/{image_id.removeprefix('sha256:')[:12]}"


def load_template(path: Path | None = None) -> dict[str, Any]:
    with open(assets.compose_template() if path is None else path) as f:
        return _yaml().safe_load(f)


def build_compose(config: LabSpec, plan: ComposePlan, template: dict[str, Any]) -> dict[str, Any]:
    """The Compose document for `config`: one service per node, static IPs, labels everywhere."""
    lab_labels = {LABEL_LAB: config.lab, LABEL_WORKSPACE: str(plan.workspace), **plan.owner}
    services = {name: node_service(config, plan, template, rank, lab_labels)
                for rank, name in enumerate(config.node_names)}
    network = copy.deepcopy(template["networks"]["lab"])
    network["name"] = network_name(config.lab)
    network["ipam"]["config"][0]["subnet"] = plan.subnet
    network["labels"] = dict(lab_labels)
    volume = copy.deepcopy(template["volumes"]["shared"]) or {}
    volume["name"] = volume_name(config.lab)
    volume["labels"] = dict(lab_labels)
    return {
        "name": config.lab,
        "services": services,
        "networks": {"lab": network},
        "volumes": {"shared": volume},
    }


def node_service(config: LabSpec, plan: ComposePlan, template: dict[str, Any], rank: int,
                 lab_labels: dict[str, str]) -> dict[str, Any]:
    """The service of node `rank`: the template's `x-node`, filled in for it."""
    name = config.node_names[rank]
    node = copy.deepcopy(template["x-node"])
    gpus = plan.gpus.node(name) if plan.gpus else None
    node["image"] = gpus.image if gpus else config.image_tag
    node["container_name"] = container_name(config.lab, name)
    node["hostname"] = name
    node["user"] = plan.user
    node["env_file"] = [f"{name}.env"]
    node["labels"] = {**lab_labels, LABEL_NODE: name, LABEL_RANK: str(rank)}
    if plan.compile_caches.get(name):
        cache = plan.compile_caches[name]
        node["environment"] = {**node["environment"], "TORCHINDUCTOR_CACHE_DIR": cache,
                               "TRITON_CACHE_DIR": f"{cache}/triton"}
    if plan.ssh_public_key:
        node["labels"][LABEL_SSH] = "true"
        node["environment"] = {**node["environment"], SSH_KEY_VAR: plan.ssh_public_key}
    # The workspace appears at the same absolute path on every node and on the host, so
    # paths in commands, logs and run folders mean the same thing everywhere.
    node["volumes"] = [
        {"type": "bind", "source": str(plan.workspace), "target": str(plan.workspace)},
        *node["volumes"],
    ]
    node["working_dir"] = str(plan.workspace)
    if plan.slurm_dir:
        node.update(slurm_settings(node, plan))
    if gpus and gpus.gpus:
        node["labels"][LABEL_GPUS] = ",".join(map(str, gpus.gpus))
        node.update(gpu_settings(template["x-gpu"], gpus.gpus))
    if plan.tcp_cc:
        node["sysctls"] = {tcp.SYSCTL: plan.tcp_cc}
    node["networks"] = {"lab": {"ipv4_address": node_ip(plan.subnet, rank)}}
    node["mac_address"] = node_mac(node_ip(plan.subnet, rank))  # service-level: engines before API 1.44 take it
    if plan.limits:
        node.update(limit_settings(config, plan, name))
    return node


def limit_settings(config: LabSpec, plan: ComposePlan, name: str) -> dict[str, Any]:
    """The node's process, CPU and memory limits (on an engine that enforces them)."""
    limits: dict[str, Any] = {"pids_limit": config.pids_limit}
    cpus = plan.node_cpus.get(name, config.cpus)
    if cpus is not None:
        limits["cpus"] = cpus
    if config.memory is not None:
        limits["mem_limit"] = config.memory
    return limits


def slurm_settings(node: dict[str, Any], plan: ComposePlan) -> dict[str, Any]:
    """A Slurm node: root in the container, since slurmd and munged must be (they start job steps as
    the job's user); labctl's own execs still run as the invoking user (the exec-user label). The
    entry point starts the daemons from the lab's Slurm folder, which the workspace mount carries."""
    return {
        "user": "0:0",
        "labels": {**node["labels"], LABEL_SCHEDULER: "slurm", LABEL_EXEC_USER: plan.user},
        "environment": {**node["environment"], "DDPLAB_SLURM_DIR": str(plan.slurm_dir),
                        "DDPLAB_SLURM_CONTROLLER": "node0", "DDPLAB_RUN_AS": plan.user},
    }


def gpu_settings(gpu_template: dict[str, Any], indices: tuple[int, ...]) -> dict[str, Any]:
    """The template's `x-gpu` for a node with these GPUs (the machine's indices, as strings)."""
    settings = copy.deepcopy(gpu_template)
    settings["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] = [str(i) for i in indices]
    return settings


def render_compose(document: dict[str, Any]) -> str:
    header = (
        "# Generated by labctl from compose/lab.yaml; regenerated by every `labctl up`, so do not edit.\n"
        "# Bring the nodes up without labctl: docker compose -f THIS_FILE up -d\n"
    )
    return header + _yaml().safe_dump(document, sort_keys=False, default_flow_style=False, width=120)


def _yaml():
    """PyYAML, imported when a Compose file is read or written, not whenever labctl.lab is."""
    import yaml

    return yaml
