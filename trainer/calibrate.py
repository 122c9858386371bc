"""The step model's inputs, measured by the run itself before its first step (trainer/stepmodel.py).

Every rank, at once (so ranks that share cores contend as they will in the steps), runs steps
without their payload (measure_steps), on the model as built (never wrapped: DDP's hooks and FSDP's
shards are not touched; the gradients are dropped after): the step's micro-steps of forward and
backward, a tiny all-reduce at which every rank waits for the slowest, and Adam's step over copies
of what this rank holds (all the parameters under ddp, its shard under zero and fsdp). As many as
fill CALIBRATION_BUDGET_MS at the warm-up's pace, CALIBRATION_WARMUP first. Each rank also reads
its node's CPU quota (cgroup) and Linux traffic control (trainer/tclinks.py: a tbf's rate and
burst, netem's delay, ifb devices for what the node receives, htb classes for links to groups).

Then, together, the link (fit_link): the ring's slowest hop between nodes, the ways the run's
rings turn (gloo's all-reduce sends to rank r-1), sets the rate, at the
payload a shaped rate carries (stepmodel.PAYLOAD_EFFICIENCY); where no hop between nodes is shaped,
a RATE_PROBE_BYTES all-reduce measures it. The stack's latency per hop comes from a PROBE_BYTES
all-reduce, timed again and again. Those probes are the lab's, not the run's (trainer/linkstate.py):
measured once for each state of its links and read back by every run after. None of these runs
inside a step: the steps' records, their collectives and the link counters see nothing of them.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import replace

import torch

from trainer import stepmodel
from trainer.dist import all_gather, barrier, is_group
from trainer.instrument import deciles  # the spread the run's measured steps are given, the same way
from trainer.linkstate import PROBE_BYTES, RATE_PROBE_BYTES, link_probes, node_started
from trainer.ring import ring_cost
from trainer.tclinks import read_shaping, ring_hops, ring_steps

CALIBRATION_REPS, CALIBRATION_WARMUP = 6, 2  # the first micro-steps run slower (allocator, caches)
# Steps timed: enough to fill this many ms (ranks sharing cores wait for each other unevenly from
# step to step; a few steps' mean was 30% off the run's now and then), within these bounds.
CALIBRATION_BUDGET_MS, CALIBRATION_MAX_REPS = 600.0, 40


def micro_step(module, workload, x, y):
    """A function that runs forward and backward of (x, y) on the bare module: (forward s, backward s)."""

    def run():
        t0 = time.perf_counter()
        loss = workload.loss_sum(module(x), y)
        t1 = time.perf_counter()
        loss.backward()
        return t1 - t0, time.perf_counter() - t1

    return run


def fsdp_hooks_ms(module, micro_of, reps: int = CALIBRATION_REPS) -> float:
    """The CPU time FSDP2 adds to a micro-step, its collectives apart: the micro-step (micro_of(model),
    forward and backward) of a copy of `module` sharded as the run shards it but over a mesh of this
    rank alone, less the same micro-step on `module` unwrapped, medians of `reps` each. FSDP2 still
    runs its hooks around every unit and DTensor's dispatch there; its gathers and scatters have
    nobody to wait for. CPU time, not wall time: ranks that share cores leave this measure at
    different moments, and their wall times moved by 10 to 37 ms from run to run; the caller scales
    it as the ranks share the cores. Collective: every rank makes every rank's one-rank group."""
    import copy

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    groups = [torch.distributed.new_group([r]) for r in range(world)]
    solo = copy.deepcopy(module)
    mesh = DeviceMesh.from_group(groups[rank], next(module.parameters()).device.type)
    for block in getattr(solo, "blocks", ()):
        fully_shard(block, mesh=mesh)
    fully_shard(solo, mesh=mesh)

    def cpu_ms(model) -> float:
        step = micro_of(model)

        def once():
            t0 = time.process_time()
            step()
            return time.process_time() - t0

        for _ in range(CALIBRATION_WARMUP):
            once()
        spent = statistics.median(once() for _ in range(reps)) * 1e3
        for p in model.parameters():
            p.grad = None
        return spent

    bare, sharded = cpu_ms(module), cpu_ms(solo)
    for group in groups:
        torch.distributed.destroy_process_group(group)
    return max(0.0, sharded - bare)


