"""Apply link shaping to lab nodes and read it back from the kernel. The side-effect half of
tc.py, which builds the tc commands.

The nodes have no added capabilities. tc runs in a helper container that joins the node's network
namespace (`--network container:NODE`) with NET_ADMIN, as Pumba does: one per node, started the
first time the node's network is changed (`up` settles its neighbour table) and kept while the node
runs, so that every later shape, clear or fault is a `docker exec` into it (a 3-node `shape` in
0.46 s where a helper started and removed per call took 0.58 s: docs/explanation/design.md). It
runs only `sleep` between commands, from the node's own image (its tc and ip), carries the lab's
label (`down` and `gc` remove it with the lab) and is started again where its node has been
started since (a restarted node has a new namespace). Reading the shaping back needs no
capability: `tc qdisc show` inside the node.

--duration T: one more helper per node is left running; it sleeps T, clears the link and removes
itself (as Pumba's `netem --duration`, but outliving labctl, which has returned the prompt). It
carries the lab's label, so `labctl down` removes it, and any later shape or clear of that node
removes it first: the newer request wins, never an old timer.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from labctl.engine.docker import exec_in, lab_containers, remove_gone
from labctl.engine.labels import LABEL_LAB, LABEL_NODE, container_name, network_name
from labctl.errors import StateError
from labctl.net.neighbors import build_neighbors
from labctl.net.routes import build_node, is_routed, lab_ring, merge_routes, parse_routed_link, routes_of, shape_of
from labctl.net.tc import (
    NETEM_MISSING_MESSAGE,
    Command,
    LinkState,
    Shape,
    build_clear,
    build_netem_probe,
    build_undo,
    describe_link,
    netem_missing,
    parse_link_state,
)

LABEL_ROLE = "io.ddplab.role"
LABEL_TARGET = "io.ddplab.target"  # the node an undo helper will clear (not io.ddplab.node: that marks a node)
UNDO_ROLE = "shape-undo"
HELPER_ROLE = "nethelper"  # the node's kept helper (node_helper)
LABEL_JOINED = "io.ddplab.joined"  # the node's id and last start the kept helper joined


def helper_script(commands: list[Command]) -> str:
    """One sh script from argv lists: each line shlex-quoted; a failing required step stops it and
    names itself on stderr, a may-fail clean-up step is silenced."""
    lines = []
    for command in commands:
        line = shlex.join(command.argv)
        if command.may_fail:
            lines.append(f"{line} >/dev/null 2>&1 || true")
        else:
            lines.append(f"{line} || {{ echo {shlex.quote('FAILED: ' + line)} >&2; exit 1; }}")
    return "\n".join(lines) + "\n"


def start_helper(client, lab: str, node: str, image: str, argv: list[str], labels: dict, auto_remove: bool = False,
                 name: str | None = None, **more):
    """Start `argv` as root with NET_ADMIN in the node's network namespace, detached: the container,
    labelled with the lab, the node and `labels` (its role). `more`: what else docker's run takes
    (the overlay's helper: its TUN device and environment)."""
    return client.containers.run(
        image, argv, entrypoint=[], user="0:0", detach=True, name=name,
        network_mode=f"container:{container_name(lab, node)}", cap_add=["NET_ADMIN"],
        security_opt=["no-new-privileges"], auto_remove=auto_remove,
        labels={LABEL_LAB: lab, LABEL_TARGET: node, **labels}, **more,
    )


def helper_name(lab: str, node: str, role: str = HELPER_ROLE) -> str:
    """A kept helper's name: not a prefix match for the node's own (`<lab>-node0`)."""
    return f"{lab}-{role}-{node}"


def kept_helper(client, lab: str, node: str, role: str, argv: list[str], image: str | None = None,
                labels: dict | None = None, **more):
    """The node's kept helper of `role`: the one running `image` (default: the node's own) with
    `labels` in the namespace the node has now, else a new one running `argv` (one whose node was
    started after it, or is another container, image or labelling, is replaced). `more` as start_helper."""
    import docker.errors

    target = client.api.inspect_container(container_name(lab, node))
    image = image or target["Image"]
    labels = {LABEL_ROLE: role, LABEL_JOINED: f"{target['Id']}@{target['State']['StartedAt']}",  # since its last start
              **(labels or {})}
    name = helper_name(lab, node, role)
    try:
        helper = client.api.inspect_container(name)
        if helper["State"]["Running"] and helper["Config"]["Image"] == image and all(
                helper["Config"]["Labels"].get(key) == value for key, value in labels.items()):
            return client.containers.prepare_model(helper)
        remove_gone(client, helper["Id"])
    except docker.errors.NotFound:
        pass
    try:
        return start_helper(client, lab, node, image, argv, labels, name=name, **more)
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # else a concurrent command of this lab started it first: use that one
            raise
        return client.containers.get(name)


def node_helper(client, lab: str, node: str):
    """The node's kept network helper, running only `sleep` from the node's own image (its tc and ip)."""
    return kept_helper(client, lab, node, HELPER_ROLE, ["sleep", "infinity"])


def lab_helpers(client, lab: str, role: str) -> list[dict]:
    """The lab's kept helpers of `role`, as the engine lists them."""
    return client.api.containers(all=True, filters={"label": [f"{LABEL_LAB}={lab}", f"{LABEL_ROLE}={role}"]})


def drop_helpers(client, lab: str, role: str = HELPER_ROLE) -> None:
    """Remove the lab's kept helpers (of `role`) before Compose changes its nodes: a helper holds its
    node's network endpoint, so Compose could not replace the lab's network while one lives (`up
    --nodes N` to another subnet failed so: "has active endpoints"). The next change starts them again."""
    for helper in lab_helpers(client, lab, role):
        remove_gone(client, helper["Id"])


def run_helper(client, lab: str, node: str, commands: list[Command]) -> tuple[int, str]:
    """Run commands as root with NET_ADMIN in the node's network namespace; (exit code, output)."""
    code, output = node_helper(client, lab, node).exec_run(["sh", "-c", helper_script(commands)], user="0:0")
    return code, output.decode(errors="replace")


def node_image(client, lab: str, node: str) -> str:
    """The image a node runs: helpers run it too, so they have the node's tc and ip."""
    return client.containers.get(container_name(lab, node)).image.id


def run_on_nodes(client, lab: str, nodes: list[str],
                 commands: Callable[[str], list[Command]]) -> list[tuple[str, int, str]]:
    """`commands(node)` run in each node's namespace from its helper container, all at once:
    (node, exit code, output) in the order of `nodes`."""

    def one(node: str) -> tuple[str, int, str]:
        return (node, *run_helper(client, lab, node, commands(node)))

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, nodes))


