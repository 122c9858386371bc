"""The communication cost model from first principles, the one people compute by hand.

A ring allreduce moves 2(n-1)/n x S bytes through each rank's NIC (S = gradient bytes);
reduce-scatter and all-gather move (n-1)/n x S each. Time on a link = those bytes / (rate x
efficiency) + a latency term: 2(n-1) hops x alpha for allreduce, (n-1) x alpha for the others.
These are also nccl-tests' busbw factors: busbw = algbw x 2(n-1)/n for allreduce.

Per optimizer step, a strategy (the trainer's --strategy) sends (STRATEGY_COLLECTIVES): DDP one
allreduce of the gradients, 2(n-1)/n x S; ZeRO-1 as torch's ZeroRedundancyOptimizer does it, DDP's
allreduce and then every rank's updated shard of the parameters to every other rank, an all-gather's
(n-1)/n x S more; FSDP an all-gather of the parameters before forward, another before backward and a
reduce-scatter of the gradients, 3(n-1)/n x S. Both sharded ones send 1.5x DDP's bytes, for what
one rank holds (state_bytes_per_rank): DDP all of the parameters, gradients and Adam's state, ZeRO-1
1/n of Adam's state, FSDP 1/n of everything.

That is NCCL's arithmetic, and `--backend nccl` the default. gloo (the lab's CPU nodes) reduce-scatters
by all-reducing the whole input and keeping its chunk, so there a reduce-scatter costs an
all-reduce's 2(n-1)/n x S, and FSDP's step 4(n-1)/n x S: 2x DDP's, not 1.5x (`--backend gloo`;
op_cost has every op's algorithm per backend, which `labctl bench collectives` measures).

`estimate` is `labctl cost`: the rows for the links asked for, or for a running lab's slowest
shaped link and every preset, over the ranks given or the lab's world size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from labctl.bench.tunnelcost import BY_HAND, Tunnel, tunnel_notes, tunnel_of
from labctl.errors import ConfigError, LabError
from labctl.net import apply as netshape
from labctl.session import LabSession
from labctl.spec.units import format_rate, parse_rate, parse_time_us
from trainer.ring import OPS, OpCost, ring_cost  # noqa: F401 - OPS and OpCost are this module's API too
from trainer.stepmodel import Link

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")  # --collective
SPELLED = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter"}
BACKENDS = ("nccl", "gloo")  # --backend: whose algorithms the model prices
DEFAULT_EFFICIENCY = 0.85  # what a tuned TCP collective stack typically reaches on Ethernet
DEFAULT_ALPHA_S = 50e-6
STRATEGIES = ("ddp", "zero", "fsdp", "hsdp", "pp", "tp")  # pp and tp: labctl/bench/parallelrows.py
# What one optimizer step sends, per strategy: (collective, how many), each over the model's S bytes.
STRATEGY_COLLECTIVES = {
    "ddp": (("allreduce", 1),),
    "zero": (("allreduce", 1), ("allgather", 1)),  # the updated shards broadcast: an all-gather's bytes
    "fsdp": (("allgather", 2), ("reduce_scatter", 1)),  # parameters before forward and backward; gradients
    "hsdp": (("allreduce", 1),),  # between nodes: each rank's gradient shard, with its peers on the other nodes
}
# Adam's state per parameter: two fp32 moments, and an fp32 master copy of the parameter when they
# train in bf16 or fp16 (the ZeRO paper's K = 12): with the parameter and its gradient, 16 bytes either way.
OPTIMIZER_BYTES = {"fp32": 8, "bf16": 12, "fp16": 12}


def named_link(name: str, rate_bps: float, alpha_s: float) -> Link:
    """A named link of the step model's kind (trainer/stepmodel.Link, the one Link): its rate, and its
    stack's latency per hop (alpha: typical orders of magnitude, not measurements)."""
    return Link(rate_bps, stack_s=alpha_s, name=name)


# One direction's rate. NVLink 4 (H100): 900 GB/s in total, 450 GB/s each way = 3.6 Tbit/s.
PRESETS = {
    "1gbe": named_link("1GbE", 1e9, 50e-6),
    "2.5gbe": named_link("2.5GbE", 2.5e9, 50e-6),
    "10gbe": named_link("10GbE", 10e9, 20e-6),
    "100g-roce": named_link("100G-RoCE", 100e9, 5e-6),
    "400g-roce": named_link("400G-RoCE", 400e9, 5e-6),
    "nvlink": named_link("NVLink", 3.6e12, 2e-6),
}