def measure_steps(micro, accum: int, optimizer_step, sync, reps=CALIBRATION_REPS,
                  warmup: int = CALIBRATION_WARMUP) -> dict:
    """Steps without their payload, as the run will take them: `accum` micro() (forward and
    backward, micro_step), then sync() (a tiny all-reduce: every rank waits for the slowest, as at a
    step's end), then optimizer_step(). `reps` steps are timed after `warmup`, or reps(the last
    warm-up step's ms) of them (every rank must time as many: sync() is a collective). In ms:
    "forward" and "backward" of one micro-step and "optimizer", medians; "step", the whole, and
    "cpu", the CPU time this process spent on a micro-step, means (the run reports a mean step);
    "step_p10" and "step_p90", the whole step's spread (the prediction's band)."""
    samples = {"forward": [], "backward": [], "optimizer": [], "step": [], "cpu": []}
    count = warmup + (reps if isinstance(reps, int) else 0)
    done = 0
    while done < count:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(accum):
            forward_s, backward_s = micro()
        cpu_s = (time.process_time() - cpu0) / accum
        sync()
        t1 = time.perf_counter()
        optimizer_step()
        t2 = time.perf_counter()
        for key, seconds in (("forward", forward_s), ("backward", backward_s), ("optimizer", t2 - t1), ("step", t2 - t0),
                             ("cpu", cpu_s)):
            samples[key].append(seconds * 1e3)
        done += 1
        if done == warmup and not isinstance(reps, int):
            count = warmup + reps(samples["step"][-1])
    kept = {key: values[warmup:] for key, values in samples.items()}
    measured = {key: (statistics.fmean if key in ("step", "cpu") else statistics.median)(values)
                for key, values in kept.items()}
    measured["step_p10"], measured["step_p90"] = deciles(kept["step"])
    return measured


