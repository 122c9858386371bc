"""A run folder read back into per-rank records: what `labctl trace` builds its timeline from.

Each rank's metrics-rank<R>.jsonl (trainer/metrics.py defines every record) gives its steps and its
"clock" records; trace-rank<R>.json, where the run has one, is that rank's torch.profiler Chrome
trace. A metrics file may hold several attempts of one run (torchrun --max-restarts appends to the
same file): each begins with a "start" clock record, and the last one is read, which is the attempt
that printed the SUMMARY.

What a step needs (a script of your own writes the same fields): `step`, `t_start`, `t_end` (unix
seconds); `t_backward_end` (else t_end); with communication `t_comm_start`, `t_comm_end` and
`comm_wait_ms`; `compute_ms` and `wall_ms` (else worked out from the times). Optionally
`collectives`, each collective the step called (trainer/collectives.py writes them), and a pipeline
stage's `pipeline`: its forward and backward of each micro-batch, [kind, micro-batch, t0, t1]
(trainer/pipeline.py writes them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from labctl.core.workspace import is_folder
from labctl.errors import LabError, StateError

METRICS_FILE = re.compile(r"^metrics-rank(\d+)\.jsonl$")
TRACE_FILE = re.compile(r"^trace-rank(\d+)\.json$")
NEEDS = ("a run folder holds what `labctl trace` reads: metrics-rank<R>.jsonl (the trainer writes them unless "
         "--no-metrics; a script of your own can write them with trainer.metrics.MetricsWriter) or torch.profiler "
         "traces as trace-rank<R>.json (the trainer's --profile); docs/explanation/timeline.md")


@dataclass(frozen=True)
class Collective:
    """One collective a step called (trainer/collectives.py): launched -> done in unix seconds on its
    rank's clock; done is None where its end is not known."""

    kind: str  # all_reduce, all_gather, reduce_scatter, broadcast, all_to_all
    start: float
    end: float | None
    bytes: int = 0
    blocking: bool = True


@dataclass(frozen=True)
class StageWork:
    """A pipeline stage's forward or backward of one micro-batch, in unix seconds on its rank's clock."""

    kind: str  # forward or backward
    micro: int
    start: float
    end: float


@dataclass(frozen=True)
class Step:
    """One optimizer step of one rank, in unix seconds on that rank's own clock."""

    step: int
    t_start: float
    t_end: float
    t_backward_end: float  # the gradients are synchronised: backward() returned
    t_comm_start: float | None = None  # the first gradient bucket handed to the all-reduce
    t_comm_end: float | None = None  # the last all-reduce finished
    comm_wait_ms: float = 0.0  # last bucket handed over -> backward() returned: idle, waiting
    compute_ms: float = 0.0  # forward and backward, less comm_wait_ms (as trainer/instrument.py)
    wall_ms: float = 0.0  # end of the previous step -> end of this one
    collectives: tuple[Collective, ...] = ()  # each collective it called, in launch order
    pipeline: tuple[StageWork, ...] = ()  # a pipeline stage's forwards and backwards, in order

    @property
    def arrived(self) -> float:
        """When this rank handed its last gradient bucket over: from here it only waits."""
        return self.t_backward_end - self.comm_wait_ms / 1e3

    @property
    def has_comm(self) -> bool:
        return self.t_comm_start is not None and self.t_comm_end is not None


@dataclass(frozen=True)
class RankRecords:
    rank: int
    host: str | None  # the node it ran on: the clock records' `host`, else the profiler trace's host_name
    steps: tuple[Step, ...] = ()
    clocks: dict[str, tuple[float, ...]] = field(default_factory=dict)  # "start"/"end" -> each barrier's time
    trace: Path | None = None  # its torch.profiler Chrome trace
    predicted_step_ms: float | None = None  # the trainer's step model, before step 1 ("prediction" record)

    @property
    def label(self) -> str:
        """`rank 2 (node2)`, or `rank 2` where nothing says which node."""
        return f"rank {self.rank} ({self.host})" if self.host else f"rank {self.rank}"


@dataclass(frozen=True)
class RunRecords:
    run_dir: Path
    ranks: tuple[RankRecords, ...]  # by rank
    notes: tuple[str, ...] = ()  # what was missing or skipped, in words

    @property
    def has_steps(self) -> bool:
        return any(r.steps for r in self.ranks)

    def rank(self, rank: int) -> RankRecords:
        return next(r for r in self.ranks if r.rank == rank)


def read_run(run_dir: Path) -> RunRecords:
    """Every rank's records in `run_dir`. A folder that does not exist is a LabError (exit 2); one with
    neither metrics nor profiler traces, or metrics without one step record and no trace, a StateError."""
    run_dir = Path(run_dir)
    if not is_folder(run_dir):
        raise LabError(f"no run folder {run_dir}", hint="give a run id under .lab/<lab>/runs/ or a run folder's path")
    metrics = _by_rank(run_dir, METRICS_FILE)
    traces = _by_rank(run_dir, TRACE_FILE)
    if not metrics and not traces:
        raise StateError(f"{run_dir} holds no metrics and no profiler traces: nothing to put on a timeline",
                         hint=NEEDS)
    notes: list[str] = []
    ranks = []
    for rank in sorted(set(metrics) | set(traces)):
        steps, clocks, host, skipped, predicted = read_metrics(metrics[rank]) if rank in metrics else ((), {}, None, 0, None)
        if rank not in metrics:
            notes.append(f"rank {rank} wrote no metrics: its profiler trace only")
        if skipped:
            notes.append(f"rank {rank}: {skipped} line(s) of {metrics[rank].name} skipped (not a whole JSON record)")
        ranks.append(RankRecords(rank, host or (trace_host(traces[rank]) if rank in traces else None), steps, clocks,
                                 traces.get(rank), predicted))
    run = RunRecords(run_dir, tuple(ranks), tuple(notes))
    if not run.has_steps and not traces:
        raise StateError(f"the metrics in {run_dir} hold no step records with times (t_start, t_end): nothing to put "
                         "on a timeline", hint="epoch mode writes step records only with --log-every N; " + NEEDS)
    return run