ETHERNET = ("1gbe", "2.5gbe", "10gbe")  # the presets a mesh VPN's tunnel runs over (not RDMA, not NVLink)


def resolve_link(text: str, key: str = "--link") -> Link:
    preset = PRESETS.get(str(text).strip().lower())
    if preset:
        return preset
    try:
        rate_bps = parse_rate(text, key)
    except ConfigError as exc:
        raise ConfigError(key, text, f"must be a preset ({', '.join(p.name for p in PRESETS.values())}) or a rate such as 100mbit",
                          hint=exc.hint) from None
    return named_link(str(text).strip(), float(rate_bps), DEFAULT_ALPHA_S)


def _check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ConfigError("--collective", collective, f"must be one of {', '.join(COLLECTIVES)}")


def op_cost(op: str, n: int, backend: str = "nccl") -> OpCost:
    """The ring cost model per op (OPS), with what the backend really does where it differs
    (trainer/ring.py, which the trainer's step model prices with too)."""
    if op not in OPS:
        raise ConfigError("--ops", op, f"must be one of {', '.join(OPS)}")
    return ring_cost(op, n, backend)


def bytes_per_rank(payload_bytes: float, n: int, collective: str = "allreduce", backend: str = "nccl") -> float:
    _check_collective(collective)
    return op_cost(SPELLED[collective], n, backend).wire * payload_bytes


def collective_time_s(payload_bytes: float, n: int, link: Link, efficiency: float = DEFAULT_EFFICIENCY,
                      collective: str = "allreduce", backend: str = "nccl") -> float:
    _check_collective(collective)
    return op_time_s(payload_bytes, n, link, efficiency, SPELLED[collective], backend)


def op_time_s(payload_bytes: float, n: int, link: Link, efficiency: float = DEFAULT_EFFICIENCY,
              op: str = "all_reduce", backend: str = "nccl") -> float:
    """The paper model of one op (OPS) over n ranks: its busiest NIC's bytes on `link`, plus its hops
    (Link.textbook_s)."""
    op_cost(op, n, backend)  # an op the model does not know is refused, by name
    return link.textbook_s(op, payload_bytes, n, backend, efficiency)


def state_bytes_per_rank(params: float, dtype: str, n: int, strategy: str) -> float:
    """The parameters, gradients and Adam state one of n ranks holds under `strategy`, in bytes."""
    replicated = params * DTYPE_BYTES[dtype] * 2  # the parameters and their gradients
    optimizer = params * OPTIMIZER_BYTES[dtype]
    return {"ddp": replicated + optimizer, "zero": replicated + optimizer / n,
            "fsdp": (replicated + optimizer) / n, "hsdp": (replicated + optimizer) / n}[strategy]


def strategy_step(payload_bytes: float, n: int, link: Link, efficiency: float, strategy: str,
                  grad_accum: int = 1, backend: str = "nccl") -> tuple[float, float]:
    """(bytes through each rank's NIC, seconds on `link`) of one optimizer step's collectives. FSDP
    gathers the parameters again in every micro-step; the gradients go once a step, as DDP's do."""
    sent = [(op, k * grad_accum if strategy == "fsdp" and op == "allgather" else k)
            for op, k in STRATEGY_COLLECTIVES[strategy]]
    return (sum(k * bytes_per_rank(payload_bytes, n, op, backend) for op, k in sent),
            sum(k * collective_time_s(payload_bytes, n, link, efficiency, op, backend) for op, k in sent))


