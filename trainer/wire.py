"""What this node's network interfaces sent, from the kernel's link counters: the bytes a strategy
really puts on the wire, beside what `labctl cost` predicts.

The trainer reads /sys/class/net/<iface>/statistics/tx_bytes, summed over every interface but the
loopback, once after step 1 and once after the last step: between the two, a lab node (a network
namespace of its own) sends only what the steps send (the collectives, and the loss every
--log-every steps, a few bytes). The counters count what the kernel sent, headers and TCP's
acknowledgements included: for the gpt's 436 KB of gradients a step on the lab, 0.7 to 1.4% over
what `labctl cost` counts; for small messages far more (the toy's 9.5 KB all-reduce: 27%). On a
machine that does other things, the counters hold its other traffic too. Ranks on one node share
its counters, so the SUMMARY counts each node once.
"""

from __future__ import annotations

from pathlib import Path

NET = Path("/sys/class/net")


def tx_bytes(net: Path = NET) -> int | None:
    """Bytes sent so far by every interface but lo; None where the counters cannot be read."""
    try:
        counters = [p / "statistics" / "tx_bytes" for p in net.iterdir() if p.name != "lo"]
        return sum(int(c.read_text()) for c in counters if c.is_file())
    except (OSError, ValueError):
        return None


def per_node_per_step(sent: list[tuple[str, int | None]], steps: int) -> float | None:
    """The mean over nodes of the bytes one node sent per step: `sent` holds (host, bytes) for every
    rank; ranks on one host share its counters, so each host counts once. None without counters or steps."""
    by_host = {host: count for host, count in sent}
    if steps < 1 or not by_host or any(count is None for count in by_host.values()):
        return None
    return round(sum(by_host.values()) / len(by_host) / steps, 1)
