"""Fault injection: what goes wrong with real nodes, on demand.

  kill       node loss: the container is killed (SIGKILL), as a machine that loses power
  crash      the training processes on the node die (SIGKILL), the node and its torchrun agent stay up
  pause      the node freezes (cgroup freezer): alive to the network, silent to its peers
  unpause    it thaws
  partition  the node's link goes down: its peers' packets get no answer (no reset either)
  heal       the link comes back, with the routes and permanent neighbour entries it had

partition and heal run `ip` from a short-lived helper container in the node's network namespace
with NET_ADMIN, as shaping does; the node itself has no added capability.
"""

from __future__ import annotations

import time

from labctl import remote
from labctl.engine.docker import exec_in
from labctl.engine.labels import container_name, network_name
from labctl.errors import LabError, StateError
from labctl.lab.lifecycle import lab_status
from labctl.net.apply import run_helper
from labctl.net.neighbors import build_neighbors
from labctl.net.tc import Command

FAULTS = ("kill", "crash", "pause", "unpause", "partition", "heal")

# cgroup v1's freezer gives up when a task is still FREEZING after runc's own retries (a process
# forking or in the kernel as the freeze lands, common on a loaded machine); runc thaws the node and
# answers "unable to freeze". Trying again is the known remedy (runc#2791, apptainer#345).
FREEZE_TRIES = 5
FREEZE_PAUSE_S = 0.5

# SIGKILLs the training processes of a labctl run (DDPLAB_RUN_ID and LOCAL_RANK in their
# environment), not the agent; prints how many. `python -c TEXT` in the node.
CRASH_SCRIPT = remote.load("crash.py")


def _container(client, lab: str, node: str):
    import docker.errors

    try:
        return client.containers.get(container_name(lab, node))
    except docker.errors.NotFound:
        raise LabError(f"no node {node!r} in lab {lab}", hint="`labctl status` lists the nodes") from None


def freeze(container, node: str, tries: int = FREEZE_TRIES, pause_s: float = FREEZE_PAUSE_S) -> None:
    """Pause the container, trying again while the cgroup freezer is merely busy."""
    import docker.errors

    for attempt in range(1, tries + 1):
        try:
            container.pause()
            return
        except docker.errors.APIError as exc:
            if "unable to freeze" not in str(exc):
                raise
            if attempt == tries:
                raise StateError(f"{node} would not freeze: the cgroup freezer stayed busy through {tries} tries",
                                 hint="a node forking or in heavy I/O resists the freezer; try again, "
                                      "or pause it when it is quieter") from None
            time.sleep(pause_s * attempt)


def partition_commands(iface: str) -> list[Command]:
    return [Command(("ip", "link", "set", "dev", iface, "down"))]


def heal_commands(iface: str, gateway: str | None) -> list[Command]:
    commands = [Command(("ip", "link", "set", "dev", iface, "up"))]
    if gateway:
        # Taking the link down dropped the default route with it; the subnet's route comes back by itself.
        commands.append(Command(("ip", "route", "replace", "default", "via", gateway, "dev", iface)))
    return commands


def inject(client, lab: str, node: str, fault: str, iface: str) -> str:
    """Apply one fault; a sentence saying what happened."""
    container = _container(client, lab, node)
    state = container.attrs["State"]
    if fault == "kill":
        if not state["Running"]:
            return f"{node} is already down ({state['Status']})"
        container.kill()
        return f"{node} killed: the node is lost (`labctl up --lab {lab}` brings it back)"
    if fault == "unpause":
        if not state["Paused"]:
            return f"{node} is not paused"
        container.unpause()
        return f"{node} unpaused"
    if not state["Running"]:
        raise StateError(f"{node} is not running ({state['Status']}), so it cannot {fault}",
                         hint=f"`labctl up --lab {lab}` brings it back")
    if fault == "pause":
        if state["Paused"]:
            return f"{node} is already paused"
        freeze(container, node)
        return f"{node} paused: frozen, its peers wait on it (`labctl fault unpause {node}`)"
    if state["Paused"]:
        raise StateError(f"{node} is paused, so it cannot {fault}", hint=f"labctl fault unpause {node}")
    if fault == "crash":
        code, output = exec_in(client, container.name, ["python", "-c", CRASH_SCRIPT])
        count = output.strip().splitlines()[-1] if output.strip() else "0"
        if code != 0 or count == "0":
            return f"{node}: no training process of a labctl run to crash"
        return f"{node}: {count} training process{'es' * (count != '1')} killed; the node and its torchrun agent are up"
    if fault == "partition":
        code, output = run_helper(client, lab, node, partition_commands(iface))
        verb = "cut off from the other nodes (`labctl fault heal " + node + "`)"
    elif fault == "heal":
        network = (container.attrs["NetworkSettings"]["Networks"] or {}).get(network_name(lab)) or {}
        # Taking the link down flushed the node's neighbour table, permanent entries too.
        addresses = {peer.name: peer.ip for peer in lab_status(client, lab) if peer.ip}
        commands = heal_commands(iface, network.get("Gateway")) + build_neighbors(addresses, node, iface)
        code, output = run_helper(client, lab, node, commands)
        verb = "reconnected"
    else:
        raise LabError(f"unknown fault {fault!r}", hint=f"one of {', '.join(FAULTS)}")
    if code != 0:
        raise StateError(f"{fault} on {node} failed: {output.strip()}")
    return f"{node} {verb}"
