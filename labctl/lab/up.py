"""`up` as a plan and its application: what the lab will be (the Compose document, the env files,
the subnet, the engine it runs on), then bringing it there, reconciling a running lab, and retrying
when a concurrent `up` took the same free subnet between our pick and Compose making the network.

Shaping at bring-up and the SSH inventory are the API's (labctl.api.Lab.up), which composes this
with labctl.net and labctl.hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from labctl.config import AUTO, LabConfig, parse_node_cpus
from labctl.errors import CommandError, LabError
from labctl.lab import engine as engine_mod
from labctl.lab.compose import LABEL_SSH
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


def build_up_plan(client, config: LabConfig, workspace: Path, *, node_cpus: str | dict[str, float] | None = None,
                  ssh: bool | None = None, dry_run: bool = False, owner: Owner | None = None) -> UpPlan:
    """Validate against the engine and render everything; creates nothing (but the lab's SSH key,
    made once, unless `dry_run`). A running lab keeps the owner it has (a change of labels would
    make Compose recreate every node); a new one gets `owner`'s labels."""
    engine = engine_mod.usable_engine(client)
    existing = lab_containers(client, config.lab)
    if existing and config.sources.get("nodes") == "default":
        config = replace(config, nodes=len(existing))
    # Checked against the lab's final size (a running lab keeps its count), before anything changes.
    per_node = parse_node_cpus(node_cpus, config.nodes) if isinstance(node_cpus, str) else node_cpus
    if ssh is None:  # a running lab keeps what it was brought up with
        ssh = any((c.get("Labels") or {}).get(LABEL_SSH) == "true" for c in existing)
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
    document, env_files, subnet = plan_up(client, config, workspace, per_node, public_key, engine, labels)
    return UpPlan(config, engine, bool(existing), document, env_files, subnet, per_node, ssh, public_key)


def apply_up_plan(client, plan: UpPlan, workspace: Path, report: Report) -> tuple[UpPlan, list[NodeState]]:
    """Bring the lab to the plan; returns the plan that was applied (another subnet after a race)
    and the nodes, all running and reporting torch. A lab this call created is removed again when
    bring-up fails: never a half-built lab."""
    verb = "reconciling" if plan.existing else "starting"
    config = plan.config
    for attempt in range(1, SUBNET_ATTEMPTS + 1):
        started = f"{verb} lab {config.lab}: {config.nodes} nodes on {plan.subnet}"
        try:
            return plan, apply_up(client, config, workspace, plan.document, plan.env_files, report, plan.engine,
                                  started=started)
        except (CommandError, LabError) as exc:
            # Another lab (or anything else) took the same free subnet between our pick and Compose
            # creating the network: the failed attempt was removed, so pick again.
            raced = "overlaps with other one" in str(exc) and config.subnet == AUTO and not plan.existing
            if not raced or attempt == SUBNET_ATTEMPTS:
                raise
            report(f"{plan.subnet} was taken meanwhile; picking another subnet")
            document, env_files, subnet = plan_up(client, config, workspace, plan.node_cpus, plan.public_key,
                                                  plan.engine)
            plan = replace(plan, document=document, env_files=env_files, subnet=subnet)
    raise AssertionError("unreachable")
