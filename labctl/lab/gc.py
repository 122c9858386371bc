"""`labctl gc`: remove the labs whose owner is gone (see labctl/lab/owner.py), or with `--all`
every ddplab lab on the engine. `plan_gc` decides from the labels alone (pure); `collect_garbage`
asks the engine and removes what the plan says, containers, networks and volumes, as
`labctl down --volumes` does. Run folders and env files in the workspace stay (a crashed test
session's logs are what one wants to read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from labctl.lab.lifecycle import apply_down
from labctl.lab.listing import LabListing, engine_labs
from labctl.lab.owner import LABEL_HOST, LABEL_PID, LABEL_SESSION, owner_gone


@dataclass(frozen=True)
class Verdict:
    lab: str
    remove: bool
    why: str

    def as_dict(self) -> dict:
        return {"lab": self.lab, "remove": self.remove, "why": self.why}


def plan_gc(listings: Sequence[LabListing], *, everything: bool = False,
            gone: Callable[[Mapping[str, str]], str | None] = owner_gone) -> list[Verdict]:
    """For each lab: remove it, or keep it, and why. `gone(owner labels)` says why its owner is
    gone, or None."""
    verdicts = []
    for lab in listings:
        why = gone(lab.owner)
        if why:
            verdicts.append(Verdict(lab.name, True, why))
        elif everything:
            verdicts.append(Verdict(lab.name, True, "--all"))
        elif LABEL_PID not in lab.owner:
            session = lab.owner.get(LABEL_SESSION)
            verdicts.append(Verdict(lab.name, False, f"no owner process ({f'from {session}' if session else 'no owner labels'}); "
                                                     "`labctl down` or `gc --all` removes it"))
        else:
            host = lab.owner.get(LABEL_HOST, "?")
            verdicts.append(Verdict(lab.name, False, f"its owner, process {lab.owner[LABEL_PID]} on {host}, "
                                                     f"is alive, or in another machine or container"))
    return verdicts


def collect_garbage(client, *, everything: bool = False, dry_run: bool = False) -> list[Verdict]:
    """Remove the labs `plan_gc` condemns (none with `dry_run`); every lab's verdict."""
    listings, _ = engine_labs(client)
    verdicts = plan_gc(listings, everything=everything)
    if not dry_run:
        for verdict in verdicts:
            if verdict.remove:
                apply_down(client, verdict.lab, volumes=True)
    return verdicts
