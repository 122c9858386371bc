"""The merged trace: every rank of a run in one file of the Chrome trace event format, which
Perfetto (https://ui.perfetto.dev) and chrome://tracing open.

The format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
a JSON object whose `traceEvents` is a list of events, each with `ph` (its phase: "X" a complete
event with `dur`, "i" an instant, "M" metadata), `name`, `ts` (microseconds), `pid` and `tid`.
Here each rank is one process (pid = the rank), named `rank R (nodeK)` by a process_name metadata
event. Thread 0 holds the steps from the metrics, each with its phases inside it (compute, the
all-reduce in flight, waiting); thread 1 each step's communication span (first collective launched
to last finished); threads 2 to 9 every collective the step called, named by its kind (all_reduce,
all_gather, reduce_scatter, broadcast), one lane per call in flight at once; the clock records are
instants.
A rank's torch.profiler events (trace-rank<R>.json) join its process, every (pid, tid) of the
profiler's a thread of its own, moved onto the aligned time axis: the profiler's times are unix
microseconds from `baseTimeNanoseconds` + `ts`, on the same machine's clock as the metrics, so the
rank's offset applies to them as it does to its steps. All times count from the run's aligned
start.
"""

from __future__ import annotations

import json
from pathlib import Path

from labctl.trace.align import Alignment
from labctl.trace.breakdown import Segment
from labctl.trace.records import RunRecords, Step

STEPS_TID, COMM_TID, FIRST_COLLECTIVE_TID, FIRST_PROFILER_TID = 0, 1, 2, 10
PROCESS_METADATA = {"process_name", "process_labels", "process_sort_index"}  # replaced by the rank's own
FLOW_ID_STRIDE = 10**9  # flow ids made unique across ranks: rank x stride + the profiler's id
UNIX_US_AFTER = 1e15  # a trace without baseTimeNanoseconds counts in unix microseconds if its times are past 2001


def us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def metadata(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": args}


def rank_events(rank: int, label: str, steps: list[tuple[Step, list[Segment]]], offset: float, origin: float) -> list[dict]:
    """A rank's process: its name, and its steps from the metrics with their phases."""
    events = [metadata(rank, 0, "process_name", {"name": label}), metadata(rank, 0, "process_sort_index", {"sort_index": rank}),
              metadata(rank, STEPS_TID, "thread_name", {"name": "steps (metrics)"}),
              metadata(rank, COMM_TID, "thread_name", {"name": "communication (metrics)"})]
    for s, parts in steps:
        start = s.t_start - offset - origin
        events.append({"ph": "X", "name": f"step {s.step}", "cat": "step", "pid": rank, "tid": STEPS_TID, "ts": us(start),
                       "dur": us(s.t_end - s.t_start), "args": {"compute_ms": s.compute_ms, "comm_wait_ms": s.comm_wait_ms,
                                                              "wall_ms": s.wall_ms}})
        events += [{"ph": "X", "name": p.what, "cat": p.kind, "pid": rank, "tid": STEPS_TID, "ts": us(p.start - origin),
                    "dur": us(p.end - p.start)} for p in parts]
        if s.has_comm:
            events.append({"ph": "X", "name": comm_name(s), "cat": "comm", "pid": rank, "tid": COMM_TID,
                           "ts": us(s.t_comm_start - offset - origin), "dur": us(s.t_comm_end - s.t_comm_start)})
    return events + collective_events(rank, [s for s, _ in steps], offset, origin)


def comm_name(step: Step) -> str:
    """The span from the step's first collective to its last: DDP's gradient all-reduce, or (fsdp) all of them."""
    if all(c.kind == "all_reduce" for c in step.collectives):
        return "all-reduce (gradients)"
    return "collectives (" + ", ".join(sorted({c.kind for c in step.collectives})) + ")"


def collective_events(rank: int, steps: list[Step], offset: float, origin: float) -> list[dict]:
    """Each collective of each step, named by its kind, on lanes of the rank's process: a call goes on
    the first lane free when it is launched, so calls in flight together (an all-gather prefetched
    while another runs) sit one above the other. One whose end is unknown is an instant."""
    lanes: list[float] = []  # each lane's last end, aligned seconds
    events = []
    for c in (c for s in steps for c in s.collectives):
        start, end = c.start - offset, (c.end - offset if c.end is not None else None)
        lane = next((i for i, last in enumerate(lanes) if last <= start), None)
        if lane is None:
            lane = min(len(lanes), FIRST_PROFILER_TID - FIRST_COLLECTIVE_TID - 1)
            lanes.extend([start] * (lane + 1 - len(lanes)))
        lanes[lane] = max(lanes[lane], end if end is not None else start)
        event = {"name": c.kind, "cat": "collective", "pid": rank, "tid": FIRST_COLLECTIVE_TID + lane,
                 "ts": us(start - origin), "args": {"bytes": c.bytes, "blocking": c.blocking}}
        events.append({**event, "ph": "X", "dur": us(end - start)} if end is not None else {**event, "ph": "i", "s": "t"})
    return events + [metadata(rank, FIRST_COLLECTIVE_TID + i, "thread_name", {"name": f"collectives {i + 1} (metrics)"})
                     for i in range(len(lanes))]


def clock_events(rank: int, clocks: dict[str, tuple[float, ...]], offset: float, origin: float) -> list[dict]:
    """The shared moments as instants: each barrier of each clock event."""
    return [{"ph": "i", "s": "p", "name": f"{event} barrier {j + 1}", "cat": "clock", "pid": rank, "tid": STEPS_TID,
             "ts": us(t - offset - origin)} for event, times in sorted(clocks.items()) for j, t in enumerate(times)]


def load_profiler_trace(path: Path) -> tuple[list[dict], float | None]:
    """(its events, the unix microsecond its `ts` count from; None where that is unknown)."""
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    if isinstance(document, list):  # the format's other form: the array of events alone
        document = {"traceEvents": document}
    events = [e for e in document.get("traceEvents", []) if isinstance(e, dict) and isinstance(e.get("ph"), str)]
    base_ns = document.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)):
        return events, base_ns / 1e3
    times = [e["ts"] for e in events if _timed(e)]
    return events, (0.0 if times and min(times) > UNIX_US_AFTER else None)


