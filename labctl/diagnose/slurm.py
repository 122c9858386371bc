"""doctor's Slurm checks, on a lab brought up with `--scheduler slurm`: the controller answers,
every node is usable in its view, and every node holds the lab's one munge key."""

from __future__ import annotations

from labctl.diagnose.findings import Finding
from labctl.engine.docker import exec_in
from labctl.engine.labels import container_name
from labctl.slurm.cluster import CONTROLLER, node_states


def gather(client, lab: str, names: list[str]) -> tuple[bool, dict[str, str], dict[str, str]]:
    """For doctor: whether slurmctld answers, each node's state, and each node's munge key digest."""
    code, _ = exec_in(client, container_name(lab, CONTROLLER), ["scontrol", "ping"])
    keys = {}
    for name in names:
        _, output = exec_in(client, container_name(lab, name), ["sha256sum", "/etc/munge/munge.key"])
        keys[name] = output.split()[0] if output.split() and len(output.split()[0]) == 64 else "missing"
    return code == 0, node_states(client, lab), keys


def check(lab: str, controller_ok: bool, states: dict[str, str], keys: dict[str, str], names: list[str]) -> list:
    """doctor's Slurm findings (pure): the controller answers, every node is usable, one munge key."""
    fix = f"`labctl up --lab {lab}` starts a node's stopped daemons again (and a stopped node)"
    if not controller_ok:
        return [Finding("slurm", CONTROLLER, False, f"slurmctld on {CONTROLLER} does not answer (scontrol ping)", fix)]
    out = []
    for name in names:
        state = states.get(name, "not registered")
        if state.rstrip("*~#") not in ("idle", "allocated", "alloc", "mixed", "mix", "completing", "comp"):
            out.append(Finding("slurm", name, False, f"Slurm has {name} {state}: jobs cannot use it",
                               f"{fix}; or `labctl exec --lab {lab} node0 -- scontrol update nodename={name} state=resume`"))
        if keys.get(name) != keys.get(CONTROLLER):
            out.append(Finding("slurm", name, False, f"{name}'s munge key differs from {CONTROLLER}'s: their "
                               "credentials will not verify", f"`labctl down --lab {lab}` then `labctl up` (one key per lab)"))
    return out or [Finding("slurm", "all", True, f"slurmctld up on {CONTROLLER}, {len(names)} nodes usable, one munge key")]
