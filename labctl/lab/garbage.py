"""`labctl gc`: remove the labs whose owner is gone (see labctl/lab/owner.py), or with `--all`
every ddplab lab on the engine. `plan_gc` decides from the labels alone (pure); `collect_garbage`
asks the engine and removes what the plan says, containers, networks and volumes, as
`labctl down --volumes` does. Run folders and env files in the workspace stay (a crashed test
session's logs are what one wants to read).

Then the package images no container uses any more (labctl.image.package_image: one per lock and
node image, each a layer of the project's packages): `plan_images` decides from the engine's lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from labctl.engine.labels import LABEL_LAB
from labctl.image.packages import LABEL_PACKAGES
from labctl.lab.lifecycle import apply_down, forget_secrets, lab_dir
from labctl.lab.listing import LabListing, engine_labs
from labctl.lab.owner import LABEL_HOST, LABEL_PID, LABEL_SESSION, owner_gone


@dataclass(frozen=True)
class LabVerdict:
    lab: str
    remove: bool
    why: str

    def as_dict(self) -> dict:
        return {"lab": self.lab, "remove": self.remove, "why": self.why}


@dataclass(frozen=True)
class ImageVerdict:
    image: str  # its tag, or its id where nothing names it now
    remove: bool
    why: str

    def as_dict(self) -> dict:
        return {"image": self.image, "remove": self.remove, "why": self.why}


def plan_gc(listings: Sequence[LabListing], *, everything: bool = False,
            gone: Callable[[Mapping[str, str]], str | None] = owner_gone) -> list[LabVerdict]:
    """For each lab: remove it, or keep it, and why. `gone(owner labels)` says why its owner is
    gone, or None."""
    verdicts = []
    for lab in listings:
        why = gone(lab.owner)
        if why:
            verdicts.append(LabVerdict(lab.name, True, why))
        elif everything:
            verdicts.append(LabVerdict(lab.name, True, "--all"))
        elif LABEL_PID not in lab.owner:
            session = lab.owner.get(LABEL_SESSION)
            verdicts.append(LabVerdict(lab.name, False, f"no owner process ({f'from {session}' if session else 'no owner labels'}); "
                                                     "`labctl down` or `gc --all` removes it"))
        else:
            host = lab.owner.get(LABEL_HOST, "?")
            verdicts.append(LabVerdict(lab.name, False, f"its owner, process {lab.owner[LABEL_PID]} on {host}, "
                                                     f"is alive, or in another machine or container"))
    return verdicts


def plan_images(images: Sequence[Mapping], used: set[str], going: set[str] = frozenset()) -> list[ImageVerdict]:
    """For each package image (the engine's list, `docker images` fields): remove it where no container
    uses it (`used`: image ids), or only containers of the labs about to go (`going`: image ids)."""
    verdicts = []
    for image in images:
        name = next((t for t in image.get("RepoTags") or [] if t != "<none>:<none>"), image["Id"][7:19])
        if image["Id"] in used - going:
            verdicts.append(ImageVerdict(name, False, "a lab's nodes run it"))
        else:
            verdicts.append(ImageVerdict(name, True, "no lab's node runs it (a package set no lab uses now)"))
    return verdicts


def collect_garbage(client, *, everything: bool = False, dry_run: bool = False) -> list[LabVerdict]:
    """Remove the labs `plan_gc` condemns (none with `dry_run`); every lab's verdict."""
    listings, _ = engine_labs(client)
    verdicts = plan_gc(listings, everything=everything)
    workspaces = {lab.name: lab.workspace for lab in listings}
    if not dry_run:
        for verdict in verdicts:
            if verdict.remove:
                apply_down(client, verdict.lab, volumes=True)
                if workspaces.get(verdict.lab):  # its overlay's keys go with it, as `down` removes them
                    forget_secrets(lab_dir(Path(workspaces[verdict.lab]), verdict.lab))
    return verdicts


def collect_package_images(client, *, dry_run: bool = False, going: Sequence[str] = ()) -> list[ImageVerdict]:
    """Remove the package images no container uses (none with `dry_run`, which counts the containers
    of the labs in `going`, about to be removed, as gone); every package image's verdict."""
    going_ids = {c["ImageID"] for lab in going
                 for c in client.api.containers(all=True, filters={"label": f"{LABEL_LAB}={lab}"})}
    used = {c["ImageID"] for c in client.api.containers(all=True)}
    images = plan_images(client.api.images(filters={"label": LABEL_PACKAGES}), used, going_ids if dry_run else set())
    if not dry_run:
        for image in images:
            if image.remove:
                client.api.remove_image(image.image)
    return images
