"""Every lab on the engine (`labctl ls`), found by the label that labctl puts on each container,
network and volume of a lab, whatever workspace brought it up.

`build_listings` turns what the engine lists into one LabListing per lab (pure); `list_labs` asks
the engine (three list calls, one inspect per lab for its user) and reads back the links of the
running nodes with tc, as `labctl status` does.
"""

from __future__ import annotations

import pwd
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from labctl.engine.docker import is_node
from labctl.engine.labels import LABEL_LAB, LABEL_NODE, LABEL_RANK, LABEL_WORKSPACE
from labctl.lab.owner import PREFIX, owner_labels

COMPOSE_WORKING_DIR = "com.docker.compose.project.working_dir"  # .lab/<lab> in the workspace, set by Compose


@dataclass(frozen=True)
class LabListing:
    """One lab as the engine has it now."""

    name: str
    running: int  # nodes running
    total: int  # nodes, in any state
    created: float | None  # epoch seconds its first node was created; None when it has no node
    workspace: str | None  # where it was brought up (its nodes bind-mount it)
    user: str | None = None  # whom its nodes run as: the person who brought it up
    shaping: dict[str, str] = field(default_factory=dict)  # running node -> its link as tc reports it
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    owner: dict[str, str] = field(default_factory=dict)  # labctl.lab.owner's labels

    def as_dict(self, now: float) -> dict:
        return {"lab": self.name, "running": self.running, "nodes": self.total, "shaping": self.shaping,
                "created": self.created, "age_s": None if self.created is None else round(now - self.created),
                "workspace": self.workspace, "user": self.user, "networks": self.networks, "volumes": self.volumes,
                "owner": {k.removeprefix(PREFIX): v for k, v in self.owner.items()}}


def _workspace(labels: dict) -> str | None:
    if labels.get(LABEL_WORKSPACE):
        return labels[LABEL_WORKSPACE]
    working_dir = labels.get(COMPOSE_WORKING_DIR)  # <workspace>/.lab/<lab>
    return str(Path(working_dir).parent.parent) if working_dir else None


def build_listings(containers: list[dict], networks: list[dict], volumes: list[dict]) -> list[LabListing]:
    """One listing per lab named by a LABEL_LAB label, by name: its nodes (helper containers, which
    carry the lab's label but no node's, do not count), networks and volumes. A lab that has only
    a network or a volume left is listed too, with no nodes: `labctl down --volumes` removes it."""
    labs: dict[str, dict] = {}

    def entry(labels: dict) -> dict:
        lab = labs.setdefault(labels[LABEL_LAB], {"nodes": [], "networks": [], "volumes": [], "workspace": None,
                                                  "owner": {}})
        lab["workspace"] = lab["workspace"] or _workspace(labels)
        lab["owner"] = lab["owner"] or owner_labels(labels)
        return lab

    for c in containers:
        labels = c.get("Labels") or {}
        if labels.get(LABEL_LAB) and labels.get(LABEL_NODE):
            entry(labels)["nodes"].append(c)
    for kind, items in (("networks", networks), ("volumes", volumes)):
        for item in items:
            labels = item.get("Labels") or {}
            if labels.get(LABEL_LAB):
                entry(labels)[kind].append(item["Name"])
    return [LabListing(name=name, running=sum(c["State"] == "running" for c in lab["nodes"]), total=len(lab["nodes"]),
                       created=min((c["Created"] for c in lab["nodes"]), default=None), workspace=lab["workspace"],
                       networks=sorted(lab["networks"]), volumes=sorted(lab["volumes"]), owner=lab["owner"])
            for name, lab in sorted(labs.items())]


def user_name(user: str | None) -> str | None:
    """A container's "uid:gid" as a login name where this machine knows the uid."""
    if not user:
        return None
    uid = user.split(":")[0]
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (ValueError, KeyError):
        return f"uid {uid}" if uid.isdigit() else uid


def shaping_text(shaping: dict[str, str]) -> str:
    """A table cell: one value when every running node's link is alike, else each node's."""
    if not shaping:
        return "-"
    values = set(shaping.values())
    if len(values) == 1:
        return values.pop()
    return ", ".join(f"{node}={value}" for node, value in shaping.items())


def age_text(seconds: float) -> str:
    """'45 s', '12 min', '3 h', '2 d': the largest whole unit, as `docker ps` rounds."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def engine_labs(client) -> tuple[list[LabListing], list[dict]]:
    """Every lab on the engine from three list calls (nothing read inside the nodes), and the
    containers as listed."""
    selector = {"label": LABEL_LAB}
    containers = client.api.containers(all=True, filters=selector)
    return build_listings(containers, client.api.networks(filters=selector),
                          client.api.volumes(filters=selector).get("Volumes") or []), containers


def list_labs(client, link_of: Callable[[str, str], str] | None = None) -> list[LabListing]:
    """Every lab on the engine, with who brought it up and, given `link_of(lab, node)` (labctl.net's
    reading of a node's link, as text), its running nodes' links."""
    import docker.errors

    listings, containers = engine_labs(client)
    nodes = [c for c in containers if is_node(c)]
    first = {}
    for c in sorted(nodes, key=lambda c: int(c["Labels"].get(LABEL_RANK, "0"))):
        first.setdefault(c["Labels"][LABEL_LAB], c["Id"])
    running = [(c["Labels"][LABEL_LAB], c["Labels"][LABEL_NODE]) for c in nodes if c["State"] == "running"]

    def user(container_id: str) -> str | None:
        try:
            return user_name(client.api.inspect_container(container_id)["Config"].get("User"))
        except docker.errors.NotFound:  # removed since it was listed
            return None

    def link(lab_node: tuple[str, str]) -> str:
        try:
            return link_of(*lab_node) if link_of else ""
        except docker.errors.APIError:  # stopped or removed since it was listed
            return "?"

    with ThreadPoolExecutor(max_workers=8) as pool:
        users = dict(zip(first, pool.map(user, first.values())))
        links = dict(zip(running, pool.map(link, running))) if link_of else {}
    shaping: dict[str, dict[str, str]] = {}
    for (lab, node), text in sorted(links.items(), key=lambda item: (item[0][0], _rank(item[0][1]))):
        shaping.setdefault(lab, {})[node] = text
    return [replace(listing, user=users.get(listing.name), shaping=shaping.get(listing.name, {}))
            for listing in listings]


def _rank(node: str) -> int:
    digits = "".join(ch for ch in node if ch.isdigit())
    return int(digits) if digits else 0
