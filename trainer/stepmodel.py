"""The step model: one optimizer step's time, predicted from its parts before the steps are run.

Pure Python, no torch: the trainer predicts its own steps with it (trainer/calibrate.py measures
the inputs) and `labctl cost --step` answers what-if questions for fabrics the lab cannot have.

    step = accum x (forward + backward)       this rank's compute
         + waiting                            for the slowest rank's gradients (lockstep_ms)
         + exposed communication              what backward does not hide (below), less what the
                                              ring sent while waiting (sent_while_waiting_ms)
         + optimizer                          Adam over what this rank holds
         + the strategy's collectives outside backward (zero's broadcasts of the updated shards;
           fsdp's all-gathers before each micro-step's forward and backward, and its reduce-scatter),
           and for fsdp FSDP2's own work around each unit (ComputeTimes.wrapper_ms)

DDP hands its gradient buckets to the all-reduce from inside the last micro-step's backward, in the
order backward produces them, about the reverse of the parameters' order. Bucket k is ready when
backward has produced its bytes and the ones before it (backward's time spread over the gradient
bytes evenly); the buckets go one after another on one process group, so bucket k starts at the
later of its readiness and the end of bucket k-1. Exposed communication is how far the last bucket
ends after backward's compute: nothing with one bucket hides (it is ready when backward ends).

A collective's time on the link is `bench allreduce`'s calibrated model
(docs/explanation/cost-model.md): a pipelined ring hides the stack's latency behind a long enough
transfer, and never the configured delay:

    t = hops x delay + max(hops x stack, bytes through the busiest NIC x 8 / rate)

where the ring's slowest hop sets `rate`: a ring moves at the pace of its slowest link. A shaped
link (Linux tbf) lets through a burst at the bridge's speed when it has been idle: `burst_bytes` of
credit, refilled at `rate` while the link waits for the next collective, so the first bytes of a
step's communication can pass unpaced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainer.ring import ring_cost

# What a shaped link's rate carries of a collective's bytes: tbf paces whole Ethernet frames, and a
# full TCP segment with timestamps is 1448 bytes of data in a 1514-byte frame (iperf3 got 955 to
# 958 Mbit/s through 1gbit here, docs/explanation/cost-model.md).
PAYLOAD_EFFICIENCY = 1448 / 1514


@dataclass(frozen=True)
class Link:
    """The ring's link as the collectives see it: the slowest hop's payload rate, the stack's latency
    per hop, the configured delay per hop, and the burst a shaped link lets through when idle.

    The one Link of the project: the trainer's calibration fits it (trainer/calibrate.py), and
    `labctl cost` prices its presets (1GbE, NVLink, ...) and the links a user names with it, by the
    formula above (`cost --step`, through predict) or the textbook one (`cost`, textbook_s)."""

    rate_bps: float  # payload bits per second through the slowest hop
    stack_s: float = 0.0  # waking processes, syscalls: per hop, hidden behind a long enough transfer
    delay_s: float = 0.0  # netem's delay per hop: never hidden
    burst_bytes: float = 0.0  # tbf's bucket at the slowest hop; 0 where nothing is shaped
    # The ranks whose hop of the ring runs at the slowest rate, and which way the ring turns (-1:
    # rank r sends to r-1): where some hops are faster (links between groups), ranks send early
    # (sent_while_waiting_ms). Empty: not known, nothing is credited.
    slow_senders: tuple[int, ...] = ()
    ring_step: int = -1
    name: str = field(default="", compare=False)  # what a user calls it (`labctl cost`'s rows)
    # One small broadcast's turn in a queue of them launched together, as measured over this link and
    # these ranks (trainer/linkstate.py: zero's pattern); None where nobody measured it (`labctl cost`)
    queue_s: float | None = None

    def op_s(self, op: str, nbytes: float, n: int, backend: str, credit_bytes: float = 0.0) -> float:
        """One collective of `nbytes` over n ranks, with `credit_bytes` of burst banked on the link."""
        cost = ring_cost(op, n, backend)
        if not cost.hops:
            return 0.0
        paced = max(0.0, cost.wire * nbytes - credit_bytes)
        return cost.hops * self.delay_s + max(cost.hops * self.stack_s, paced * 8 / self.rate_bps)

    def textbook_s(self, op: str, nbytes: float, n: int, backend: str, efficiency: float = 1.0) -> float:
        """The alpha-beta model people compute by hand: the busiest NIC's bytes at `efficiency` of the
        rate, plus every hop's latency (stack and delay) added, none of it hidden."""
        cost = ring_cost(op, n, backend)
        return cost.wire * nbytes * 8 / (self.rate_bps * efficiency) + cost.hops * (self.stack_s + self.delay_s)

    def credit(self, idle_s: float) -> float:
        """The burst banked after the link idled `idle_s` seconds."""
        return min(self.burst_bytes, max(0.0, idle_s) * self.rate_bps / 8 / PAYLOAD_EFFICIENCY)


