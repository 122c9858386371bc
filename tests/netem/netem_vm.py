"""Run labctl's netem code paths on a real netem kernel: Debian's stock kernel booted under QEMU.

Why: the machines this project is developed and tested on run kernels without sch_netem, so the
tc programs labctl builds for --delay, --jitter and --loss had never been run. Debian's stock
kernel has sch_netem as a module and boots under QEMU's software emulation (TCG) in a few seconds.

Design:
- build-vm.sh (host, cached under <cache>/netem-vm/<kernel version>/) downloads the kernel package
  once and builds a base initramfs: static busybox, this host's tc, ip and iperf3 with their
  libraries, and the modules (veth, ifb, tbf, ingress, u32, mirred; sch_netem kept apart).
- For each run, this module renders the tc programs with labctl's own builders
  (`build_apply`, `build_clear`, `build_netem_probe`) through labctl's own renderer
  (`labctl.net.apply.helper_script`, the very script labctl runs in a node's namespace) into
  /plan, and appends it with guest/init.sh and guest/run.sh as a second cpio archive, which the
  kernel unpacks on top of the base. Nothing of tc is retyped here: CASES holds Shapes.
- In the VM (guest/run.sh): two network namespaces, A and B, joined by a veth pair (eth0 in
  each, as in a lab's containers). labctl's netem probe runs before sch_netem is loaded (module
  autoloading is off, so this is a kernel without netem) and after `insmod sch_netem`. Then each
  case shapes both nodes, as `labctl shape` shapes every node, reads the qdiscs back, and measures
  from A to B: ping round trips, iperf3 UDP datagram loss, iperf3 TCP throughput.
- Output is framed blocks on the serial console; parse() and summarize() turn them into numbers.
  One boot serves every case.

From the command line (after `make netem-vm`):
    python tests/netem/netem_vm.py prepare
    python tests/netem/netem_vm.py run --runs 5     # one JSON summary per run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from labctl.net.apply import helper_script  # noqa: E402
from labctl.net.routes import Route, build_node  # noqa: E402
from labctl.net.tc import Shape, build_apply, build_clear, build_netem_probe  # noqa: E402

IFACE = "eth0"  # labctl's default interface, and the veth ends' name in the VM
IFB = "ifb0"
QEMU = "qemu-system-x86_64"
QEMU_TIMEOUT_S = 600  # a hang guard: `make test` runs the VM at idle priority, beside other tests (its own clock)
# The guest's clock counts instructions (4 ns each) and skips ahead when the guest idles
# (`-icount shift=2,sleep=off`). netem and tbf schedule against that clock, so what the guest
# measures depends only on what it ran, not on how fast or how busy the host was: with the wall
# clock, the host's stalls showed up as timer slack (medians 1 to 4 ms over a 20 ms delay on a
# slower or busier machine, against 0.4 to 1 ms where the tolerances had been set), and the
# suite failed where nothing of labctl had changed.
QEMU_CLOCK = ("-icount", "shift=2,sleep=off")
MAKE_HINT = "run `make netem-vm` first (it installs QEMU, cpio, busybox-static and iperf3 and prepares the VM)"
GBIT = 1_000_000_000


@dataclass(frozen=True)
class Case:
    """One shaping, applied to the nodes in `shaped` (the others are cleared), then one measure:
    ("ping", COUNT, INTERVAL_S), ("udp", SECONDS, BITRATE, PAYLOAD_BYTES) or ("tcp", SECONDS)."""

    name: str
    shape: Shape | None
    measure: tuple[str, ...]
    shaped: str = "AB"
    rtt_ms: float | None = None  # the round trip netem should add: test_netem_kernel checks every case that has one
    route: Shape | None = None  # instead of `shape`: each node's link to the other only (`labctl shape --to`)


# Every case shapes both ends (as labctl shapes every node): a delay D on each end's egress adds 2*D
# to a round trip on top of the emulator's own, 4*D with --ingress. A case is one line; names are
# [a-z0-9-]. Once Shape.rate_bps is optional, a delay-only case is:
#     Case("delay-only", Shape(delay_us=10_000), PING, rtt_ms=20.0),
PING = ("ping", "100", "0.02")
CASES: tuple[Case, ...] = (
    Case("base", None, PING),                                                           # labctl's clear
    Case("delay", Shape(delay_us=10_000), PING, rtt_ms=20.0),                            # netem at the root
    Case("delay-under-tbf", Shape(rate_bps=GBIT, delay_us=10_000), PING, rtt_ms=20.0),   # netem under tbf
    Case("jitter", Shape(delay_us=10_000, jitter_us=5_000), ("ping", "400", "0.02")),
    Case("ingress", Shape(delay_us=5_000, ingress=True), PING, rtt_ms=20.0),
    Case("loss", Shape(loss_pct=1.0), ("udp", "5", "2M", "100")),                        # 2,500 datagrams/s
    Case("tcp-base", None, ("tcp", "3")),
    Case("rate", Shape(rate_bps=100_000_000, delay_us=5_000), ("tcp", "5")),
    # links between groups: netem under an htb class that a u32 filter on the peer's address feeds
    Case("route-delay", None, PING, rtt_ms=20.0, route=Shape(rate_bps=GBIT, delay_us=10_000)),
)
ADDRESSES = {"A": "10.0.0.1", "B": "10.0.0.2"}  # guest/run.sh gives the namespaces these


# ------------------------------------------------------------------------------- preparing

def cache_root() -> Path:
    from labctl.core.assets import cache_dir

    return cache_dir(os.environ.get("DDPLAB_CACHE_DIR", "")) / "netem-vm"


@dataclass(frozen=True)
class Vm:
    kernel: Path
    base_initrd: Path
    version: str


def prepare(root: Path | None = None) -> Vm:
    """The kernel and the base initramfs, built once per kernel version (build-vm.sh)."""
    missing = [tool for tool in (QEMU, "cpio", "busybox", "iperf3", "tc", "ip", "apt-get") if not shutil.which(tool)]
    if missing:
        raise RuntimeError(f"the netem VM needs {', '.join(missing)}: {MAKE_HINT}")
    result = subprocess.run(["bash", str(HERE / "build-vm.sh"), str(root or cache_root())], capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"build-vm.sh failed ({MAKE_HINT}):\n{result.stderr.strip()}")
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return Vm(Path(values["KERNEL"]), Path(values["BASE_INITRD"]), values["VERSION"])


def node_commands(case: Case, node: str) -> list:
    """What labctl runs in `node`'s namespace for `case`: its shape, its route to the other node, or a clear."""
    if case.route and node in case.shaped:
        peer = ADDRESSES["B" if node == "A" else "A"]
        return build_node(None, [Route((peer,), case.route)], IFACE, IFB)
    if case.shape and node in case.shaped:
        return build_apply(case.shape, IFACE, IFB)
    return build_clear(IFACE, IFB)


