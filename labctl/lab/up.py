"""`up` as a plan and its application: what the lab will be (the Compose document, the env files,
the subnet, the engine it runs on), then bringing it there, reconciling a running lab, and retrying
when a concurrent `up` took the same free subnet between our pick and Compose making the network.

Shaping at bring-up and the SSH inventory are the API's (labctl.api.Lab.up), which composes this
with labctl.net and labctl.hosts.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from labctl.config import AUTO, LabConfig, parse_node_cpus
from labctl.errors import CommandError, LabError
from labctl.lab import engine as engine_mod
from labctl.lab import gpus as gpus_mod
from labctl.lab import tcp
from labctl.lab.compose import LABEL_GPUS, LABEL_NODE, LABEL_RANK, LABEL_SCHEDULER, LABEL_SSH
from labctl.lab.docker import lab_containers
from labctl.lab.engine import Engine
from labctl.lab.lifecycle import NodeState, apply_up, lab_dir, plan_up
from labctl.lab.owner import Owner, owner_labels

SUBNET_ATTEMPTS = 4  # `up` picks again when a concurrent `up` took the same free subnet
Report = Callable[[str], None]


@dataclass(frozen=True)
class UpPlan:
    """Everything `up` will create or change, as data; `--dry-run` prints the document and env files."""

    config: LabConfig  # as resolved, with a running lab's own node count when none was asked for
    engine: Engine
    existing: bool  # a running lab is reconciled, not created
    document: dict  # the Compose document
    env_files: dict[str, str]  # file name -> text
    subnet: str
    node_cpus: dict[str, float] | None
    ssh: bool
    public_key: str | None
    gpus: gpus_mod.GpuPlan  # each node's GPUs and image
    slurm_conf: str | None = None  # `--scheduler slurm`: the slurm.conf written before the nodes start
    tcp_cc: str | None = None  # the nodes' TCP congestion control (labctl.lab.tcp); None: the host's
    tcp_note: str | None = None  # why the nodes keep the host's, where the default could not be had
    owner: Mapping[str, str] = field(default_factory=dict)  # the owner labels every resource gets


def build_up_plan(client, config: LabConfig, workspace: Path, *, node_cpus: str | dict[str, float] | None = None,
                  ssh: bool | None = None, dry_run: bool = False, owner: Owner | None = None) -> UpPlan:
    """Validate against the engine and render everything; creates nothing (but the lab's SSH key,
    made once, unless `dry_run`). A running lab keeps the owner it has (a change of labels would
    make Compose recreate every node); a new one gets `owner`'s labels."""
    engine = engine_mod.usable_engine(client)
    existing = lab_containers(client, config.lab)
    if existing and config.sources.get("nodes") == "default":
        config = replace(config, nodes=len(existing))
    config = kept_gpus(config, existing)
    if existing and config.sources.get("scheduler") == "default":  # a running lab keeps its scheduler
        if any((c.get("Labels") or {}).get(LABEL_SCHEDULER) == "slurm" for c in existing):
            config = replace(config, scheduler="slurm")
    # Checked against the lab's final size (a running lab keeps its count), before anything changes.
    per_node = parse_node_cpus(node_cpus, config.nodes) if isinstance(node_cpus, str) else node_cpus
    if ssh is None:  # a running lab keeps what it was brought up with
        ssh = any((c.get("Labels") or {}).get(LABEL_SSH) == "true" for c in existing)
    gpu_plan = plan_gpus(config, engine)
    refused = engine_mod.ssh_refusal(engine) if ssh else None
    if refused:
        raise refused
    directory = lab_dir(workspace, config.lab)
    public_key = None
    if ssh:
        from labctl.hosts import labnodes

        public_key = labnodes.lab_public_key(directory, config.lab, make=not dry_run)
    kept = owner_labels(existing[0].get("Labels") or {}) if existing else {}
    labels = kept if existing else (owner.labels() if owner else {})
    tcp_cc, tcp_note = plan_tcp(config, engine)
    document, env_files, subnet = plan_up(client, config, workspace, per_node, public_key, engine, labels, gpu_plan,
                                          tcp_cc)
    return UpPlan(config, engine, bool(existing), document, env_files, subnet, per_node, ssh, public_key, gpu_plan,
                  lab_slurm_conf(config, subnet, engine), tcp_cc, tcp_note, labels)


def plan_tcp(config: LabConfig, engine: Engine) -> tuple[str | None, str | None]:
    """The nodes' TCP congestion control and a note when they keep the host's (labctl.lab.tcp)."""
    # The engine shares this machine's kernel: a local socket, on Linux, and not Docker Desktop's VM.
    host = tcp.read_host_tcp(engine.local and engine.kind != "docker-desktop" and sys.platform.startswith("linux"))
    return tcp.plan_tcp_cc(config.tcp_cc, config.sources.get("tcp_cc", "default") != "default", host)