def check_netem(client, lab: str, node: str) -> None:
    code, output = run_helper(client, lab, node, build_netem_probe())
    if code != 0:
        if netem_missing(output):
            raise StateError(NETEM_MISSING_MESSAGE, hint="drop --delay/--jitter/--loss, or run on a kernel with sch_netem")
        raise StateError(f"could not probe for netem on {node}: {output.strip()}")


def pending_undos(client, lab: str) -> list[dict]:
    """The lab's --duration helpers still waiting, as the engine lists them."""
    return client.api.containers(all=True, filters={"label": [f"{LABEL_LAB}={lab}", f"{LABEL_ROLE}={UNDO_ROLE}"]})


def cancel_undos(client, lab: str, nodes: list[str]) -> None:
    """Remove the pending --duration undo of each of `nodes`: a newer shape or clear replaces it (one
    that has just fired is gone, or removing itself)."""
    for container in pending_undos(client, lab):
        if (container.get("Labels") or {}).get(LABEL_TARGET) in nodes:
            remove_gone(client, container["Id"])


def schedule_undo(client, lab: str, nodes: list[str], image: str, iface: str, duration_s: int) -> None:
    """One helper per node, left running: it sleeps `duration_s`, clears the link, removes itself."""
    for node in nodes:
        start_helper(client, lab, node, image, ["sh", "-c", helper_script(build_undo(duration_s, iface))],
                     {LABEL_ROLE: UNDO_ROLE}, auto_remove=True)


def apply_shape(client, lab: str, nodes: list[str], shape: Shape, iface: str, duration_s: int | None = None) -> None:
    """Shape every node in `nodes`, or none: on any failure the nodes are cleared again. With
    `duration_s`, the shape is undone that long after (see the module's docstring). A node's links
    to groups of nodes (`shape --to`) stay as they were."""
    if shape.needs_netem:
        check_netem(client, lab, nodes[0])  # a kernel-wide fact: one probe answers for all nodes
    cancel_undos(client, lab, nodes)
    kept = {node: routes_of(state) for node, state in read_links(client, lab, nodes, iface).items()}
    results = run_on_nodes(client, lab, nodes, lambda node: build_node(shape, kept[node], iface))
    failed = [(node, output) for node, code, output in results if code != 0]
    if failed:
        clear_shape(client, lab, nodes, iface)
        node, output = failed[0]
        if netem_missing(output):
            raise StateError(NETEM_MISSING_MESSAGE)
        raise StateError(f"shaping {node} failed, so every node was cleared again (unshaped): {output.strip()}")
    if duration_s:
        try:
            schedule_undo(client, lab, nodes, node_image(client, lab, nodes[0]), iface, duration_s)
        except Exception as exc:  # noqa: BLE001 -- an engine error: no timed shape without its undo
            clear_shape(client, lab, nodes, iface)
            raise StateError(f"could not start the helper that undoes the shape after {duration_s}s, so every node "
                             f"was cleared again (unshaped): {exc}") from None