def render_plan(plan: Path, cases: tuple[Case, ...] = CASES) -> None:
    """/plan: labctl's probe and, per case and node, labctl's apply (or clear) script."""
    plan.mkdir(parents=True)
    (plan / "probe.sh").write_text(helper_script(build_netem_probe()))
    lines = []
    for case in cases:
        if not re.fullmatch(r"[a-z0-9-]+", case.name):
            raise ValueError(f"case name {case.name!r}: use [a-z0-9-]")
        for node in "AB":
            (plan / f"{case.name}.{node}.sh").write_text(helper_script(node_commands(case, node)))
        lines.append(" ".join((case.name, *case.measure)))
    (plan / "cases").write_text("\n".join(lines) + "\n")


def _initrd(vm: Vm, work: Path, cases: tuple[Case, ...]) -> Path:
    """The base archive with a second one appended: /init, /guest/run.sh and /plan."""
    overlay = work / "overlay"
    (overlay / "guest").mkdir(parents=True)
    shutil.copy(HERE / "guest" / "init.sh", overlay / "init")
    shutil.copy(HERE / "guest" / "run.sh", overlay / "guest" / "run.sh")
    (overlay / "init").chmod(0o755)
    render_plan(overlay / "plan", cases)
    names = sorted(str(path.relative_to(overlay)) for path in overlay.rglob("*"))
    archive = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=overlay,
                             input=("\n".join(names) + "\n").encode(), capture_output=True, check=True).stdout
    initrd = work / "initrd"
    base = vm.base_initrd.read_bytes()
    initrd.write_bytes(base + b"\0" * (-len(base) % 4) + archive)
    return initrd


# ---------------------------------------------------------------------------------- running

@dataclass
class Block:
    name: str
    kind: str
    text: str
    rc: int
    started: float  # guest uptime, seconds
    ended: float


@dataclass
class VmRun:
    console: str
    wall_s: float
    blocks: dict[tuple[str, str], Block] = field(default_factory=dict)
    done: bool = False
    errors: list[str] = field(default_factory=list)

    def block(self, name: str, kind: str) -> Block:
        try:
            return self.blocks[name, kind]
        except KeyError:
            raise AssertionError(f"the VM printed no {kind} block for {name}; console tail:\n"
                                 f"{self.console[-3000:]}") from None


# Searched, not matched from the start: the console's first line carries the firmware's escape codes.
_BEGIN = re.compile(r"@@netem-begin (\S+) (\S+) uptime=([\d.]+)$")
_END = re.compile(r"@@netem-end (\S+) (\S+) rc=(\d+) uptime=([\d.]+)$")