@dataclass(frozen=True)
class ComputeTimes:
    """Calibrated compute, in milliseconds: one micro-step's forward and backward on the slowest rank,
    and the optimizer's step on the rank whose steps are predicted."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    own_ms: float | None = None  # the predicted rank's own micro-steps; None: accum x (forward + backward)
    # All of a step's micro-steps until the slowest rank's last gradient, as measured in lockstep
    # (ranks sharing cores, each step waiting for the slowest); None: own_ms
    lockstep_ms: float | None = None
    # fsdp and hsdp: what FSDP2 itself adds to a micro-step (its hooks around each unit, DTensor's
    # dispatch), its collectives apart
    wrapper_ms: float = 0.0


@dataclass(frozen=True)
class Job:
    """What a step does: its ranks, strategy and backend, its micro-steps, and the bytes it moves."""

    world: int
    strategy: str = "ddp"
    backend: str = "gloo"
    accum: int = 1
    buckets: tuple[int, ...] = ()  # DDP's gradient buckets in bytes, in the order backward hands them over
    param_bytes: int = 0  # the whole model's parameters
    units: tuple[int, ...] = ()  # fsdp's units' bytes (each block, then the root): one gather or scatter apiece
    tensors: int = 1  # parameter tensors: zero broadcasts each with a call of its own
    local_world: int = 1  # ranks on one node (hsdp shards within them)


@dataclass
class Prediction:
    """The predicted step and its terms, in milliseconds."""

    step_ms: float
    compute_ms: float  # the predicted rank's own forward and backward passes
    waiting_ms: float  # for the slowest rank's gradients
    optimizer_ms: float
    comm_ms: float  # every collective's time on the link, hidden or not
    exposed_comm_ms: float  # what the step waits beyond its own compute: for the slowest rank, then the link
    terms: dict = field(default_factory=dict)  # the strategy's other collectives, by name
    sent_while_waiting_ms: float = 0.0  # the link's time spent while the step waited for the slowest rank

    def record(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def inputs_record(job: Job, compute: ComputeTimes, link: Link | None) -> dict:
    """What predict() was given, as JSON: a run's SUMMARY keeps it (step_model.inputs), and `labctl
    cost --from-run` prices the same step again with it, on the run's link or on others."""
    def plain(record: dict) -> dict:  # JSON's own types: a tuple reads back as a list
        return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}

    return {"job": plain(asdict(job)), "compute": plain(asdict(compute)), "link": plain(asdict(link)) if link else None}


def from_record(record: dict) -> tuple[Job, ComputeTimes, Link | None]:
    """inputs_record's (job, compute, link) again; KeyError or TypeError where it is not one."""
    job = {**record["job"], "buckets": tuple(record["job"]["buckets"]), "units": tuple(record["job"]["units"])}
    link = record.get("link")
    return (Job(**job), ComputeTimes(**record["compute"]),
            Link(**{**link, "slow_senders": tuple(link["slow_senders"])}) if link else None)


def ddp_buckets(grad_bytes: list[int], cap_bytes: int) -> tuple[int, ...]:
    """DDP's buckets from the gradients' sizes in the order backward produces them: each bucket is
    closed once it holds `cap_bytes` or more (torch's compute_bucket_assignment_by_size)."""
    buckets, size = [], 0
    for nbytes in grad_bytes:
        size += nbytes
        if size >= cap_bytes:
            buckets.append(size)
            size = 0
    if size:
        buckets.append(size)
    return tuple(buckets)


def overlap_ms(buckets: tuple[int, ...], backward_ms: float, idle_ms: float, link: Link, n: int,
               backend: str) -> tuple[float, float]:
    """(the buckets' time on the link, how long after backward's compute the last one ends)."""
    total = sum(buckets) or 1
    ready, end_ms, busy_ms = 0.0, None, 0.0
    for nbytes in buckets:
        ready += backward_ms * nbytes / total
        start = ready if end_ms is None else max(ready, end_ms)
        idle = idle_ms + ready if end_ms is None else start - end_ms
        took = link.op_s("all_reduce", nbytes, n, backend, link.credit(idle / 1e3)) * 1e3
        end_ms, busy_ms = start + took, busy_ms + took
    return busy_ms, max(0.0, (end_ms or 0.0) - backward_ms)


def predict(job: Job, compute: ComputeTimes, link: Link | None) -> Prediction:
    """The step's time (see the module's docstring); `link` None: one rank, nothing to send."""
    own = compute.own_ms if compute.own_ms is not None else job.accum * (compute.forward_ms + compute.backward_ms)
    compute_ms = compute.lockstep_ms if compute.lockstep_ms is not None else own
    waiting = max(0.0, compute_ms - own)
    if job.world < 2 or link is None:  # nobody to wait for: the lockstep's extra is the loop's own
        return Prediction(compute_ms + compute.optimizer_ms, compute_ms, 0.0, compute.optimizer_ms, 0.0, 0.0)
    n, terms = job.world, {}
    if job.strategy in ("ddp", "zero"):
        # The link idled since the last step's all-reduce: the optimizer, then this step's compute
        # up to the last backward (the first bucket's own readiness is added in overlap_ms).
        idle = compute.optimizer_ms + compute_ms - compute.backward_ms
        buckets = job.buckets or (job.param_bytes,)
        comm_ms, exposed = overlap_ms(buckets, compute.backward_ms, idle, link, n, job.backend)
        early = sent_while_waiting_ms(buckets[0], n, link, min(waiting, exposed))
        exposed -= early
        if job.strategy == "zero":  # every rank's updated shard to every other, after the optimizer
            terms["broadcast_ms"] = zero_broadcast_ms(job, link)
    else:  # fsdp, hsdp: the collectives wait for each other and for the compute (gloo on CPU)
        terms = sharded_terms(job, link)
        if compute.wrapper_ms:
            terms["fsdp_hooks_ms"] = job.accum * compute.wrapper_ms
        comm_ms, exposed, early = 0.0, 0.0, 0.0
    outside = sum(terms.values())
    return Prediction(compute_ms + exposed + compute.optimizer_ms + outside, own, waiting, compute.optimizer_ms,
                      comm_ms + outside, waiting + exposed + outside, terms, early)


def sent_while_waiting_ms(first_bucket: float, n: int, link: Link, up_to_ms: float) -> float:
    """The link's time paid while the step waits for the slowest rank, at most `up_to_ms`.

    TCP lets a rank send into its peer's socket buffer before the peer asks for the data, so a ring
    rank that is ready early sends its first chunks (1/n of the first bucket each) at once. Its k-th
    send needs what the ranks k steps up the ring (the way data comes from) sent before, so a
    sender on a slow hop gets k chunks ahead of the last rank to be ready, where k is how far up
    the ring that rank sits; none if the last rank is itself a slow hop's sender. The ring ends
    when its slowest hops do, so it gains the least of them. Which rank is last changes from step
    to step on shared cores: the credit is the mean over every rank being last. Where every hop is
    as slow, the last rank is always a slow hop's sender, and nothing is gained. Measured on two
    groups joined by 100mbit (docs/explanation/cost-model.md): 4 nodes, one slow hop, 12 to 14 ms a
    step (this gives 11.5); 3 nodes, two slow hops, about nothing (this gives 2.8)."""
    slow = set(link.slow_senders)
    if not slow or n < 2 or up_to_ms <= 0:
        return 0.0
    chunk_ms = first_bucket / n * 8 / link.rate_bps * 1e3
    ahead = [min((((last - s) * -link.ring_step) % n) for s in slow) for last in range(n)]
    return sum(min(up_to_ms, k * chunk_ms) for k in ahead) / n


# ProcessGroupGloo's worker threads (its Options' default: two per device, one device on the lab): the
# async collectives a rank launches together run this many at a time.
GLOO_THREADS = 2


def zero_broadcast_ms(job: Job, link: Link) -> float:
    """ZeroRedundancyOptimizer's broadcasts after its step: each parameter tensor from the rank that
    owns it, one async call apiece, all launched together. The bytes: each rank's shard (1/n of the
    parameters) down the tree; the latency: a calibrated link's measured turn of a queued broadcast
    for each call (its rounds and the backend's threads in it), else every call's rounds of the
    stack's, the backend's threads running them GLOO_THREADS at a time (NCCL runs them one after
    another on its stream). The lone all-reduce's stack overprices a queue: 4 nodes at 1gbit, 28
    calls, 39.6 ms predicted so against 28.0 ms measured (docs/explanation/cost-model.md)."""
    n = job.world
    cost = ring_cost("broadcast", n, job.backend)
    if link.queue_s is not None:
        latency = job.tensors * link.queue_s  # measured over the link: its delay is in it
    else:
        at_once = GLOO_THREADS if job.backend == "gloo" else 1
        latency = job.tensors * cost.hops * (link.stack_s + link.delay_s) / at_once
    return (cost.wire * job.param_bytes / n * 8 / link.rate_bps + latency) * 1e3


def sharded_terms(job: Job, link: Link) -> dict:
    """fsdp's collectives, a call per unit: each micro-step gathers every unit before its forward and
    all but the root again before its backward (the root stays gathered), and a step reduce-scatters
    every unit's gradients once. hsdp: the all-reduce of each rank's gradient shard with its peers on
    the other nodes, the node's gathers and scatters staying inside it."""
    if job.strategy == "hsdp":
        nodes = job.world // max(job.local_world, 1)
        shard = job.param_bytes / max(job.local_world, 1)
        # every rank of a node sends its shard through the node's one link at once
        return {"all_reduce_ms": link.op_s("all_reduce", shard * job.local_world, nodes, job.backend) * 1e3}
    units = job.units or (job.param_bytes,)

    def each_ms(op, sizes):
        return sum(link.op_s(op, nbytes, job.world, job.backend) for nbytes in sizes) * 1e3

    return {"all_gather_ms": job.accum * (each_ms("all_gather", units) + each_ms("all_gather", units[:-1])),
            "reduce_scatter_ms": each_ms("reduce_scatter", units)}