def plan_routes(links: dict[str, LinkState], addresses: dict[str, str], to: list[str],
                shape: Shape | None, iface: str) -> dict[str, list[Command]]:
    """The commands that give each node in `links` (as read back) `shape` toward the nodes `to` (None:
    clear those links), the rest of its link as it was. `addresses`: node name -> IP."""
    dsts = tuple(addresses[node] for node in to)
    return {node: build_node(shape_of(state), merge_routes(routes_of(state), dsts, shape), iface)
            for node, state in links.items()}


def apply_routes(client, lab: str, nodes: list[str], to: list[str], shape: Shape | None, iface: str) -> None:
    """Shape what each of `nodes` sends to the nodes `to` (None: clear those links), every node or
    none: on a failure, each is put back as it was."""
    if shape is not None and shape.needs_netem:
        check_netem(client, lab, nodes[0])
    before = read_links(client, lab, nodes, iface)
    plans = plan_routes(before, node_addresses(client, lab), to, shape, iface)
    results = run_on_nodes(client, lab, nodes, plans.__getitem__)
    failed = [(node, output) for node, code, output in results if code != 0]
    if failed:
        run_on_nodes(client, lab, nodes, lambda node: build_node(shape_of(before[node]), routes_of(before[node]), iface))
        node, output = failed[0]
        raise StateError(f"shaping {node}'s link to {', '.join(to)} failed, so every node was put back as it was: "
                         f"{output.strip()}")


def node_addresses(client, lab: str) -> dict[str, str]:
    """node name -> its IPv4 address on the lab's network, as the engine lists them (one call)."""
    net = network_name(lab)
    addresses = {}
    for container in lab_containers(client, lab):
        node = (container.get("Labels") or {}).get(LABEL_NODE)
        ip = (((container.get("NetworkSettings") or {}).get("Networks") or {}).get(net) or {}).get("IPAddress")
        if node and ip:
            addresses[node] = ip
    return addresses


def settle_neighbors(client, lab: str, addresses: dict[str, str], iface: str) -> None:
    """Give every node in `addresses` (node name to IP) a permanent neighbour entry for each peer
    (labctl.net.neighbors): no ARP is left for a run's full mesh to wait on."""
    if len(addresses) < 2:
        return
    results = run_on_nodes(client, lab, list(addresses), lambda node: build_neighbors(addresses, node, iface))
    failed = [(node, output) for node, code, output in results if code != 0]
    if failed:
        node, output = failed[0]
        raise StateError(f"could not settle {node}'s neighbour table: {output.strip()}",
                         hint=f"`labctl up --lab {lab}` settles every node's table again")


def clear_shape(client, lab: str, nodes: list[str], iface: str) -> None:
    cancel_undos(client, lab, nodes)
    run_on_nodes(client, lab, nodes, lambda _node: build_clear(iface))


def read_link(client, lab: str, node: str, iface: str, ifb: str = "ifb0") -> LinkState:
    """What the kernel applies on the node's interface now (no cache, so it cannot drift)."""
    container = container_name(lab, node)
    _, qdiscs = exec_in(client, container, ["tc", "qdisc", "show", "dev", iface])
    ingress = exec_in(client, container, ["tc", "qdisc", "show", "dev", ifb])[1] if " ingress " in qdiscs else ""
    if is_routed(qdiscs):
        classes = exec_in(client, container, ["tc", "class", "show", "dev", iface])[1]
        filters = exec_in(client, container, ["tc", "filter", "show", "dev", iface])[1]
        return parse_routed_link(qdiscs, classes, filters, ingress)
    return parse_link_state(qdiscs, ingress)


def link_text(client, lab: str, node: str) -> str:
    """A node's bridge link as `labctl ls` shows it, read back now (describe_link of its eth0)."""
    return describe_link(read_link(client, lab, node, "eth0"))


def read_links(client, lab: str, nodes: list[str], iface: str) -> dict[str, LinkState]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(nodes, pool.map(lambda node: read_link(client, lab, node, iface), nodes)))


def slowest_link(links: dict[str, LinkState], addresses: dict[str, str] | None = None,
                 steps: tuple[int, ...] = (-1,)) -> tuple[str, str, int] | None:
    """(sender, receiver, rate) of the slowest shaped hop of the rings that turn `steps` (routes.RING_STEP:
    -1 for gloo's all-reduce), the nodes in the order of `links`: it sets a ring's pace; None if no
    hop is shaped. Without `addresses` (name -> IP), links to groups of nodes are not seen."""
    shaped = [(hop.rate_bps, hop.sender, hop.receiver) for hop in lab_ring(links, addresses or {}, steps) if hop.rate_bps]
    if not shaped:
        return None
    rate_bps, sender, receiver = min(shaped)
    return sender, receiver, rate_bps
