"""`labctl bench allreduce`: an nccl-tests-style sweep across the lab, the raw wire measured with
iperf3, and the ring cost model beside every row, twice:

- the paper model, as `labctl cost` computes it for links on paper: the shaped rate at
  --efficiency (85% by default), and per hop 50 us plus the links' configured netem delay, added;
- the calibrated model, from what this lab measured. Its rate (beta) is the iperf3 wire at 100%:
  iperf3 already saw what TCP gets through tbf. Its latency has two parts. The links' configured
  delay d is paid on each of the ring's 2(n-1) steps and never hides (a step cannot start before
  its data has arrived). The stack's own latency b (waking processes, syscalls: 1 ms a step and
  more on two shared cores) comes from a latency probe, a 1 KiB allreduce timed PROBE_ITERS times
  before the sweep: its median less its bytes at the wire's rate and less 2(n-1) x d, over the
  2(n-1) steps. A pipelined ring hides that overhead behind the transfer of a large message (its
  processes are busy, not asleep), so it counts only while it is the longer:

      t = 2(n-1) x d + max(2(n-1) x b, 2(n-1)/n x S x 8 / wire)

Pure: `calibrate` and `build_rows` turn the trainer's timings into the table. Side effects:
`measure_wire` (iperf3 between two nodes), `run_sweep` (torchrun on every node through the
runner), and `measure`, which is the whole benchmark on a running lab.
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from labctl.bench.cost import DEFAULT_ALPHA_S, DEFAULT_EFFICIENCY, OPS, Link, op_cost, op_time_s
from labctl.bench.tunnelcost import save_rate
from labctl.core.outfile import is_stdout, save_figure
from labctl.core.plotting import pyplot, require_matplotlib
from labctl.engine.docker import exec_in
from labctl.engine.labels import container_name
from labctl.errors import ConfigError, LabError, StateError
from labctl.net import apply as netshape
from labctl.net.overlay import Overlay
from labctl.net.routes import RING_STEP, lab_ring
from labctl.run.plan import RunOptions, RunPlan
from labctl.session import LabSession
from labctl.spec.units import format_rate

IPERF_PORT = "5201"
IPERF_SECONDS = 3
PROBE_SIZE = 1024  # bytes: the latency probe; it fits TCP's initial window and any tbf bucket
PROBE_ITERS = 101  # its timed iterations (the sweep's --iters is for the sizes asked for)
# A size whose --iters took less than this gets more, up to PROBE_ITERS: a small message's time is
# mostly the machine's noise (single 1 KiB allreduces took 1 to 15 ms on two shared cores). With 5
# samples, 64 KiB gave medians from 1.4 to 4.1 ms; with 21, the probe's median gave b from 0.85 to
# 1.27 ms; with 101 in 0.5 s, 0.83 and 0.84 ms in two runs side by side, and 0.86 to 1.04 ms over
# six sweeps a day later (docs/explanation/cost-model.md: The calibrated model).
SMALL_BUDGET_S = 0.5
# Calls are timed back to back, as many a sample as fill FILL_MS (the trainer's --fill-ms), as
# nccl-tests times its iterations in one loop. One call a sample started each on a link idle since
# the barrier, and tbf's full 128 KiB bucket let its first bytes through unpaced: at 1gbit a 1 MiB
# all-gather read 0.87 and 0.88 of the calibrated model, back to back 0.99 and 0.99, side by side
# (docs/explanation/cost-model.md: a shaped link's queue).
FILL_MS = 30


@dataclass(frozen=True)
class AllreduceRow:
    size: int
    count: int
    type: str
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    model_us: float | None
    meas_over_model: float | None
    busbw_over_wire: float | None
    calibrated_us: float | None = None
    meas_over_calibrated: float | None = None
    backend: str = "gloo"  # what was measured: the trainer's backend and the tensors' device
    device: str = "cpu"
    op: str = "all_reduce"  # OPS: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all

    def as_dict(self) -> dict:
        return asdict(self)


def model_link(shaped_rate_bps: int | None, wire_bps: float | None, delay_s: float = 0.0) -> Link | None:
    """The link the paper model assumes: the slowest shaped rate (a ring runs at its slowest hop),
    else the measured wire of an unshaped lab; per hop the typical 50 us plus the configured delay."""
    if shaped_rate_bps:
        return Link(float(shaped_rate_bps), DEFAULT_ALPHA_S, delay_s, name="shaped")
    if wire_bps:
        return Link(float(wire_bps), DEFAULT_ALPHA_S, delay_s, name="wire")
    return None


@dataclass(frozen=True)
class Calibration:
    """The calibrated model (see the module's docstring): the wire, the stack's latency a step, and
    the links' configured delay a step."""

    wire_bps: float
    base_s: float
    delay_s: float = 0.0
    copy_rates: tuple[tuple[int, float], ...] = ()  # (size, bytes/s) of a copy into a fresh buffer, every rank at once

    def copy_s(self, payload_bytes: float) -> float:
        """A copy of `payload_bytes` at the rate probed at the nearest size (on a log scale); 0 unprobed."""
        if not self.copy_rates:
            return 0.0
        _, rate = min(self.copy_rates, key=lambda sr: abs(math.log(sr[0] / max(payload_bytes, 1))))
        return payload_bytes / rate

    def time_s(self, payload_bytes: float, n: int, op: str = "all_reduce", backend: str = "gloo") -> float:
        """The op's time: its algorithm's steps (op_cost's hops) each paying the delay, and the
        longer of their stack latency and its bytes through the busiest NIC at the wire's rate (the
        step model's Link.op_s, the one formula); plus the backend's copies in memory (op_cost's
        copies) at the probed copy rate, where probed."""
        link = Link(self.wire_bps, self.base_s, self.delay_s)
        return link.op_s(op, payload_bytes, n, backend) + op_cost(op, n, backend).copies * self.copy_s(payload_bytes)


def calibrate(timings: list[dict], n: int, wire_bps: float | None, delay_s: float = 0.0) -> Calibration | None:
    """The calibrated model from the sweep's latency probe (the row marked "probe"), the iperf3 wire
    and the configured delay; None without a probe, a wire, or a ring."""
    probe = next((t for t in timings if t.get("probe") and t.get("op", "all_reduce") == "all_reduce"), None)
    copies = tuple((t["size"], t["size"] / (t["time_us"] / 1e6)) for t in timings
                   if t.get("probe") and t.get("op") == "copy" and t["time_us"] > 0)
    if not wire_bps or probe is None or n < 2:
        return None
    steps = 2 * (n - 1)
    transfer_s = op_cost("all_reduce", n).wire * probe["size"] * 8 / wire_bps
    base_s = max(0.0, probe["time_us"] / 1e6 - transfer_s - steps * delay_s) / steps
    return Calibration(float(wire_bps), base_s, delay_s, copies)


def build_rows(timings: list[dict], n: int, link: Link | None, wire_bps: float | None,
               efficiency: float = DEFAULT_EFFICIENCY, calibrated: Calibration | None = None) -> list[AllreduceRow]:
    rows = []
    for t in timings:
        op, backend = t.get("op", "all_reduce"), t.get("backend", "gloo")
        cost = op_cost(op, n, backend)
        seconds = t["time_us"] / 1e6
        algbw = t["size"] / seconds / 1e9
        busbw = algbw * cost.busbw
        model_us = op_time_s(t["size"], n, link, efficiency, op, backend) * 1e6 if link else None
        cal_us = calibrated.time_s(t["size"], n, op, backend) * 1e6 if calibrated else None
        rows.append(AllreduceRow(
            size=t["size"], count=t["count"], type=t.get("type", "float"), time_us=t["time_us"],
            algbw_gbs=algbw, busbw_gbs=busbw, model_us=model_us,
            meas_over_model=t["time_us"] / model_us if model_us else None,
            busbw_over_wire=busbw * 1e9 * 8 / wire_bps if wire_bps else None,
            calibrated_us=cal_us, meas_over_calibrated=t["time_us"] / cal_us if cal_us else None,
            backend=backend, device=t.get("device", "cpu"), op=op,
        ))
    return rows


# ------------------------------------------------------------------------------ side effects


def start_server(client, lab: str, node: str) -> None:
    """An iperf3 server on `node` for one test, listening once this returns."""
    server = container_name(lab, node)
    exec_id = client.api.exec_create(server, ["iperf3", "-s", "-1", "-p", IPERF_PORT])["Id"]
    client.api.exec_start(exec_id, detach=True)
    deadline = time.monotonic() + 10
    while f":{IPERF_PORT}" not in exec_in(client, server, ["ss", "-Hltn"])[1]:
        if time.monotonic() > deadline:
            raise LabError(f"iperf3 server on {node} did not start")
        time.sleep(0.05)


def client_rate(client, lab: str, client_node: str, server_node: str, server_ip: str) -> float:
    """iperf3 from client_node to the server start_server started on server_node: bits/s received."""
    argv = ["iperf3", "-c", server_ip, "-p", IPERF_PORT, "-t", str(IPERF_SECONDS), "-J"]
    try:
        _, output = exec_in(client, container_name(lab, client_node), argv)
    finally:
        # -1 ends the server after one test; if the client never connected, end it here.
        exec_in(client, container_name(lab, server_node), ["pkill", "-f", f"iperf3 -s -1 -p {IPERF_PORT}"])
    try:
        return float(json.loads(output)["end"]["sum_received"]["bits_per_second"])
    except (ValueError, KeyError) as exc:
        raise LabError(f"iperf3 {client_node} -> {server_node} gave no result ({exc}): {output[-300:]}") from None


def measure_wire(client, lab: str, client_node: str, server_node: str, server_ip: str) -> float:
    """Raw TCP throughput client_node -> server_node in bits/s (iperf3, one stream, 3 s)."""
    start_server(client, lab, server_node)
    return client_rate(client, lab, client_node, server_node, server_ip)


def measure_ring_wire(client, lab: str, hops: list[tuple[str, str, str]]) -> float:
    """What each hop of a ring gets when every node sends to the next at once (iperf3 on every
    (sender, receiver, receiver's address) together): the slowest hop's bits/s. Where the links share
    a bottleneck, as an overlay's tunnels share the host's cores (each node encrypting what it sends
    and decrypting what it receives), a ring's hop gets that much, not what one pair alone gets."""
    for _, receiver, _ in hops:
        start_server(client, lab, receiver)
    with ThreadPoolExecutor(max_workers=len(hops)) as pool:
        return min(pool.map(lambda hop: client_rate(client, lab, *hop), hops))


def measure_wires(session: LabSession, node_env: dict, pair: tuple[str, str], ip: str,
                  report: Callable[[str], None]) -> tuple[float, float, Overlay | None]:
    """iperf3 from pair[0] to pair[1] at `ip` on the bridge, and where the sweep's env (`node_env`) puts
    it on the lab's overlay, through every ring hop's tunnel at once as well, kept with the lab as the
    tunnel's ceiling (labctl/bench/tunnelcost.py): (the wire the sweep uses, the bridge's, the overlay
    or None)."""
    names = list(node_env)
    iface = node_env[names[0]].get("GLOO_SOCKET_IFNAME", session.config.iface)
    tunnel = session.overlay_spec() if iface != session.config.iface else None
    sender, receiver = pair
    report(f"measuring the wire {sender} -> {receiver} with iperf3 ({IPERF_SECONDS} s)"
           + (f", and through {tunnel.iface} from every node to the next at once" if tunnel else ""))
    underlay_bps = measure_wire(session.client, session.name, sender, receiver, ip)
    if tunnel is None:
        return underlay_bps, underlay_bps, None
    hops = [(node, names[(i + 1) % len(names)], tunnel.address((i + 1) % len(names))) for i, node in enumerate(names)]
    ring_bps = measure_ring_wire(session.client, session.name, hops)
    save_rate(session.directory, tunnel, ring_bps)  # the tunnel's ceiling, for `labctl cost` on this lab
    return ring_bps, underlay_bps, tunnel


def sweep_plan(session: LabSession, node_env: dict, sizes: list[int], iters: int,
               env: dict[str, str] | None = None, probe_iters: int = PROBE_ITERS, ops: list[str] | None = None) -> RunPlan:
    """torchrun -m trainer.bench_allreduce (with `ops`, trainer.bench_collectives --ops) on every
    node, one process each, the latency probe first: the plan (its run folder is known before
    anything starts). `env` is added to every process's (as `labctl run -e`)."""
    module = ["trainer.bench_collectives", "--ops", ",".join(ops), "--copy-probe"] if ops else ["trainer.bench_allreduce"]
    args = ["-m", *module, "--sizes", ",".join(map(str, sizes)), "--iters", str(iters),
            "--probe-size", str(PROBE_SIZE), "--probe-iters", str(probe_iters),
            "--max-iters", str(max(iters, PROBE_ITERS)), "--budget-s", str(SMALL_BUDGET_S),
            "--fill-ms", str(FILL_MS)]
    return session.plan_run(*args, options=RunOptions(nproc_per_node=1, pg_timeout_s=None, env=env),
                            node_env=node_env)


def run_sweep(session: LabSession, plan: RunPlan, name: str = "allreduce") -> list[dict]:
    """Run a sweep_plan, output to the run's logs only: rank 0's timings (`name`.json: allreduce or collectives)."""
    session.execute(plan, echo=False)
    return json.loads((plan.run_dir / f"{name}.json").read_text())


@dataclass(frozen=True)
class AllreduceReport:
    """`labctl bench allreduce`'s answer: the rows, the table's title, and what they were measured on."""

    rows: list[AllreduceRow]
    title: str
    run_dir: Path  # the sweep's logs, and bench-allreduce.json (the rows)
    nodes: int
    slowest: str  # the node with the slowest shaped link (the first node when none is shaped)
    link_bps: int | None  # that link's shaped rate; None when unshaped
    wire_bps: float  # iperf3's TCP throughput from `slowest` to the next node, on the interface the sweep used
    underlay_bps: float | None = None  # on a lab with an overlay: the same, on the bridge under the tunnel


def _quiet(_message: str) -> None:
    pass


def measure(session: LabSession, sizes: list[int], iters: int, efficiency: float = DEFAULT_EFFICIENCY,
            report: Callable[[str], None] = _quiet, plot_path: Path | None = None,
            env: dict[str, str] | None = None, ops: list[str] | None = None) -> AllreduceReport:
    """The sweep across the running lab's nodes beside the wire and the model: iperf3 from the node
    with the slowest shaped link to the next, then the sweep (with `env` added to its processes');
    the rows are also written to bench-allreduce.json in the run's folder, and with `plot_path`
    drawn there. With `ops` (OPS), `labctl bench collectives`: every op at every size, the rows in
    bench-collectives.json."""
    name = "collectives" if ops else "allreduce"
    for op in ops or ():
        if op not in OPS:
            raise ConfigError("--ops", ",".join(ops), f"names ops from {', '.join(OPS)}", hint=f"{op!r} is none of them")
    if plot_path:  # refused before the minutes of measuring, not after
        require_matplotlib("bench allreduce --plot")
    nodes = session.running()
    if len(nodes) < 2:
        raise StateError(f"lab {session.name} has {len(nodes)} node; {'a collective' if ops else 'an allreduce'} across "
                         "nodes needs 2 or more",
                         hint=f"labctl up --lab {session.name} --nodes 3")
    names = [n.name for n in nodes]
    node_env = session.node_env(names)
    links = netshape.read_links(session.client, session.name, names, session.config.iface)
    ip_of = {n.name: n.ip for n in nodes}
    steps = tuple({RING_STEP.get(op, -1) for op in ops or ["all_reduce"]})  # which way each op's ring turns
    bottleneck = netshape.slowest_link(links, ip_of, steps)  # the rings' slowest hop, links between groups too
    slowest, neighbour, link_bps = bottleneck or (names[0], names[steps[0] % len(names)], None)
    delay_s = max((hop.delay_us for hop in lab_ring(links, ip_of, steps)), default=0) / 1e6
    wire_bps, underlay_bps, tunnel = measure_wires(session, node_env, (slowest, neighbour), ip_of[neighbour], report)
    plan = sweep_plan(session, node_env, sizes, iters, env, ops=ops)
    more = f", up to {PROBE_ITERS} where they take under {SMALL_BUDGET_S:g} s" if iters < PROBE_ITERS else ""
    what = f"{', '.join(ops)} sweep" if ops else "allreduce sweep"
    report(f"{what} on {len(names)} nodes, {len(sizes)} sizes x {iters} iterations{more} (logs: {plan.run_dir})")
    timings = run_sweep(session, plan, name)
    calibrated = calibrate(timings, len(names), wire_bps, delay_s)
    asked = [t for t in timings if not t.get("probe")]
    rows = build_rows(asked, len(names), model_link(link_bps, wire_bps, delay_s), wire_bps, efficiency, calibrated)
    (plan.run_dir / f"bench-{name}.json").write_text(json.dumps([r.as_dict() for r in rows]))
    measured = f"{rows[0].backend} ({rows[0].device} tensors)" if rows else "?"
    title = (f"{name} on {measured}, {len(names)} nodes, link {_link_text(link_bps, slowest, neighbour)}, "
             f"iperf3 wire {wire_text(wire_bps, tunnel, underlay_bps)}; model: ring at {efficiency:.0%} of "
             f"{'the link' if link_bps else 'the wire'}, {(DEFAULT_ALPHA_S + delay_s) * 1e6:.0f} us a hop"
             + (f"; calibrated: the wire, a step {delay_s * 1e3:g} ms + max(stack {calibrated.base_s * 1e6:.0f} us, "
                "transfer)" if calibrated else "")
             + (" + gloo's copies at the probed rate" if calibrated and calibrated.copy_rates else ""))
    if plot_path:
        plot(rows, plot_path, link_bps, wire_bps, len(names), title.split(";")[0])
        report(f"plot written to {'standard output' if is_stdout(plot_path) else plot_path}")
    return AllreduceReport(rows, title, plan.run_dir, len(names), slowest, link_bps, wire_bps,
                           underlay_bps if tunnel else None)


def measure_collectives(session: LabSession, ops: list[str], sizes: list[int], iters: int,
                        efficiency: float = DEFAULT_EFFICIENCY, report: Callable[[str], None] = _quiet,
                        plot_path: Path | None = None, env: dict[str, str] | None = None) -> AllreduceReport:
    """`labctl bench collectives`: measure()'s sweep for every op in `ops` (OPS)."""
    return measure(session, sizes, iters, efficiency, report, plot_path, env, ops=list(ops))


def wire_text(wire_bps: float, tunnel: Overlay | None, underlay_bps: float) -> str:
    """The wire as the table's title says it: on an overlay, a hop through the tunnel and the bridge under it."""
    if tunnel is None:
        return f"{wire_bps / 1e6:.0f} Mbit/s"
    return (f"{wire_bps / 1e6:.0f} Mbit/s a hop through {tunnel.iface} with every node sending at once (MTU "
            f"{tunnel.mtu}; {underlay_bps / 1e6:.0f} Mbit/s on the bridge under it)")


def _link_text(link_bps: int | None, sender: str, receiver: str) -> str:
    return f"shaped {format_rate(link_bps)} (slowest hop {sender} -> {receiver})" if link_bps else "unshaped"


def plot(rows: list[AllreduceRow], path: Path, link_bps: float | None, wire_bps: float | None, n: int, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ops = list(dict.fromkeys(r.op for r in rows))
    for op in ops:  # one colour per op: its measured busbw, and the models' beside it
        mine = [r for r in rows if r.op == op]
        sizes, factor, named = [r.size for r in mine], op_cost(op, n, mine[0].backend).busbw, f"{op} " if len(ops) > 1 else ""
        line, = ax.plot(sizes, [r.busbw_gbs * 1000 for r in mine], "o-", label=f"{named}measured busbw")
        for key, style, label in (("model_us", "--", "paper model"), ("calibrated_us", ":", "calibrated model")):
            if getattr(mine[0], key) is not None:  # a model's busbw: the bytes over its predicted time
                ax.plot(sizes, [r.size / (getattr(r, key) / 1e6) * factor / 1e6 for r in mine], style, zorder=3,
                        color=line.get_color(), label=f"{named}{label}")  # over the wire line, which the calibrated model follows
    if link_bps:
        ax.axhline(link_bps / 8e6, color="red", linestyle=":", label=f"link rate {link_bps / 1e6:g} Mbit/s")
    if wire_bps:
        ax.axhline(wire_bps / 8e6, color="grey", linestyle="-.", label=f"iperf3 wire {wire_bps / 1e6:.0f} Mbit/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (MB/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(textwrap.fill(title, 85), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    plt.close(fig)