def lab_slurm_conf(config: LabConfig, subnet: str, engine: Engine) -> str | None:
    """slurm.conf for a lab with `--scheduler slurm` (None for a plain lab); refused (exit 1) where
    the engine cannot host Slurm's daemons (labctl.slurm.setup.refusal)."""
    if config.scheduler != "slurm":
        return None
    from labctl.config import node_ip
    from labctl.slurm import setup
    from labctl.slurm.conf import SlurmNode, build_slurm_conf

    refused = setup.refusal(engine)
    if refused:
        raise refused
    nodes = [SlurmNode(name, node_ip(subnet, rank)) for rank, name in enumerate(config.node_names)]
    return build_slurm_conf(config.lab, nodes, engine.cpus)


def kept_gpus(config: LabConfig, existing: list[dict]) -> LabConfig:
    """A running lab keeps its GPUs and its CUDA nodes unless --gpus or --cuda say otherwise, as it
    keeps its node count: reconciling it without them would recreate every node on the CPU image."""
    ranked = sorted(existing, key=lambda c: int((c.get("Labels") or {}).get(LABEL_RANK, "0")))
    if config.sources.get("gpus") == "default":
        held = [(c.get("Labels") or {}).get(LABEL_GPUS) for c in ranked]
        held = [h for h in held if h]
        if held:
            indices = ",".join(held)
            config = replace(config, gpus=indices if "," in indices else indices + ",")
            if config.sources.get("gpus_per_node") == "default":
                config = replace(config, gpus_per_node=len(held[0].split(",")))
    if config.sources.get("cuda") == "default" and config.sources.get("gpus") == "default":
        cuda = [(c.get("Labels") or {}).get(LABEL_NODE, "") for c in ranked if c.get("Image") == config.cuda_image_tag]
        if cuda:
            config = replace(config, cuda=",".join(cuda))
    return config


def plan_gpus(config: LabConfig, engine: Engine) -> gpus_mod.GpuPlan:
    """Each node's GPUs and image. Settings that do not fit together are refused first (exit 2),
    then a machine without GPUs, without as many as asked, or an engine without the NVIDIA runtime
    (exit 1): all before anything exists, and under --dry-run too (its plan is this machine's)."""
    if config.gpus is None:  # CUDA-image nodes at most, on CPU: nothing to ask of the machine
        return gpus_mod.build_gpu_plan(config, None)
    if config.gpus != "all":
        gpus_mod.build_gpu_plan(config, None)
    asked = gpus_mod.asked(config)
    machine = gpus_mod.detect_gpus(asked)
    hooks = [h for h in engine_mod.NVIDIA_HOOKS if shutil.which(h)]
    refused = engine_mod.gpu_runtime_refusal(engine, asked, hooks)
    if refused:
        raise refused
    return gpus_mod.build_gpu_plan(config, machine)


def wait_for_slurm(client, plan: UpPlan, report: Report) -> None:
    """Every node IDLE in Slurm; a lab this call created is removed when its cluster does not come up."""
    from labctl.lab.lifecycle import apply_down
    from labctl.slurm import setup

    try:
        if plan.existing:  # nodes that were not recreated keep their daemons, on the old slurm.conf
            setup.restart(client, plan.config.lab, plan.config.node_names)
        setup.wait_ready(client, plan.config.lab, plan.config.node_names)
    except LabError:
        if not plan.existing:
            apply_down(client, plan.config.lab, volumes=True)
        raise
    report(f"slurm: {len(plan.config.node_names)} nodes idle, controller {setup.CONTROLLER}")


def apply_up_plan(client, plan: UpPlan, workspace: Path, report: Report) -> tuple[UpPlan, list[NodeState]]:
    """Bring the lab to the plan; returns the plan that was applied (another subnet after a race)
    and the nodes, all running and reporting torch. A lab this call created is removed again when
    bring-up fails: never a half-built lab."""
    verb = "reconciling" if plan.existing else "starting"
    config = plan.config
    for attempt in range(1, SUBNET_ATTEMPTS + 1):
        started = f"{verb} lab {config.lab}: {config.nodes} nodes on {plan.subnet}"
        if plan.slurm_conf:  # before the nodes start: their entry point starts Slurm from these files
            from labctl.slurm import setup

            setup.write_files(lab_dir(workspace, config.lab), plan.slurm_conf)
        try:
            nodes = apply_up(client, config, workspace, plan.document, plan.env_files, report, plan.engine,
                             started=started)
            if plan.slurm_conf:
                wait_for_slurm(client, plan, report)
            return plan, nodes
        except (CommandError, LabError) as exc:
            # Another lab (or anything else) took the same free subnet between our pick and Compose
            # creating the network: the failed attempt was removed, so pick again.
            raced = "overlaps with other one" in str(exc) and config.subnet == AUTO and not plan.existing
            if not raced or attempt == SUBNET_ATTEMPTS:
                raise
            report(f"{plan.subnet} was taken meanwhile; picking another subnet")
            document, env_files, subnet = plan_up(client, config, workspace, plan.node_cpus, plan.public_key,
                                                  plan.engine, plan.owner, plan.gpus, plan.tcp_cc)
            plan = replace(plan, document=document, env_files=env_files, subnet=subnet,
                           slurm_conf=lab_slurm_conf(config, subnet, plan.engine))
    raise AssertionError("unreachable")