def reps_for(device, budget_ms: float = CALIBRATION_BUDGET_MS):
    """measure_steps' reps: enough steps to fill `budget_ms` at the warm-up's pace, at least
    CALIBRATION_REPS and at most CALIBRATION_MAX_REPS, the most any rank asks for (a collective)."""

    def reps(step_ms: float) -> int:
        wanted = min(CALIBRATION_MAX_REPS, max(CALIBRATION_REPS, math.ceil(budget_ms / max(step_ms, 1e-3))))
        if not is_group():
            return wanted
        t = torch.tensor([wanted], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    return reps


def cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs this process's cgroup may use (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over its
    period): `labctl slow`'s limit on a node; None where there is none."""
    try:
        with open(f"{root}/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(f"{root}/cpu/cpu.cfs_quota_us") as f, open(f"{root}/cpu/cpu.cfs_period_us") as g:
            quota, period = int(f.read()), int(g.read())
        return None if quota < 0 else quota / period
    except (OSError, ValueError):
        return None


def sustained(measured: dict) -> float:
    """How much longer than calibrated a rank's micro-steps take once its node's CPU quota bites:
    the calibration's few steps fit in the quota's first period, a run's do not. Its CPU time a
    micro-step, times the ranks sharing the node, over the quota; 1 without a quota."""
    quota = measured.get("quota")
    wall = measured["forward"] + measured["backward"]
    if not quota or not wall:
        return 1.0
    return max(1.0, measured["cpu"] * measured["local_ranks"] / quota / wall)


def optimizer_copy(tensors, lr: float) -> torch.optim.Optimizer:
    """Adam over copies of `tensors`, with zero gradients: the run's optimizer step, on nothing it trains."""
    copies = [t.detach().clone().requires_grad_(True) for t in tensors]
    for t in copies:
        t.grad = torch.zeros_like(t)
    return torch.optim.Adam(copies, lr=lr)


def held_parameters(model, optimizer):
    """What this rank's optimizer steps: zero's shard, fsdp's sharded parameters (DTensors: Adam's
    step over them goes through DTensor's dispatch, as the run's does), else every parameter."""
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
    return [p for group in inner.param_groups for p in group["params"]] if inner else list(model.parameters())


def fit_link(everyone: list[dict], steps: tuple[int, ...], backend: str, device) -> tuple[stepmodel.Link, dict]:
    """The ring's link (stepmodel.Link) and how it was found, from every rank's node (gather_ranks)
    and the ways its rings turn (tclinks.ring_steps). Collective: every rank calls it."""
    hosts = [m["host"] for m in everyone]
    n = len(hosts)
    hops = ring_hops(hosts, {m["host"]: m["shaping"] for m in everyone}, {m["host"]: m["ip"] for m in everyone}, steps)
    shaped = [h for h in hops if h["rate_bps"]]
    delay_s = max((h["delay_s"] for h in hops), default=0.0)
    probes = link_probes(everyone, backend, device, shaped=bool(shaped))  # this lab state's, or measured now
    smalls = probes["small_s"]
    small_s = statistics.median(smalls)
    cost = ring_cost("all_reduce", n, backend)
    if shaped:
        slowest = min(shaped, key=lambda h: h["rate_bps"])
        rate_bps, burst, source = slowest["rate_bps"] * stepmodel.PAYLOAD_EFFICIENCY, slowest["burst_bytes"], "tc"
    else:
        big_s = statistics.median(probes["big_s"])
        rate_bps = cost.wire * RATE_PROBE_BYTES * 8 / max(big_s - cost.hops * delay_s, 1e-6)
        burst, source = 0.0, f"a {RATE_PROBE_BYTES >> 20} MiB all-reduce"

    def stack_of(probe: float) -> float:
        return max(0.0, probe - cost.hops * delay_s - cost.wire * PROBE_BYTES * 8 / rate_bps) / cost.hops

    stack_s, stack_band = stack_of(small_s), [stack_of(s) for s in deciles(smalls)]
    # each rank whose own hop is as slow as the slowest: ranks sharing a node have none between nodes
    # (stepmodel.sent_while_waiting_ms; gloo's all-reduce ring alone: its ddp and zero)
    slow = tuple(sorted({h["sender"] for h in shaped if h["rate_bps"] <= 1.01 * slowest["rate_bps"]})) if shaped else ()
    queue_s = statistics.median(probes["queue_s"])  # a small broadcast's turn in a queue of them (zero's)
    link = stepmodel.Link(rate_bps, stack_s, delay_s, burst, slow if len(steps) == 1 else (), steps[0], queue_s=queue_s)
    return link, {"rate_from": source, "rate_bps": round(rate_bps), "stack_us": round(stack_s * 1e6, 1),
                  "stack_us_band": [round(s * 1e6, 1) for s in stack_band],
                  "probe_us": round(small_s * 1e6, 1), "queued_broadcast_us": round(queue_s * 1e6, 1),
                  "delay_us": round(delay_s * 1e6, 1), "burst_bytes": burst, "hops_between_nodes": len(hops),
                  "slow_senders": list(link.slow_senders), "calibrated": probes["calibrated"],
                  "calibrated_at": probes["at"], "calibrated_by": probes["run"], "probes": len(smalls),
                  "probing_s": round(probes["probing_s"], 3)}


def band_edges(mine: dict, found: dict, floor_ms: float) -> list[tuple[float, float | None]]:
    """(lockstep compute ms, the stack's latency a hop in s or None) at the calibration's 10th and
    90th percentiles: its steps (less the optimizer and the probe, at least the slowest rank's own
    micro-steps, `floor_ms`) and its latency probes, each end's taken together."""
    probe_ms = found.get("probe_us", 0.0) / 1e3
    stacks = found.get("stack_us_band") or (None, None)
    return [(max(step_ms - mine["optimizer"] - probe_ms, 0.0, floor_ms), None if stack_us is None else stack_us / 1e6)
            for step_ms, stack_us in zip((mine["step_p10"], mine["step_p90"]), stacks)]


def prediction_band(point_ms: float, job, compute, link, edges) -> list[float]:
    """The prediction's spread: the step predicted at each of band_edges' two ends, widened to hold
    the prediction itself (a mean of skewed steps can lie above their 90th percentile)."""
    ends = [stepmodel.predict(job, replace(compute, lockstep_ms=lockstep),
                              replace(link, stack_s=stack_s) if link is not None and stack_s is not None else link).step_ms
            for lockstep, stack_s in edges]
    return [round(min(ends[0], point_ms), 3), round(max(ends[1], point_ms), 3)]


def fsdp_units(module) -> tuple[int, ...]:
    """The bytes of each unit strategy.shard_fully makes: each block (`module.blocks`), then the root."""
    def size(params):
        return sum(p.numel() * p.element_size() for p in params)

    blocks = [size(block.parameters()) for block in getattr(module, "blocks", ())]
    return (*blocks, size(module.parameters()) - sum(blocks))


def address() -> str:
    """This node's address, as its peers reach it (links to groups of nodes are keyed by it); "" if unknown."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


def gather_ranks(measured: dict) -> list[dict]:
    """Every rank's calibration with its node's (host, CPU quota, ranks, shaping), each rank's
    micro-step as the run will see it: its node's quota applied (sustained). Collective."""
    node = {"host": socket.gethostname(), "ip": address(), "quota": cpu_quota(), "started": node_started(),
            "local_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", 1)), "shaping": read_shaping() if is_group() else {},
            "iface": os.environ.get("GLOO_SOCKET_IFNAME", "")}  # the bridge or an overlay's tunnel: other links
    everyone = all_gather({**measured, **node})
    for m in everyone:
        m["slowdown"] = sustained(m)
        m["forward"], m["backward"] = m["forward"] * m["slowdown"], m["backward"] * m["slowdown"]
    return everyone