def check_query(query: CostQuery, n: int) -> None:
    """A ConfigError (exit 2) for what `labctl cost` cannot price: each option's allowed values, and
    with a strategy, ranks a node that make whole nodes (2 or more for hsdp). `n`: the ranks resolved."""
    params, dtype, compute_s, grad_accum = query.params, query.dtype, query.compute_s, query.grad_accum
    efficiency, collective, strategy = query.efficiency, query.collective, query.strategy
    if not params > 0:
        raise ConfigError("--params", params, "must be a positive number of parameters, e.g. 760e6")
    if dtype not in DTYPE_BYTES:
        raise ConfigError("--dtype", dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
    if n < 1:
        raise ConfigError("--nodes", n, "must be at least 1")
    if not 0 < efficiency <= 1:
        raise ConfigError("--efficiency", efficiency, "must be in (0, 1]")
    if grad_accum < 1:
        raise ConfigError("--grad-accum", grad_accum, "must be at least 1")
    if compute_s is not None and not compute_s > 0:
        raise ConfigError("--compute-s", compute_s, "must be a positive number of seconds")
    _check_collective(collective)
    if strategy is not None and strategy not in STRATEGIES:
        raise ConfigError("--strategy", strategy, f"must be one of {', '.join(STRATEGIES)}")
    if query.backend not in BACKENDS:
        raise ConfigError("--backend", query.backend, f"must be one of {', '.join(BACKENDS)}")
    if strategy is not None and collective != "allreduce":
        raise ConfigError("--collective", collective, "prices one collective, and --strategy a whole step's",
                          hint=f"drop --collective: --strategy {strategy} sends "
                               + (strategy_text(strategy) if strategy in STRATEGY_COLLECTIVES else "its whole step's"))
    for key, value in (("--activations", query.activations), ("--layers", query.layers)):
        if value is not None and strategy not in ("pp", "tp"):
            raise ConfigError(key, value, "describes a pipeline's or tensor parallelism's activations",
                              hint="with --strategy pp or --strategy tp")
    per_node = query.nproc_per_node
    if strategy is not None and (per_node < 1 or n % per_node):
        raise ConfigError("--nproc-per-node", per_node, f"must divide the {n} ranks into whole nodes")
    if strategy == "hsdp" and per_node < 2:
        raise ConfigError("--nproc-per-node", per_node, "must be 2 or more for hsdp, which shards within a node",
                          hint="labctl cost --strategy hsdp --nodes 16 --nproc-per-node 8")


def step_report(query: CostQuery, n: int, links: list[Link]) -> list[dict]:
    """One row per link: what one gradient synchronisation costs over n ranks, and against the compute;
    with a strategy, what its optimizer step sends (STRATEGY_COLLECTIVES) and what a rank holds.
    `query.ranks`, `.links` and `.delay` are resolved already: `n` and `links`."""
    check_query(query, n)
    params, dtype, compute_s, grad_accum = query.params, query.dtype, query.compute_s, query.grad_accum
    efficiency, collective, strategy = query.efficiency, query.collective, query.strategy
    payload = params * DTYPE_BYTES[dtype]
    rows = []
    for link in links:
        if strategy is None:
            sent = bytes_per_rank(payload, n, collective, query.backend)
            comm_s = collective_time_s(payload, n, link, efficiency, collective, query.backend)
        else:
            sent, node_sent, comm_s = node_step(query, payload, n, link)
        row = {"link": link.name, "rate_bps": link.rate_bps, "payload_bytes": payload, "bytes_per_rank": sent,
               "comm_s": comm_s}
        if strategy is not None:
            sharded_over = query.nproc_per_node if strategy == "hsdp" else n
            row.update(strategy=strategy, bytes_per_rank_per_step=sent, bytes_per_node_per_step=node_sent,
                       state_bytes_per_rank=state_bytes_per_rank(params, dtype, sharded_over, strategy))
        if compute_s is not None:
            # Gradients are synchronised once per optimizer step, after grad_accum micro-steps.
            row["comm_over_compute"] = comm_s / (grad_accum * compute_s)
            row["step_s_no_overlap"] = grad_accum * compute_s + comm_s
        rows.append(row)
    return rows


def node_step(query: CostQuery, payload: float, n: int, link: Link) -> tuple[float, float, float]:
    """(bytes through a rank's NIC, through a node's, seconds on the node's link) of one optimizer step
    over n ranks, --nproc-per-node P of them on a node sharing its link. The flat strategies' rings
    run through each node's ranks in turn, so one rank a node sends across: a node sends a rank's
    bytes. hsdp's collectives inside a node stay there; between nodes each of its P ranks all-reduces
    its shard (S/P) with its peers on the other n/P nodes, all P through the node's link."""
    per_node = query.nproc_per_node  # check_query has seen that it makes whole nodes
    if query.strategy != "hsdp":
        sent, comm_s = strategy_step(payload, n, link, query.efficiency, query.strategy, query.grad_accum, query.backend)
        return sent, sent, comm_s
    nodes, shard = n // per_node, payload / per_node
    sent = bytes_per_rank(shard, nodes, "allreduce", query.backend)
    return sent, sent * per_node, op_time_s(shard * per_node, nodes, link, query.efficiency, "all_reduce", query.backend)


def strategy_text(strategy: str) -> str:
    """What a strategy's step sends, in words: "2 allgather + 1 reduce_scatter"."""
    return " + ".join(f"{k} {op}" for op, k in STRATEGY_COLLECTIVES[strategy])


_PARAM_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_params(text: str) -> float:
    """'760e6', '760M', '1.3B' -> a parameter count."""
    if text is None:
        raise ConfigError("--params", None, "is needed: the model's parameter count",
                          hint="labctl cost --params 760e6 --nodes 8; or a trainer run's own: labctl cost --from-run RUN")
    raw = str(text).strip().lower()
    scale = _PARAM_SUFFIX.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in _PARAM_SUFFIX else raw
    try:
        params = float(number) * scale
    except ValueError:
        raise ConfigError("--params", text, "must be a parameter count such as 760e6, 760M or 1.3B") from None
    if not 1 <= params < 1e15:
        raise ConfigError("--params", text, "must be from 1 to 1e15 parameters")
    return params


# ------------------------------------------------------------------------------ labctl cost


@dataclass(frozen=True)
class CostReport:
    """`labctl cost`'s answer: one row per link (see step_report), and what they were computed for."""

    params: float
    dtype: str
    ranks: int
    collective: str
    efficiency: float
    compute_s: float | None
    grad_accum: int
    rows: list[dict]
    strategy: str | None = None  # a whole optimizer step's collectives, priced instead of one collective
    backend: str = "nccl"  # whose algorithms were priced
    nproc_per_node: int = 1  # ranks on a node, sharing its link
    step: bool = False  # rows of whole predicted steps (labctl/bench/stepcost.py), not of one collective
    run: str | None = None  # --from-run: the run whose step was priced again (its id)
    notes: tuple[str, ...] = ()  # what the rows took of a tunnel (--overlay), in words


def lab_link(session: LabSession) -> tuple[tuple[str, int] | None, int | None]:
    """((rate as tc writes it, rate) of the running lab's slowest shaped link, or None when no link is
    shaped; the lab's world size). (None, None) when the lab is not up or no engine answers."""
    try:
        running = session.running()
    except LabError:
        return None, None
    nodes, world = [n.name for n in running], len(running) * session.config.nproc_per_node
    links = netshape.read_links(session.client, session.name, nodes, session.config.iface)
    bottleneck = netshape.slowest_link(links, {n.name: n.ip for n in running})
    return ((format_rate(bottleneck[2]), bottleneck[2]) if bottleneck else None), world


def rank_count(given: str | None, lab_world: int | None) -> int:
    """The ranks in the collective: --nodes, else the running lab's world size. Any cluster size: the
    calculator is for the real cluster, not only for this lab."""
    if given is None and lab_world is None:
        raise ConfigError("--nodes", None, "is needed outside a running lab", hint="labctl cost --params 760e6 --nodes 2")
    try:
        n = int(given) if given is not None else lab_world
    except ValueError:
        n = 0
    if not 1 <= n <= 1_000_000:
        raise ConfigError("--nodes", given, "must be a whole number of ranks from 1 to 1000000")
    return n


def links_to_price(texts: list[str] | tuple[str, ...], shaped: tuple[str, int] | None,
                   delay: str | None = None, tunnel: Tunnel | None = None,
                   efficiency: float = DEFAULT_EFFICIENCY) -> list[Link]:
    """The links named (presets or rates); none named: the lab's shaped link, if any, and every preset.
    `delay` (e.g. "10ms", one way) is added to every link's delay per hop and to its name. With a
    `tunnel`, each link carries it (Tunnel.through): the lab's own link, unshaped too where the
    tunnel's ceiling was measured, up to that ceiling; every link up to a ceiling given by hand."""
    delay_s = parse_time_us(delay, "--delay") / 1e6 if delay is not None else 0.0
    chosen = [resolve_link(text) for text in texts]
    own = None
    if not chosen:
        if shaped:
            own = named_link(f"lab ({shaped[0]})", float(shaped[1]), DEFAULT_ALPHA_S)
        elif tunnel and tunnel.ceiling_bps and tunnel.ceiling_from != BY_HAND:
            own = named_link("lab (unshaped)", float("inf"), DEFAULT_ALPHA_S)
        presets = [PRESETS[name] for name in ETHERNET] if tunnel else list(PRESETS.values())  # a tunnel is IP
        chosen = ([own] if own else []) + presets
    if tunnel:
        chosen = [tunnel.through(link, efficiency, link is own or tunnel.ceiling_from == BY_HAND) for link in chosen]
    if not delay_s:
        return chosen
    return [replace(link, name=f"{link.name} + {str(delay).strip()}", delay_s=link.delay_s + delay_s) for link in chosen]


@dataclass(frozen=True)
class CostQuery:
    """What `labctl cost` is asked: the gradients, the ranks, the links to price and the step around
    the synchronisation (see estimate)."""

    params: float  # --params: the model's parameter count
    dtype: str = "bf16"  # --dtype: the gradients' dtype on the wire (DTYPE_BYTES)
    ranks: str | None = None  # --nodes: ranks in the collective, as given; None: the running lab's world size
    links: Sequence[str] = ()  # --link: presets or rates; none: the lab's shaped link and every preset
    compute_s: float | None = None  # --compute-s: compute seconds per micro-step; None: no comparison
    grad_accum: int = 1  # --grad-accum: micro-steps per gradient synchronisation
    efficiency: float = DEFAULT_EFFICIENCY  # --efficiency: the fraction of the link rate the stack reaches
    collective: str = "allreduce"  # --collective: one of COLLECTIVES
    delay: str | None = None  # --delay: a one-way delay added to every link's per-hop latency, e.g. "10ms"
    strategy: str | None = None  # --strategy: price a whole optimizer step of ddp, zero, fsdp, hsdp, pp or tp
    backend: str = "nccl"  # --backend: whose algorithms (BACKENDS); gloo's reduce-scatter is an all-reduce
    nproc_per_node: int = 1  # --nproc-per-node: ranks on a node, sharing its link (hsdp shards over them)
    overlay: str | None = None  # --overlay: price the links with a mesh VPN's tunnel on them; None: the lab's own
    tunnel_rate: str | None = None  # --tunnel-rate: the tunnel's ceiling a hop, e.g. "180mbit"; None: as measured
    activations: str | None = None  # --activations B,S,H: pp and tp, a micro-batch's activations (parallelrows.py)
    layers: int | None = None  # --layers: tp, the transformer blocks that each all-reduce 4 times a micro-batch


def estimate(query: CostQuery, lab: LabSession | None = None) -> CostReport:
    """What one gradient synchronisation costs on each link. `lab`, when up, gives the world size
    and the shaped link (it is asked even when `query.ranks` and `query.links` are given, as the CLI
    does); `query.delay` adds a one-way delay to every link's per-hop latency."""
    n, links, notes = resolve(query, lab)
    return report_of(query, n, step_report(query, n, links), notes=notes)


def resolve(query: CostQuery, lab: LabSession | None = None) -> tuple[int, list[Link], tuple[str, ...]]:
    """(the ranks, the links to price, what they took of a tunnel) of `query`, a running `lab`'s where
    the query leaves them out."""
    shaped, world = lab_link(lab) if lab is not None else (None, None)
    tunnel = tunnel_of(query.overlay, query.tunnel_rate, lab if world is not None else None)  # a lab that is up
    links = links_to_price(query.links, shaped, query.delay, tunnel, query.efficiency)
    return rank_count(query.ranks, world), links, tunnel_notes(tunnel)


def report_of(query: CostQuery, n: int, rows: list[dict], step: bool = False, run: str | None = None,
              notes: tuple[str, ...] = ()) -> CostReport:
    return CostReport(query.params, query.dtype, n, query.collective, query.efficiency, query.compute_s,
                      query.grad_accum, rows, query.strategy, query.backend, query.nproc_per_node, step, run, notes)
