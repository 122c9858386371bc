"""The one way a lab comes up, for the CLI, the API, the pytest plugin and the scenarios alike:
`labctl up` across the layers: the lab itself (labctl.lab.up), the Slurm cluster its nodes may
also be (labctl.slurm), the lab's SSH identity and inventory (labctl.hosts.labnodes), its links
shaped at bring-up and its neighbour tables settled (labctl.net), and each node's fork server
(labctl.run.warm). The lab's own bring-up knows none of them; this module is where they meet, below
the API (`Lab.up`, `Lab.plan_up`) and above everything they use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from labctl.core.ui import Report
from labctl.engine import detect as engine_mod
from labctl.engine.docker import lab_nodes
from labctl.errors import LabError
from labctl.hosts import labnodes
from labctl.image import image as image_mod
from labctl.image.packages import LOCK_FILE, read_declaration
from labctl.image.resolve import write_atomic
from labctl.lab.lifecycle import NodeState, apply_down, forget_secrets, lab_dir
from labctl.lab.owner import Owner
from labctl.lab.up import UpPlan, apply_up_plan, build_up_plan, kept_packages, prepare_packages, settle
from labctl.net import overlay, overlay_apply
from labctl.net.apply import apply_shape, drop_helpers, read_links, settle_neighbors
from labctl.net.tc import LinkState, parse_shape
from labctl.run.warm import plan_servers, start_servers, stop_servers
from labctl.session import LabSession
from labctl.slurm import cluster
from labctl.slurm.conf import SlurmNode, build_slurm_conf
from labctl.spec.addresses import node_ip
from labctl.spec.labspec import LabSpec, shown_key, shown_source

SLURM_CONF = "slurm/slurm.conf"  # in the lab's folder, where the nodes' entry point reads it
PRELOAD_FILE = "preload"  # in the lab's folder: the modules `up --preload` named, one per line


@dataclass(frozen=True)
class UpResult:
    """A lab as `up` left it."""

    nodes: list[NodeState]
    subnet: str
    links: dict[str, LinkState] | None  # read back from the kernel when the lab was shaped at bring-up
    inventory: Path | None  # .lab/<lab>/hosts.toml when every node is an SSH host
    seconds: float
    overlay: dict[str, str] | None = None  # each node's overlay address (`up --overlay`); None without one


def plan_up(client, config: LabSpec, workspace: Path, *, owner: Owner | None = None,
            dry_run: bool = False, images: Mapping[str, str] | None = None) -> UpPlan:
    """What `up` would create (the Compose document, env files, subnet, slurm.conf); changes nothing
    but making the lab's SSH key once (not under `dry_run`). Everything is refused here, before
    anything exists: a bad --bw, an engine that cannot host Slurm, settings that do not fit.
    `images` puts nodes, by name, on another image (a scenario's node on another torch)."""
    if config.bw is not None:
        parse_shape(config.bw)
    engine = engine_mod.usable_engine(client)
    existing = lab_nodes(client, config.lab)  # its helpers are no nodes: they have no owner's labels
    directory = lab_dir(workspace, config.lab)
    config = kept_packages(settle(config, existing), existing, directory)
    if config.overlay is None:  # a running lab keeps its overlay; a new one has none
        config = replace(config, overlay=overlay_apply.running_kind(client, config.lab) if existing else overlay.NONE)
    packages = read_declaration(config.requirements, config.with_packages, workspace, shown_key(config, "requirements"),
                                shown_source(config, "requirements"))
    overlay.check_combination(config.overlay, config.scheduler, shown_key(config, "overlay"))
    if config.scheduler == "slurm":
        refused = cluster.refusal(engine)
        if refused:
            raise refused
    refused = engine_mod.ssh_refusal(engine) if config.ssh else None
    if refused:
        raise refused
    public_key = labnodes.lab_public_key(directory, config.lab, make=not dry_run) if config.ssh else None
    plan = build_up_plan(client, config, workspace, engine=engine, existing=existing, public_key=public_key,
                         owner=owner.labels() if owner else None, images=images)
    overlay.overlay_for(config.overlay, plan.subnet)  # refuses a bridge inside tailscale's block
    return with_slurm_conf(replace(plan, packages=packages))


def with_slurm_conf(plan: UpPlan) -> UpPlan:
    """The plan with the slurm.conf its nodes start from, for its addresses (a Slurm lab only)."""
    config = plan.config
    if config.scheduler != "slurm":
        return plan
    nodes = [SlurmNode(name, node_ip(plan.subnet, rank)) for rank, name in enumerate(config.node_names)]
    return replace(plan, files={**plan.files, SLURM_CONF: build_slurm_conf(config.lab, nodes, plan.engine.cpus)})


class SlurmServices:
    """The lab's Slurm cluster, brought up with its nodes (labctl.lab.up.Services)."""

    def __init__(self, client, workspace: Path, report: Report):
        self.client, self.workspace, self.report = client, workspace, report

    def prepare(self, plan: UpPlan) -> UpPlan:
        plan = with_slurm_conf(plan)  # again: a subnet race moves the addresses
        cluster.write_files(lab_dir(self.workspace, plan.config.lab), plan.files[SLURM_CONF])
        return plan

    def wait(self, plan: UpPlan) -> None:
        names = plan.config.node_names
        if plan.existing:  # nodes that were not recreated keep their daemons, on the old slurm.conf
            cluster.restart(self.client, plan.config.lab, names)
        cluster.wait_cluster_ready(self.client, plan.config.lab, names)
        self.report(f"slurm: {len(names)} nodes idle, controller {cluster.CONTROLLER}")


def bring_up(session: LabSession, plan: UpPlan, report: Report, build_progress=None) -> UpResult:
    """Apply an up plan: build the node images it runs if missing, start (or reconcile) the lab and
    what its nodes run besides, shape every link when the config says so, and write or remove the
    SSH inventory of the nodes."""
    client, config = session.client, plan.config
    started = time.monotonic()
    image_mod.build_missing(client, config, {n.image for n in plan.gpus.nodes}, report, build_progress)
    helper_image = overlay_image(client, config, report)  # and the TUN device checked: before anything starts
    plan = prepare_packages(client, plan, report)
    for warning in (engine_mod.limits_warning(plan.engine, config.memory, config.pids_limit), plan.tcp_note):
        if warning:
            report(warning)
    services = SlurmServices(client, session.workspace, report) if config.scheduler == "slurm" else None
    drop_helpers(client, config.lab)
    drop_helpers(client, config.lab, overlay_apply.ROLE)  # they hold the nodes' endpoints too; started again below
    plan, nodes = apply_up_plan(client, plan, session.workspace, report, services)
    names = [n.name for n in nodes]
    settle_neighbors(client, config.lab, {n.name: n.ip for n in nodes}, config.iface)
    try:
        mesh = start_overlay(session, plan, nodes, helper_image, report)
    except LabError:
        if not plan.existing:  # never a half-built lab: one this call created goes again
            apply_down(client, config.lab, volumes=True)
        raise
    start_warm(session, config, plan.engine, names, report)
    links = None
    if config.bw is not None:
        apply_shape(client, config.lab, names, parse_shape(config.bw), config.iface)
        links = read_links(client, config.lab, names, config.iface)
    inventory = write_inventory(session, nodes, plan.ssh, report)
    write_lab_lock(session.directory, plan)
    return UpResult(nodes, plan.subnet, links, inventory, time.monotonic() - started, mesh)


def overlay_image(client, config: LabSpec, report: Report) -> str | None:
    """The overlay's helper image, built where missing, on an engine whose machine has the TUN device
    (refused otherwise); None for a lab without an overlay."""
    if config.overlay == overlay.NONE:
        return None
    image = overlay_apply.ensure_image(client, overlay_apply.helper_base(client, config, report), report)
    overlay_apply.check_tun(client, image)
    return image


def start_overlay(session: LabSession, plan: UpPlan, nodes: list[NodeState], image: str | None,
                  report: Report) -> dict[str, str] | None:
    """Every node's tunnel, each node a peer of every other (None, and the lab's keys removed, without
    an overlay)."""
    mesh = overlay.overlay_for(plan.config.overlay, plan.subnet)
    if mesh is None or image is None:
        forget_secrets(session.directory)
        return None
    names = [n.name for n in nodes]
    keys = overlay_apply.ensure_keys(session.client, image, session.directory, names)
    addresses = overlay_apply.apply_overlay(session.client, session.name, mesh, image, keys, {n.name: n.ip for n in nodes})
    report(f"overlay {mesh.kind}: {mesh.iface} (MTU {mesh.mtu}) on every node, "
           + ", ".join(f"{node} {ip}" for node, ip in addresses.items()))
    return addresses


def write_lab_lock(directory: Path, plan: UpPlan) -> None:
    """.lab/<lab>/pylock.toml: the lock every node runs, for doctor, `run --dry-run` and the next
    `up`; removed where the lab has no packages now. The lab's own lock, kept, is left as it is."""
    path = directory / LOCK_FILE
    if plan.lock is None:
        path.unlink(missing_ok=True)
    elif plan.packages is not None and plan.packages.file != path.resolve():
        write_atomic(path, plan.lock_text)


def start_warm(session: LabSession, config: LabSpec, engine, names: list[str], report: Report) -> None:
    """Each node's fork server, where the `warm` setting and the engine's memory allow
    (labctl.run.warm), importing the lab's --preload modules too: those given now, else those it was
    given before; and, once idle, torch._dynamo unless the lab's idle imports are off."""
    start, note = plan_servers(config.warm, len(names), engine.memory_bytes)
    if note:
        report(note)
    if not start:
        stop_servers(session.nodes(), names)
        return
    given = config.preload if config.sources.get("preload", "default") != "default" else None
    preload = kept_preload(session.directory / PRELOAD_FILE, given)
    for node, why in start_servers(session.nodes(), names, preload, config.idle_imports == "on").items():
        report(f"{node}: no fork server ({why}); its runs start cold")


def kept_preload(saved: Path, given: tuple[str, ...] | None) -> tuple[str, ...]:
    """The lab's --preload modules: those `given` (kept in `saved` for the next `up`; none removes the
    file), else those kept there."""
    if given is not None:
        if given:
            saved.write_text("".join(f"{module}\n" for module in given))
        else:
            saved.unlink(missing_ok=True)
        return given
    return tuple(saved.read_text().split()) if saved.is_file() else ()


def write_inventory(session: LabSession, nodes: list[NodeState], ssh: bool, report: Report) -> Path | None:
    """hosts.toml for the lab's nodes as SSH hosts; removed when they no longer run sshd."""
    inventory = session.directory / labnodes.INVENTORY_FILE
    if ssh:
        inventory = labnodes.write_ssh_files(session.client, session.config, session.directory, nodes, session.cpus)
        report(f"every node is an SSH host; {inventory} describes them: `labctl hosts check --lab {session.name}`")
        return inventory
    if inventory.is_file():  # an inventory of nodes that no longer run sshd would mislead
        inventory.unlink()
    return None
