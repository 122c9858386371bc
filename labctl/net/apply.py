"""Apply link shaping to lab nodes and read it back from the kernel. The side-effect half of
tc.py, which builds the tc commands.

The nodes have no added capabilities. tc runs in a short-lived helper container that joins the
node's network namespace (`--network container:NODE`) with NET_ADMIN, as Pumba does, and is gone
when the commands are done. Reading the shaping back needs no capability: `tc -j qdisc show`
inside the node.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor

from labctl.lab.compose import LABEL_LAB, container_name
from labctl.errors import StateError
from labctl.lab.docker import exec_in
from labctl.net.tc import (
    NETEM_MISSING_MESSAGE, Command, LinkState, Shape, build_apply, build_clear, build_netem_probe, netem_missing,
    parse_link_state,
)

LABEL_ROLE = "io.ddplab.role"


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


def run_helper(client, lab: str, node: str, image: str, commands: list[Command]) -> tuple[int, str]:
    """Run commands as root with NET_ADMIN in the node's network namespace; (exit code, output)."""
    container = client.containers.run(
        image, ["sh", "-c", helper_script(commands)], entrypoint=[], user="0:0", detach=True,
        network_mode=f"container:{container_name(lab, node)}", cap_add=["NET_ADMIN"],
        security_opt=["no-new-privileges"], labels={LABEL_LAB: lab, LABEL_ROLE: "shaper"},
    )
    try:
        code = container.wait(timeout=120)["StatusCode"]
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return code, output


def _node_image(client, lab: str, node: str) -> str:
    return client.containers.get(container_name(lab, node)).image.id


def check_netem(client, lab: str, node: str) -> None:
    code, output = run_helper(client, lab, node, _node_image(client, lab, node), build_netem_probe())
    if code != 0:
        if netem_missing(output):
            raise StateError(NETEM_MISSING_MESSAGE, hint="drop --delay/--jitter/--loss, or run on a kernel with sch_netem")
        raise StateError(f"could not probe for netem on {node}: {output.strip()}")


def apply_shape(client, lab: str, nodes: list[str], shape: Shape, iface: str) -> None:
    """Shape every node in `nodes`, or none: on any failure the nodes are cleared again."""
    if shape.needs_netem:
        check_netem(client, lab, nodes[0])  # a kernel-wide fact: one probe answers for all nodes
    image = _node_image(client, lab, nodes[0])

    def apply(node: str) -> tuple[str, int, str]:
        return (node, *run_helper(client, lab, node, image, build_apply(shape, iface)))

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(apply, nodes))
    failed = [(node, output) for node, code, output in results if code != 0]
    if failed:
        clear_shape(client, lab, nodes, iface)
        node, output = failed[0]
        if netem_missing(output):
            raise StateError(NETEM_MISSING_MESSAGE)
        raise StateError(f"shaping {node} failed, so every node was cleared again (unshaped): {output.strip()}")


def clear_shape(client, lab: str, nodes: list[str], iface: str) -> None:
    image = _node_image(client, lab, nodes[0])
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda node: run_helper(client, lab, node, image, build_clear(iface)), nodes))


def read_link(client, lab: str, node: str, iface: str, ifb: str = "ifb0") -> LinkState:
    """What the kernel applies on the node's interface now (no cache, so it cannot drift)."""
    container = container_name(lab, node)
    _, qdiscs = exec_in(client, container, ["tc", "qdisc", "show", "dev", iface])
    ingress = exec_in(client, container, ["tc", "qdisc", "show", "dev", ifb])[1] if " ingress " in qdiscs else ""
    return parse_link_state(qdiscs, ingress)


def read_links(client, lab: str, nodes: list[str], iface: str) -> dict[str, LinkState]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(nodes, pool.map(lambda node: read_link(client, lab, node, iface), nodes)))


def slowest_link(links: dict[str, LinkState]) -> tuple[str, int] | None:
    """(node, rate) of the slowest shaped link, which sets a ring's pace; None if none is shaped."""
    shaped = [(state.rate_bps, node) for node, state in links.items() if state.rate_bps]
    if not shaped:
        return None
    rate_bps, node = min(shaped)
    return node, rate_bps
