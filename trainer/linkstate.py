"""The link's probes, calibrated once for each state of the lab's links and kept with the lab.

What the link costs (its rate where nothing shapes it, the stack's latency a hop, a queued small
broadcast's turn) changes only when the lab's links change: `shape` and `shape --to` (what tc
reports), `slow` (a node's CPU quota), a fault, `up` with other nodes or anew (the nodes'
addresses, and when each node started). A run on the lab, where labctl sets DDPLAB_LINKS_DIR (the
lab's folder's links/), keys that state by what every rank read from its node (gather_ranks: host,
address, tc's shaping, CPU quota, ranks on the node, its start) and the backend. The first run on a
state probes it LAB_PROBE_ITERS times (the rate LAB_RATE_PROBE_ITERS times where no hop is shaped,
the queue LAB_QUEUE_ITERS times), more than a run alone would, and keeps the samples in
<key>.json; every later run on that state reads them back and probes nothing. Without
DDPLAB_LINKS_DIR (torchrun by hand, a real cluster) each run probes as it always did, PROBE_ITERS,
RATE_PROBE_ITERS and QUEUE_ITERS times, and keeps nothing.

Rank 0 decides: it reads the folder and every rank takes its answer, so hosts that do not share
the folder agree too. A file that cannot be read (half written, from another release) is
measured again, never fatal. Collective: every rank calls link_probes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import torch

from trainer.dist import all_gather, is_rank0

LINKS_DIR_VAR = "DDPLAB_LINKS_DIR"  # = labctl.run.launch.LINKS_DIR_VAR
PROBE_BYTES, RATE_PROBE_BYTES = 1024, 4 << 20  # the latency probe, the rate probe (an unshaped link)
PROBE_ITERS, RATE_PROBE_ITERS = 15, 3  # a run that keeps nothing
# A state probed once for every run after it: enough that two calibrations of one state agree
# (docs/explanation/cost-model.md, "Calibrated once a state")
LAB_PROBE_ITERS, LAB_RATE_PROBE_ITERS = 61, 25
# ZeroRedundancyOptimizer's pattern: a small broadcast per parameter tensor, rank 0's parameters
# first, then rank 1's, and so on, all launched at once and then waited for. Queued calls keep the
# backend's threads awake, so each costs less than a lone all-reduce's hops of wake-ups (4 nodes at
# 1gbit: a turn of 0.82 to 1.01 ms against 1.3 ms a hop; docs/explanation/cost-model.md, "ZeRO's
# queue, measured"); QUEUE_CALLS of them, timed together, QUEUE_ITERS (LAB_QUEUE_ITERS) times.
QUEUE_CALLS, QUEUE_ITERS, LAB_QUEUE_ITERS = 16, 3, 9
FORMAT = 2  # the kept file's layout; another is measured again (1: before the queued broadcasts)


def timed_ms(fn, reps: int, warmup: int) -> list[float]:
    """fn() `warmup` times, then `reps` timed calls: their times in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def probe_s(nbytes: int, iters: int, device) -> list[float]:
    """The seconds of `iters` all-reduces of `nbytes`, after one to warm up."""
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def once():
        torch.distributed.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return [ms / 1e3 for ms in timed_ms(once, iters, warmup=1)]


def queue_probe_s(iters: int, device) -> list[float]:
    """The seconds of one broadcast of PROBE_BYTES in a queue of QUEUE_CALLS launched together, the
    first 1/n of them from rank 0, the next from rank 1, and so on (ZeRO's owners, each broadcasting
    its own parameters in turn), `iters` times after one to warm up."""
    world = torch.distributed.get_world_size()
    tensors = [torch.zeros(PROBE_BYTES // 4, dtype=torch.float32, device=device) for _ in range(QUEUE_CALLS)]

    def once():
        works = [torch.distributed.broadcast(t, src=i * world // QUEUE_CALLS, async_op=True)
                 for i, t in enumerate(tensors)]
        for work in works:
            work.wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return [ms / 1e3 / QUEUE_CALLS for ms in timed_ms(once, iters, warmup=1)]


def state_key(everyone: list[dict], backend: str, shaped: bool = False) -> str:
    """The link state every rank's node reported (gather_ranks; the interface its sockets use among it,
    so that a run over an overlay's tunnel is another state than one over the bridge), with the backend
    and whether the run's rings meet a shaped hop (then no rate is probed: a ring turning the other way
    may need one), as a short digest."""
    state = [[m["host"], m["ip"], m["shaping"], m["quota"], m["local_ranks"], m.get("started"), m.get("iface", "")]
             for m in everyone]
    return hashlib.sha256(json.dumps([backend, shaped, state], sort_keys=True).encode()).hexdigest()[:16]


def node_started() -> str | None:
    """When this node's first process started (field 22 of /proc/1/stat, in clock ticks since boot): a
    new container, a new value. None where /proc/1 cannot be read."""
    try:
        with open("/proc/1/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def read_kept(folder: str, key: str) -> dict | None:
    try:
        with open(os.path.join(folder, key + ".json")) as f:
            kept = json.load(f)
        return kept if kept.get("format") == FORMAT and kept.get("small_s") else None
    except (OSError, ValueError, AttributeError):
        return None


def keep(folder: str, key: str, record: dict) -> None:
    """Write <key>.json whole or not at all (a rename); a folder that cannot be written keeps nothing."""
    path = os.path.join(folder, key + ".json")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as f:
            json.dump(record, f)
        os.replace(path + f".{os.getpid()}", path)
    except OSError:
        pass


def link_probes(everyone: list[dict], backend: str, device, shaped: bool) -> dict:
    """The link's probe samples in seconds ("small_s", "queue_s", and "big_s" where no hop is shaped,
    else None),
    with "calibrated" ("kept": read back, "now": measured by this run), "at" (when they were
    measured), "run" (by which run), "key" and "probing_s" (what this run spent probing)."""
    folder, key = os.environ.get(LINKS_DIR_VAR), state_key(everyone, backend, shaped)
    kept = all_gather(read_kept(folder, key) if folder and is_rank0() else None)[0]
    if kept is not None:
        return {**kept, "calibrated": "kept", "probing_s": 0.0}
    small_iters, big_iters, queue_iters = ((LAB_PROBE_ITERS, LAB_RATE_PROBE_ITERS, LAB_QUEUE_ITERS) if folder
                                           else (PROBE_ITERS, RATE_PROBE_ITERS, QUEUE_ITERS))
    started = time.perf_counter()
    record = {"format": FORMAT, "key": key, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "run": os.environ.get("DDPLAB_RUN_ID"), "backend": backend, "hosts": [m["host"] for m in everyone],
              "small_s": probe_s(PROBE_BYTES, small_iters, device),
              "queue_s": queue_probe_s(queue_iters, device),
              "big_s": None if shaped else probe_s(RATE_PROBE_BYTES, big_iters, device)}
    probing_s = time.perf_counter() - started
    if folder and is_rank0():
        keep(folder, key, record)
    return {**record, "calibrated": "now" if folder else "this run", "probing_s": probing_s}