def parse(console: str, wall_s: float = 0.0) -> VmRun:
    run = VmRun(console, wall_s)
    current, lines, started = None, [], 0.0
    for raw in console.splitlines():
        line = raw.rstrip("\r")
        if begin := _BEGIN.search(line):
            current, lines, started = (begin[1], begin[2]), [], float(begin[3])
        elif (end := _END.search(line)) and current == (end[1], end[2]):
            run.blocks[current] = Block(end[1], end[2], "\n".join(lines), int(end[3]), started, float(end[4]))
            current = None
        elif "@@netem-done" in line:
            run.done = True
        elif "@@netem-error" in line:
            run.errors.append(line[line.index("@@netem-error"):])
        elif current:
            lines.append(line)
    return run


def boot(vm: Vm, cases: tuple[Case, ...] = CASES, timeout_s: float = QEMU_TIMEOUT_S) -> VmRun:
    """One boot: every case, in order. TCG (software emulation): nested KVM is not to be relied on.
    The guest's clock is QEMU_CLOCK: its times are the guest's own, whatever the host's speed."""
    if not shutil.which(QEMU):
        raise RuntimeError(f"{QEMU} is missing: {MAKE_HINT}")
    with tempfile.TemporaryDirectory(prefix="netem-vm-") as tmp:
        initrd = _initrd(vm, Path(tmp), cases)
        argv = [QEMU, "-accel", "tcg", *QEMU_CLOCK, "-m", "512", "-smp", "1", "-nographic", "-no-reboot",
                "-kernel", str(vm.kernel), "-initrd", str(initrd),
                "-append", "console=ttyS0 panic=-1 quiet loglevel=1"]
        start = time.monotonic()
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode(errors="replace")
            raise AssertionError(f"the VM ran past {timeout_s} s; console tail:\n{output[-3000:]}") from None
        wall = time.monotonic() - start
    console = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    run = parse(console, wall)
    if not run.done:
        raise AssertionError(f"the VM stopped before its end (qemu exit {result.returncode}); console tail:\n"
                             f"{console[-3000:]}")
    return run


# --------------------------------------------------------------------------------- numbers

_PING_TIME = re.compile(r"seq=(\d+) ttl=\d+ time=([\d.]+) ms")
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) packets received")


def ping_rtts_ms(text: str) -> list[float]:
    return [float(match[2]) for match in _PING_TIME.finditer(text)]


def ping_counts(text: str) -> tuple[int, int]:
    match = _PING_SUMMARY.search(text)
    if not match:
        raise AssertionError(f"no ping summary in:\n{text[-2000:]}")
    return int(match[1]), int(match[2])


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def distribution(samples: list[float]) -> dict[str, float]:
    values = sorted(samples)
    if not values:
        raise AssertionError("no samples")
    return {"n": len(values), "min": values[0], "p10": quantile(values, 0.1), "median": quantile(values, 0.5),
            "p90": quantile(values, 0.9), "max": values[-1], "mean": statistics.fmean(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def _iperf(text: str) -> dict:
    start = text.find("{")
    if start < 0:
        raise AssertionError(f"no iperf3 JSON in:\n{text[-2000:]}")
    data = json.loads(text[start:text.rfind("}") + 1])
    if data.get("error"):
        raise AssertionError(f"iperf3: {data['error']}")
    return data


def udp_loss(text: str) -> tuple[int, int]:
    """(datagrams sent, datagrams lost), as iperf3's receiver counted them."""
    total = _iperf(text)["end"]["sum"]
    return int(total["packets"]), int(total["lost_packets"])


def tcp_received_bps(text: str) -> float:
    return float(_iperf(text)["end"]["sum_received"]["bits_per_second"])


def summarize(run: VmRun, cases: tuple[Case, ...] = CASES) -> dict:
    """Per case: the numbers measured (ms for round trips, bit/s for throughput)."""
    boot_s = run.block("setup", "setup").started
    last = max(block.ended for block in run.blocks.values())
    out: dict = {"wall_s": round(run.wall_s, 2), "guest_boot_s": boot_s, "guest_run_s": round(last - boot_s, 2)}
    for case in cases:
        block = run.block(case.name, case.measure[0])
        if case.measure[0] == "ping":
            sent, received = ping_counts(block.text)
            out[case.name] = {**{k: round(v, 3) for k, v in distribution(ping_rtts_ms(block.text)).items()},
                              "sent": sent, "received": received}
        elif case.measure[0] == "udp":
            sent, lost = udp_loss(block.text)
            out[case.name] = {"sent": sent, "lost": lost, "loss_pct": round(100 * lost / sent, 3)}
        elif case.measure[0] == "tcp":
            out[case.name] = {"mbit_s": round(tcp_received_bps(block.text) / 1e6, 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "run"])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--console", type=Path, help="with run: write each run's console to this folder")
    args = parser.parse_args(argv)
    try:
        vm = prepare()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"[netem-vm] kernel {vm.version}: {vm.kernel}, {vm.base_initrd}", file=sys.stderr)
    if args.action == "run":
        for index in range(args.runs):
            run = boot(vm)
            if args.console:
                args.console.mkdir(parents=True, exist_ok=True)
                (args.console / f"console-{index}.txt").write_text(run.console)
            print(json.dumps(summarize(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
