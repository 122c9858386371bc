"""Which TCP congestion control the nodes' sockets use, so a lab measures the same on every host.

A container's network namespace starts with its host's default congestion control. Linux's default
is cubic, but some hosts default to BBR (this project's own machines do), and on a shaped link the
two differ by more than the effects the lab is there to show: at 100mbit, gloo's ring under BBR ran
2 to 9% below the iperf3 wire from 8 MiB up, its iterations of one size spreading by 4 to 13%, and
under cubic it ran at the wire, at every size from 1 MiB to 64 MiB, within 1% from one iteration to
the next (docs/explanation/cost-model.md, "Why the nodes run TCP cubic"). BBR paces each flow at
its own estimate of the bottleneck and cycles its rate above and below it, which a token bucket with
little banked time turns into idle link; a ring pays for every flow that runs short.

So the lab asks Compose for `net.ipv4.tcp_congestion_control` on every node: cubic unless set
otherwise (DDPLAB_TCP_CC, `up --tcp-cc`), or `host` to keep the host's. The kernel lets a network
namespace other than the host's choose only the algorithms in net.ipv4.tcp_allowed_congestion_control,
which by default holds just reno and the host's own default: on a BBR host, cubic must be allowed
first (as root: `sysctl -w net.ipv4.tcp_allowed_congestion_control="reno bbr cubic"`, which the
Makefile's engine set-up does). Asked for explicitly and not allowed, `up` refuses (exit 1); as the
default, the nodes keep the host's algorithm and `up` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labctl.errors import StateError

SYSCTL = "net.ipv4.tcp_congestion_control"
HOST = "host"  # keep the host's default
PROC = Path("/proc/sys/net/ipv4")


@dataclass(frozen=True)
class HostTcp:
    """The engine host's congestion controls, as its /proc says."""

    default: str  # tcp_congestion_control
    allowed: tuple[str, ...]  # tcp_allowed_congestion_control: what a container may choose
    available: tuple[str, ...] = ()  # tcp_available_congestion_control: what the kernel has loaded

    def allow_command(self, name: str) -> str:
        """The sysctl that lets containers choose `name` too (run as root on the engine's host)."""
        allowed = " ".join(dict.fromkeys((*self.allowed, name)))
        return f'sysctl -w net.ipv4.tcp_allowed_congestion_control="{allowed}"'

    def allow_hint(self, name: str) -> str:
        return f"allow it, as root on the engine's host: {self.allow_command(name)}"


def read_host_tcp(local_linux: bool, proc: Path = PROC) -> HostTcp | None:
    """The host's settings where the engine shares this machine's kernel; None where it does not
    (Docker Desktop's VM, a remote engine) or /proc cannot be read: Compose then applies the choice
    and the engine's own error says if it may not."""
    if not local_linux:
        return None
    try:
        default = (proc / "tcp_congestion_control").read_text().strip()
        allowed = tuple((proc / "tcp_allowed_congestion_control").read_text().split())
    except OSError:
        return None
    try:
        available = tuple((proc / "tcp_available_congestion_control").read_text().split())
    except OSError:
        available = ()
    return HostTcp(default, allowed, available)


def plan_tcp_cc(requested: str, explicit: bool, host: HostTcp | None) -> tuple[str | None, str | None]:
    """Pure: (the value the nodes' sysctl gets, None to leave the host's; a note for `up` to print).
    Refuses (exit 1) an algorithm asked for by name that the host does not let containers use."""
    if requested == HOST or host is None:
        return (None if requested == HOST else requested), None
    if requested == host.default or requested in host.allowed:
        return requested, None
    if explicit and host.available and requested not in host.available:
        # The kernel cannot allow what it has not loaded (the sysctl answers ENOENT): load it first.
        raise StateError(f"the engine's host kernel has no TCP congestion control {requested} loaded "
                         f"(it has: {', '.join(host.available)}; tcp_available_congestion_control)",
                         hint=f"where the kernel has it as a module, as root on the engine's host: modprobe "
                              f"tcp_{requested}, then {host.allow_command(requested)}; or choose one it has, or "
                              f"keep the host's {host.default} with --tcp-cc host")
    if explicit:
        raise StateError(f"the nodes cannot use TCP congestion control {requested}: the engine's host lets containers "
                         f"choose only {', '.join(host.allowed)} (net.ipv4.tcp_allowed_congestion_control)",
                         hint=f"{host.allow_hint(requested)}; or keep the host's {host.default} with --tcp-cc host")
    return None, (f"note: the nodes use the host's TCP congestion control, {host.default}, not {requested}: the host "
                  f"lets containers choose only {', '.join(host.allowed)}. Shaped links measure differently under "
                  f"{host.default} (docs/explanation/cost-model.md: Why the nodes run TCP cubic); {host.allow_hint(requested)}, then `labctl up` again")