def profiler_events(rank: int, events: list[dict], shift_us: float) -> list[dict]:
    """A rank's profiler events in its process: ts + shift_us, each (pid, tid) a thread of its own."""
    threads: dict[tuple, int] = {}
    named: set[int] = set()
    out = []
    for e in events:
        if e["ph"] == "M" and e.get("name") in PROCESS_METADATA:
            continue
        key = (str(e.get("pid")), str(e.get("tid")))
        tid = threads.setdefault(key, FIRST_PROFILER_TID + len(threads))
        moved = {**e, "pid": rank, "tid": tid}
        if e["ph"] == "M" and e.get("name") == "thread_name":
            named.add(tid)
        if isinstance(e.get("ts"), (int, float)):
            moved["ts"] = round(e["ts"] + shift_us, 3)
        elif e["ph"] != "M":
            continue  # an event without a time has no place on the axis
        if e["ph"] == "i" and e.get("s") == "g":
            moved["s"] = "p"  # one rank's profiler window, not the whole merged trace's
        if "id" in e and e["ph"] in ("s", "t", "f"):
            if not isinstance(e["id"], int):
                continue
            moved["id"] = rank * FLOW_ID_STRIDE + e["id"]
        out.append(moved)
    out += [metadata(rank, tid, "thread_name", {"name": f"profiler {pid}/{tid_}"})
            for (pid, tid_), tid in threads.items() if tid not in named]
    return out


def build(run: RunRecords, alignment: Alignment, steps: dict[int, list[tuple[Step, list[Segment]]]],
          notes: list[str]) -> dict:
    """The merged trace as a JSON-ready dict; what could not be merged is added to `notes`."""
    profiled = {r.rank: read_profiler(r.trace, notes) for r in run.ranks if r.trace is not None}
    profiled = {rank: found for rank, found in profiled.items() if found}
    first_profiled = [(base_us + min((e["ts"] for e in events if _timed(e)), default=0.0)) / 1e6 - alignment.offset(rank)
                      for rank, (events, base_us) in profiled.items()]
    origin = min([origin_of(run, alignment)] + first_profiled)
    origin = 0.0 if origin == float("inf") else origin  # nothing timed to count from: no events either
    events: list[dict] = []
    for r in run.ranks:
        offset = alignment.offset(r.rank)
        events += rank_events(r.rank, r.label, steps.get(r.rank, []), offset, origin)
        events += clock_events(r.rank, r.clocks, offset, origin)
        if r.rank in profiled:
            found, base_us = profiled[r.rank]
            events += profiler_events(r.rank, found, base_us - us(offset) - us(origin))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "labctl trace", "run_dir": str(run.run_dir), "time_origin_unix_s": origin,
                          "alignment": alignment.as_dict()}}


def read_profiler(path: Path, notes: list[str]) -> tuple[list[dict], float] | None:
    """load_profiler_trace, or None with a note saying why the trace is left out."""
    try:
        events, base_us = load_profiler_trace(path)
    except (OSError, ValueError, AttributeError) as exc:
        notes.append(f"{path.name} left out: not a Chrome trace's JSON ({exc})")
        return None
    if base_us is None:
        notes.append(f"{path.name} left out: no baseTimeNanoseconds, and its times are not unix microseconds")
        return None
    return events, base_us


def _timed(event: dict) -> bool:
    return event.get("ph") != "M" and isinstance(event.get("ts"), (int, float))


def origin_of(run: RunRecords, alignment: Alignment) -> float:
    """Time zero from the metrics: the aligned start, or the earliest step (inf without either)."""
    starts = [t - alignment.offset(r.rank) for r in run.ranks for t in r.clocks.get("start", ())[:1]]
    firsts = [r.steps[0].t_start - alignment.offset(r.rank) for r in run.ranks if r.steps]
    return min(starts + firsts, default=float("inf"))


def write(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document, separators=(",", ":")))
    return path