def _by_rank(run_dir: Path, pattern: re.Pattern) -> dict[int, Path]:
    found = {}
    for path in run_dir.iterdir():
        match = pattern.match(path.name)
        if match and path.is_file():
            found[int(match.group(1))] = path
    return found


def read_metrics(path: Path) -> tuple[tuple[Step, ...], dict[str, tuple[float, ...]], str | None, int, float | None]:
    """(steps, clock times by event, host, lines skipped, the predicted step in ms) of the last attempt
    in one metrics file."""
    steps: list[Step] = []
    clocks: dict[str, tuple[float, ...]] = {}
    host, skipped, predicted = None, 0, None
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            skipped += bool(line.strip())  # a killed run's last line may be cut short
            continue
        if not isinstance(record, dict):
            skipped += 1
            continue
        if record.get("kind") == "clock":
            if record.get("event") == "start":  # a new attempt: what came before belongs to an earlier one
                steps, clocks, predicted = [], {}, None
            times = clock_times(record)
            if times and isinstance(record.get("event"), str):
                clocks[record["event"]] = times
            host = record.get("host") or host
        elif record.get("kind") == "step":
            step = step_of(record)
            if step is not None:
                steps.append(step)
        elif record.get("kind") == "prediction" and _is_number(record.get("step_ms")):
            predicted = float(record["step_ms"])
    return tuple(sorted(steps, key=lambda s: s.step)), clocks, host, skipped, predicted


def clock_times(record: dict) -> tuple[float, ...]:
    """A clock record's barrier times: `t_barriers`, else `t` alone (metrics written before there
    were several)."""
    times = record.get("t_barriers") or ([record["t"]] if _is_number(record.get("t")) else [])
    return tuple(float(t) for t in times if _is_number(t))


def step_of(record: dict) -> Step | None:
    """A step record as a Step, or None when it lacks the times a timeline needs."""
    t_start, t_end, number = record.get("t_start"), record.get("t_end"), record.get("step")
    if not (_is_number(t_start) and _is_number(t_end) and isinstance(number, int)):
        return None
    backward_end = record.get("t_backward_end") if _is_number(record.get("t_backward_end")) else t_end
    comm = [record.get("t_comm_start"), record.get("t_comm_end")]
    comm_start, comm_end = comm if all(_is_number(t) for t in comm) else (None, None)
    wait_ms = float(record.get("comm_wait_ms") or 0.0) if comm_start is not None else 0.0
    compute_ms = record.get("compute_ms")
    wall_ms = record.get("wall_ms")
    return Step(number, float(t_start), float(t_end), float(backward_end), comm_start, comm_end, wait_ms,
                float(compute_ms) if _is_number(compute_ms) else (backward_end - t_start) * 1e3 - wait_ms,
                float(wall_ms) if _is_number(wall_ms) and wall_ms else (t_end - t_start) * 1e3,
                collectives_of(record.get("collectives")), stage_work_of(record.get("pipeline")))


def collectives_of(listed) -> tuple[Collective, ...]:
    """A step record's `collectives` (each with kind, t_launch, t_done, bytes, blocking); those without
    a kind and a launch time are passed over."""
    found = []
    for c in listed if isinstance(listed, list) else ():
        if isinstance(c, dict) and isinstance(c.get("kind"), str) and _is_number(c.get("t_launch")):
            done = float(c["t_done"]) if _is_number(c.get("t_done")) else None
            size = c.get("bytes") if _is_number(c.get("bytes")) else 0
            found.append(Collective(c["kind"], float(c["t_launch"]), done, int(size), bool(c.get("blocking", True))))
    return tuple(found)


def stage_work_of(listed) -> tuple[StageWork, ...]:
    """A step record's `pipeline`, each [forward|backward, micro-batch, t0, t1]; others passed over."""
    found = []
    for item in listed if isinstance(listed, list) else ():
        if (isinstance(item, list) and len(item) == 4 and item[0] in ("forward", "backward") and isinstance(item[1], int)
                and _is_number(item[2]) and _is_number(item[3]) and item[3] >= item[2]):
            found.append(StageWork(item[0], item[1], float(item[2]), float(item[3])))
    return tuple(sorted(found, key=lambda w: w.start))


def trace_host(path: Path) -> str | None:
    """The host_name a torch.profiler trace names, read from its head without parsing the whole file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096)
    match = re.search(r'"host_name"\s*:\s*"([^"]*)"', head)
    return match.group(1) if match else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