def predict_run(run, schedule, module) -> tuple[stepmodel.Prediction, dict]:
    """This run's step, predicted from its calibration: (the prediction for this rank's steps, what it
    was calibrated on). Collective: every rank calls it, before step 1. `module` is the model as
    built (for fsdp and hsdp a copy taken before it was sharded)."""
    args, c = run.args, run.c
    accum = getattr(schedule, "accum", 1)  # epoch mode: one micro-batch a step
    x, y = run.workload.batch(torch.arange(schedule.micro_samples))
    tiny = torch.zeros(PROBE_BYTES // 4, device=c.device)
    barrier()  # every rank calibrates at once, sharing the cores as the steps will
    measured = measure_steps(micro_step(module, run.workload, x.to(c.device), y.to(c.device)), accum,
                             optimizer_copy(held_parameters(run.model, run.optimizer), args.lr).step,
                             (lambda: torch.distributed.all_reduce(tiny)) if is_group() else (lambda: None),
                             reps_for(c.device))
    for p in module.parameters():
        p.grad = None  # the calibration's gradients, which the run never sees
    everyone = gather_ranks(measured)
    link, found = (fit_link(everyone, ring_steps(args.strategy, c.backend), c.backend, c.device)
                   if c.world_size > 1 else (None, {}))
    slowest = max(range(len(everyone)), key=lambda r: everyone[r]["forward"] + everyone[r]["backward"])
    mine = everyone[run.c.rank]  # each rank predicts its own steps; rank 0's are the SUMMARY's
    # Its calibration steps less their optimizer and the tiny all-reduce's own latency: the compute
    # until the slowest rank's gradients are ready, ranks sharing cores and waiting for each other.
    lockstep_ms = max(mine["step"] - mine["optimizer"] - found.get("probe_us", 0.0) / 1e3, 0.0)
    # a straggler held back by its quota: its sustained micro-steps, where longer than the lockstep's
    lockstep_ms = max(lockstep_ms, accum * (everyone[slowest]["forward"] + everyone[slowest]["backward"]))
    hooks_ms = (fsdp_hooks_ms(module, lambda m: micro_step(m, run.workload, x.to(c.device), y.to(c.device)))
                if args.strategy in ("fsdp", "hsdp") and is_group() else 0.0)
    hooks_ms *= max(1.0, lockstep_ms / max(accum * mine["cpu"], 1e-6))  # CPU time, as the ranks share the cores
    compute = stepmodel.ComputeTimes(everyone[slowest]["forward"], everyone[slowest]["backward"], mine["optimizer"],
                                accum * (mine["forward"] + mine["backward"]), lockstep_ms, hooks_ms)
    grads = [p.numel() * p.element_size() for p in reversed(list(module.parameters())) if p.requires_grad]
    squeeze = 2 if args.comm_hook in ("fp16", "bf16") else 1  # compression halves what is sent
    job = stepmodel.Job(world=c.world_size, strategy=args.strategy, backend=c.backend, accum=accum,
                        buckets=stepmodel.ddp_buckets([g // squeeze for g in grads], int(args.bucket_cap_mb * 2**20)),
                        param_bytes=sum(grads), units=fsdp_units(module), tensors=len(grads),
                        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    prediction = stepmodel.predict(job, compute, link)
    floor_ms = accum * (everyone[slowest]["forward"] + everyone[slowest]["backward"])
    band = prediction_band(prediction.step_ms, job, compute, link, band_edges(mine, found, floor_ms))
    # A step shorter than the noise measured around it is not predicted (instrument.too_short). Not so
    # a rank held back by its CPU quota: its steps jump by the quota's period (100 ms) whatever their
    # length, the noise of a throttled node and not of a short step, and its sustained rate is modelled.
    trusted = everyone[slowest]["slowdown"] > 1.0 or band[1] - band[0] <= prediction.step_ms
    return prediction, {
        "inputs": stepmodel.inputs_record(job, compute, link), "band_ms": band, "trusted": trusted, "link": found,
        "forward_ms": round(compute.forward_ms, 3), "backward_ms": round(compute.backward_ms, 3),
        "lockstep_ms": round(lockstep_ms, 3), "fsdp_hooks_ms": round(hooks_ms, 3), "slowest_rank": slowest,
        "quota_slowdown": round(everyone[slowest]["slowdown"], 3), "buckets": list(job.buckets), "accum": accum}
