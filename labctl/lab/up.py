"""`up` of the lab itself, as a plan and its application: what the lab will be (the Compose document,
the env files, the subnet, the engine it runs on: `render_project`), then bringing it there
(labctl.lab.lifecycle.apply_up), reconciling a running lab, and retrying when a concurrent `up` took
the same free subnet between our pick and Compose making the network (an engine quirk, handled
where it arises).

What the nodes run besides (a scheduler), shaping at bring-up and the SSH inventory belong to
labctl.api.bringup, which composes this with labctl.slurm, labctl.net and labctl.hosts: they reach the
lab's bring-up through `Services`.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Protocol

from labctl.core.ui import Report
from labctl.engine import detect as engine_mod
from labctl.engine.detect import Engine
from labctl.engine.docker import check_cpu_limits, lab_networks, network_subnets
from labctl.engine.labels import LABEL_GPUS, LABEL_NODE, LABEL_RANK, LABEL_SCHEDULER, LABEL_SSH
from labctl.errors import CommandError, ConfigError, LabError
from labctl.image.lockfile import Lock
from labctl.image.package_image import lock_and_layer
from labctl.image.packages import LABEL_PACKAGES, LOCK_FILE, Declaration, base_of
from labctl.lab import compose as compose_mod
from labctl.lab import gpus as gpus_mod
from labctl.lab import tcp
from labctl.lab.compose import ComposePlan
from labctl.lab.envfiles import build_env_files, topology_for_lab
from labctl.lab.gpus import GpuPlan
from labctl.lab.lifecycle import NodeState, apply_down, apply_up, invoking_user, lab_dir
from labctl.lab.owner import owner_labels
from labctl.spec.addresses import check_fits, node_ip, overlaps, pick_free_subnet
from labctl.spec.labspec import (
    AUTO,
    LabSpec,
    check_node_cpus,
    shown_key,
    shown_source,
)

SUBNET_ATTEMPTS = 4  # `up` picks again when a concurrent `up` took the same free subnet


@dataclass(frozen=True)
class UpPlan:
    """Everything `up` will create or change, as data; `--dry-run` prints the document and env files."""

    config: LabSpec  # settled: a running lab's own node count, GPUs, scheduler and SSH where none was asked for
    engine: Engine
    existing: bool  # a running lab is reconciled, not created
    document: dict  # the Compose document
    env_files: dict[str, str]  # file name -> text
    subnet: str
    public_key: str | None  # the lab's SSH key, with `ssh`
    gpus: gpus_mod.GpuPlan  # each node's GPUs and image
    tcp_cc: str | None = None  # the nodes' TCP congestion control (labctl.lab.tcp); None: the host's
    tcp_note: str | None = None  # why the nodes keep the host's, where the default could not be had
    owner: Mapping[str, str] = field(default_factory=dict)  # the owner labels every resource gets
    files: Mapping[str, str] = field(default_factory=dict)  # more files the nodes start from, by path in the lab's folder
    packages: Declaration | None = None  # the project's packages (labctl.image.packages): resolved at bring-up
    lock: Lock | None = None  # their lock, once resolved; every node then runs a package image
    package_images: Mapping[str, str] = field(default_factory=dict)  # node image -> its package image
    lock_text: str = ""  # the lock as the lab's pylock.toml says it

    def with_package_images(self, lock: Lock, images: Mapping[str, str], text: str | None = None) -> UpPlan:
        """The plan with every node on the package image of its node image (`images`: node image ->
        package image), as resolved from `lock`."""
        gpus = self.gpus
        for node in gpus.nodes:
            gpus = gpus.with_image(node.node, images.get(node.image, node.image))
        services = {name: {**service, "image": images.get(service.get("image"), service.get("image"))}
                    for name, service in self.document.get("services", {}).items()}
        return replace(self, gpus=gpus, document={**self.document, "services": services}, lock=lock,
                       package_images=dict(images), lock_text=self.lock_text if text is None else text)

    @property
    def ssh(self) -> bool:
        return bool(self.config.ssh)


class Services(Protocol):
    """What the nodes run besides the lab itself and start with it (labctl.api.bringup's Slurm cluster)."""

    def prepare(self, plan: UpPlan) -> UpPlan: ...  # the files they start from, for this plan's addresses

    def wait(self, plan: UpPlan) -> None: ...  # until they are up on the running nodes


def settle(config: LabSpec, existing: list[dict]) -> LabSpec:
    """What a running lab keeps unless asked otherwise: its node count, its GPUs and CUDA nodes, its
    scheduler, and whether its nodes are SSH hosts. Per-node CPU limits must name nodes it has."""
    labels = [c.get("Labels") or {} for c in existing]
    if existing and config.sources.get("nodes") == "default":
        config = replace(config, nodes=len(existing))
    config = kept_gpus(config, existing)
    if existing and config.sources.get("scheduler") == "default" and any(
            label.get(LABEL_SCHEDULER) == "slurm" for label in labels):
        config = replace(config, scheduler="slurm")
    if config.ssh is None:
        config = replace(config, ssh=any(label.get(LABEL_SSH) == "true" for label in labels))
    check_node_cpus(config.node_cpus, config.nodes, shown_key(config, "node_cpus"))
    return config


def kept_packages(config: LabSpec, existing: list[dict], directory: Path) -> LabSpec:
    """A running lab keeps its packages (its lock, .lab/<lab>/pylock.toml) unless `requirements` or
    `with_packages` says otherwise, as it keeps its node count."""
    asked = any(config.sources.get(name, "default") != "default" for name in ("requirements", "with_packages"))
    lock = directory / LOCK_FILE
    if asked or not lock.is_file() or not any((c.get("Labels") or {}).get(LABEL_PACKAGES) for c in existing):
        return config
    return replace(config, requirements=str(lock))


def prepare_packages(client, plan: UpPlan, report: Report) -> UpPlan:
    """The plan with every node on the package image of its node image: the lock resolved (or found)
    and the images made (labctl.image.package_image), before anything of the lab changes, so that bad
    requirements leave a running lab as it was."""
    if plan.packages is None:
        return plan
    lock, images, text = lock_and_layer(client, plan.packages, plan.config, {n.image for n in plan.gpus.nodes},
                                        report)
    return plan.with_package_images(lock, images, text)


def build_up_plan(client, config: LabSpec, workspace: Path, *, engine: Engine, existing: list[dict],
                  public_key: str | None = None, owner: Mapping[str, str] | None = None,
                  images: Mapping[str, str] | None = None) -> UpPlan:
    """Validate a settled config against the engine and render everything; creates nothing. A running
    lab keeps the owner it has (a change of labels would make Compose recreate every node); a new one
    gets `owner`. `images` puts nodes, by name, on another image (a scenario's node on another torch)."""
    gpu_plan = plan_gpus(config, engine)
    for name, image in (images or {}).items():
        gpu_plan = gpu_plan.with_image(name, image)
    labels = owner_labels(existing[0].get("Labels") or {}) if existing else dict(owner or {})
    tcp_cc, tcp_note = plan_tcp(config, engine)
    document, env_files, subnet = render_project(client, config, workspace,
                                                 ProjectInputs(engine, public_key, labels, gpu_plan, tcp_cc))
    return UpPlan(config, engine, bool(existing), document, env_files, subnet, public_key, gpu_plan, tcp_cc, tcp_note,
                  labels)


def choose_subnet(client, config: LabSpec, raced: Iterable[str] = ()) -> str:
    """The lab keeps the subnet it runs on; a new lab takes the configured or a free one, none of
    `raced` (those an earlier attempt lost to a concurrent `up`: one can look free again a moment
    later, and the lowest free subnet would be the same one every time)."""
    own = [s for n in lab_networks(client, config.lab) for s in network_subnets(n)]
    if own:
        if config.subnet != AUTO and config.subnet != own[0]:
            raise ConfigError(shown_key(config, "subnet"), config.subnet, f"lab '{config.lab}' already runs on {own[0]}",
                              shown_source(config, "subnet"), hint=f"`labctl down --lab {config.lab}` first to move it")
        return own[0]
    others = {}
    for network in client.networks.list():
        for subnet in network_subnets(network):
            others[subnet] = network.name
    if config.subnet == AUTO:
        return pick_free_subnet([*others, *raced])
    clash = overlaps(config.subnet, list(others))
    if clash:
        names = ", ".join(f"{others[c]} ({c})" for c in clash)
        raise ConfigError(shown_key(config, "subnet"), config.subnet, f"overlaps the existing Docker network {names}",
                          shown_source(config, "subnet"), hint="pick another range, or leave DDPLAB_SUBNET=auto to get a free one")
    return config.subnet


def check_host_limits(client, config: LabSpec) -> None:
    limits = {shown_key(config, "cpus"): config.cpus} if config.cpus is not None else {}
    limits.update({f"{shown_key(config, 'node_cpus')} {name}": cpus for name, cpus in config.node_cpus})
    check_cpu_limits(client, limits)


@dataclass(frozen=True)
class ProjectInputs:
    """What the lab's Compose project is rendered from besides the spec, decided once when `up` is
    planned and kept for a second rendering (a subnet lost to a concurrent `up`)."""

    engine: Engine | None = None  # None: the client's engine, asked for
    public_key: str | None = None  # the lab's SSH key, with `ssh`
    owner: Mapping[str, str] = field(default_factory=dict)  # the owner labels every resource gets
    gpus: GpuPlan | None = None  # each node's GPUs and image (plan_gpus); None: every node the CPU image
    tcp_cc: str | None = None  # the nodes' TCP congestion control (plan_tcp); None: the host's


def render_project(client, config: LabSpec, workspace: Path, inputs: ProjectInputs = ProjectInputs(),
                   raced: Iterable[str] = ()) -> tuple[dict, dict[str, str], str]:
    """The lab's Compose document, env files and subnet, validated against the engine; creates
    nothing. `raced`: subnets not to pick (choose_subnet)."""
    engine = inputs.engine or engine_mod.usable_engine(client)
    gpus = inputs.gpus
    node_cpus = config.node_cpu_limits
    if config.cpus is not None or node_cpus:
        given = shown_key(config, "cpus") if config.cpus is not None else shown_key(config, "node_cpus")
        refused = engine_mod.cpu_limits_refusal(engine, given)
        if refused:
            raise refused
    subnet = choose_subnet(client, config, raced)
    check_fits(config, subnet)
    check_host_limits(client, config)
    plan = ComposePlan(subnet=subnet, workspace=workspace, user=engine_mod.node_user(engine, invoking_user()),
                       node_cpus=node_cpus or {}, ssh_public_key=inputs.public_key, limits=engine.limits,
                       owner=inputs.owner or {}, gpus=gpus, tcp_cc=inputs.tcp_cc,
                       compile_caches=compile_caches(client, config, gpus),
                       slurm_dir=lab_dir(workspace, config.lab) / "slurm" if config.scheduler == "slurm" else None)
    document = compose_mod.build_compose(config, plan, compose_mod.load_template())
    ips = [node_ip(subnet, i) for i in range(config.nodes)]
    extra = {name: {**config.node_env, **(gpus.env.get(name, {}) if gpus else {})} for name in config.node_names}
    env_files = build_env_files(topology_for_lab(config, ips), config.node_names, extra)
    return document, env_files, subnet


def compile_caches(client, config: LabSpec, gpus: GpuPlan | None) -> dict[str, str]:
    """Each node's compile cache folder, by the id of the image it runs (compose.compile_cache_dir);
    none for a node whose image is not there yet (the rendering is checked before a build)."""
    from docker.errors import DockerException

    out = {}
    for name in config.node_names:
        image = gpus.node(name).image if gpus else config.image_tag
        try:
            out[name] = compose_mod.compile_cache_dir(client.images.get(image).id)
        except DockerException:  # not built yet: ImageNotFound
            continue
    return out


def plan_tcp(config: LabSpec, engine: Engine) -> tuple[str | None, str | None]:
    """The nodes' TCP congestion control and a note when they keep the host's (labctl.lab.tcp)."""
    # The engine shares this machine's kernel: a local socket, on Linux, and not Docker Desktop's VM.
    host = tcp.read_host_tcp(engine.local and engine.kind != "docker-desktop" and sys.platform.startswith("linux"))
    return tcp.plan_tcp_cc(config.tcp_cc, config.sources.get("tcp_cc", "default") != "default", host)


def kept_gpus(config: LabSpec, existing: list[dict]) -> LabSpec:
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
        cuda = [(c.get("Labels") or {}).get(LABEL_NODE, "") for c in ranked
                if base_of(c.get("Image") or "") == config.cuda_image_tag]
        if cuda:
            config = replace(config, cuda=",".join(cuda))
    return config


def plan_gpus(config: LabSpec, engine: Engine) -> gpus_mod.GpuPlan:
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


def apply_up_plan(client, plan: UpPlan, workspace: Path, report: Report,
                  services: Services | None = None) -> tuple[UpPlan, list[NodeState]]:
    """Bring the lab to the plan; returns the plan that was applied (another subnet after a race)
    and the nodes, all running and reporting torch, with `services` up on them. A lab this call
    created is removed again when bring-up fails: never a half-built lab."""
    verb = "reconciling" if plan.existing else "starting"
    config = plan.config
    lost: list[str] = []  # subnets an attempt lost to a concurrent `up`
    for attempt in range(1, SUBNET_ATTEMPTS + 1):
        started = f"{verb} lab {config.lab}: {config.nodes} nodes on {plan.subnet}"
        if services:  # before the nodes start: their entry point starts the services from these files
            plan = services.prepare(plan)
        try:
            nodes = apply_up(client, config, workspace, plan.document, plan.env_files, report, plan.engine,
                             started=started)
        except (CommandError, LabError) as exc:
            # Another lab (or anything else) took the same free subnet between our pick and Compose
            # creating the network: the failed attempt was removed, so pick again.
            raced = "overlaps with other one" in str(exc) and config.subnet == AUTO and not plan.existing
            if not raced or attempt == SUBNET_ATTEMPTS:
                raise
            report(f"{plan.subnet} was taken meanwhile; picking another subnet")
            lost.append(plan.subnet)
            inputs = ProjectInputs(plan.engine, plan.public_key, plan.owner, plan.gpus, plan.tcp_cc)
            document, env_files, subnet = render_project(client, config, workspace, inputs, lost)
            plan = replace(plan, document=document, env_files=env_files, subnet=subnet)
            if plan.lock is not None:  # the document was rendered again, on the node images
                plan = plan.with_package_images(plan.lock, plan.package_images)
            continue
        if services:
            try:
                services.wait(plan)
            except LabError:
                if not plan.existing:
                    apply_down(client, config.lab, volumes=True)
                raise
        return plan, nodes
    raise AssertionError("unreachable")
